"""`fleetpulse deploy / delete / status` against a real nats-server, run in-process through their
`run_*` functions (each runs its own event loop, so the tests call them in a worker thread)."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from services.ops.deploy import run_delete, run_deploy
from services.ops.status import run_status
from shared.appconfig import AppConfig
from shared.appyaml import load_apps
from shared.bus import KV, Bus
from shared.errors import BucketNotFound
from shared.kv.status import AppStatusView, DeploymentStatusView
from shared.natsbus import NatsBus
from shared.subjects import KV_APPS, KV_STATUS

ROOT = Path(__file__).resolve().parents[2]
ECHO_YAML = ROOT / "examples" / "apps" / "echo.yaml"
CONNECT_TIMEOUT_S = 2.0

TWO_APPS = """\
applications:
  - name: shop
    route_prefix: /shop
    deployments:
      - name: Api
        import_path: services.examples.echo:Echo
        num_replicas: 2
      - name: Cart
        import_path: services.examples.echo:Echo
        init_kwargs: {delay_s: 0.01}
  - name: blog
    route_prefix: /blog
    deployments:
      - name: Web
        import_path: services.examples.echo:Echo
"""


@pytest.fixture
async def client(nats_url: str) -> AsyncIterator[Bus]:
    bus = await NatsBus.connect(nats_url, name="test-ops")
    yield bus
    await bus.close()


async def run(func: Callable[[argparse.Namespace], int], url: str, **kw: Any) -> int:
    args = argparse.Namespace(nats=url, connect_timeout=CONNECT_TIMEOUT_S, **kw)
    return await asyncio.to_thread(func, args)


async def deploy(url: str, file: Path, dry_run: bool = False) -> int:
    return await run(run_deploy, url, file=str(file), dry_run=dry_run)


async def status(url: str, **kw: Any) -> int:
    opts: dict[str, Any] = {
        "app": None,
        "json": True,
        "watch": False,
        "interval": 1.0,
        "duration": None,
    }
    opts.update(kw)
    return await run(run_status, url, **opts)


async def snapshot(kv: KV) -> dict[str, tuple[bytes, int]]:
    out = {}
    for key in await kv.keys():
        entry = await kv.get(key)
        assert entry is not None
        out[key] = (entry.value, entry.revision)
    return out


def write(tmp_path: Path, text: str, name: str = "apps.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


async def test_deploy_writes_each_app_exactly(
    nats_url: str, client: Bus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, TWO_APPS)
    assert await deploy(nats_url, path) == 0
    kv = await client.kv(KV_APPS, create=False)
    assert await kv.keys() == ["blog", "shop"]
    for app in load_apps(path):
        entry = await kv.get(app.name)
        assert entry is not None
        assert entry.value == app.to_json()
        assert AppConfig.from_json(entry.value) == app
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "deployed shop (2 deployments, route /shop)",
        "deployed blog (1 deployment, route /blog)",
    ]


async def test_redeploy_rewrites_only_what_changed(
    nats_url: str, client: Bus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, TWO_APPS)
    assert await deploy(nats_url, path) == 0
    kv = await client.kv(KV_APPS, create=False)
    before = await snapshot(kv)
    capsys.readouterr()

    write(tmp_path, TWO_APPS.replace("num_replicas: 2", "num_replicas: 3"))
    assert await deploy(nats_url, path) == 0
    after = await snapshot(kv)
    assert after["blog"] == before["blog"]  # same value, same revision: not rewritten
    assert after["shop"][1] > before["shop"][1]
    [shop] = [a for a in load_apps(path) if a.name == "shop"]
    assert AppConfig.from_json(after["shop"][0]) == shop
    assert capsys.readouterr().out.splitlines() == [
        "deployed shop (2 deployments, route /shop)",
        "deployed blog (1 deployment, route /blog), unchanged",
    ]


async def test_invalid_file_writes_nothing_and_exits_2(
    nats_url: str, client: Bus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await deploy(nats_url, ECHO_YAML) == 0
    kv = await client.kv(KV_APPS, create=False)
    before = await snapshot(kv)
    capsys.readouterr()

    # the first app is fine; the second one's mistake must keep the first from being written too
    bad = TWO_APPS.replace("route_prefix: /blog", "route_prefix: /blog\n    version: 1.5")
    path = write(tmp_path, bad, "bad.yaml")
    assert await deploy(nats_url, path) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"fleetpulse deploy: error: {path}:13: applications[1].version:")
    assert await snapshot(kv) == before


async def test_dry_run_connects_to_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, TWO_APPS)
    assert await deploy(f"nats://127.0.0.1:{free_port()}", path, dry_run=True) == 0
    assert capsys.readouterr().out.splitlines() == [
        "valid: shop (2 deployments, route /shop) (dry run: nothing written)",
        "valid: blog (1 deployment, route /blog) (dry run: nothing written)",
    ]


async def test_route_prefix_taken_by_another_deployed_app_writes_nothing(
    nats_url: str, client: Bus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await deploy(nats_url, ECHO_YAML) == 0
    kv = await client.kv(KV_APPS, create=False)
    before = await snapshot(kv)
    clash = TWO_APPS.replace("route_prefix: /blog", "route_prefix: /echo")
    assert await deploy(nats_url, write(tmp_path, clash)) == 2
    err = capsys.readouterr().err
    assert "route_prefix '/echo' is already used by the deployed application 'echo'" in err
    assert await snapshot(kv) == before


async def test_delete_removes_the_key_and_unknown_apps_exit_2(
    nats_url: str, client: Bus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await run(run_delete, nats_url, app="echo") == 2  # nothing deployed at all
    assert "no application 'echo' is deployed (deployed: none)" in capsys.readouterr().err

    assert await deploy(nats_url, write(tmp_path, TWO_APPS)) == 0
    assert await run(run_delete, nats_url, app="shop") == 0
    kv = await client.kv(KV_APPS, create=False)
    assert await kv.keys() == ["blog"]
    assert await kv.get("shop") is None
    assert capsys.readouterr().out.splitlines()[-1].startswith("deleted shop:")

    assert await run(run_delete, nats_url, app="shop") == 2
    assert "no application 'shop' is deployed (deployed: blog)" in capsys.readouterr().err
    assert await run(run_delete, nats_url, app="bad name") == 2
    assert "invalid application name 'bad name'" in capsys.readouterr().err


def health(**kw: Any) -> DeploymentStatusView:
    fields: dict[str, Any] = {
        "status": "HEALTHY",
        "message": "",
        "target_replicas": 1,
        "running_replicas": 1,
        "demand": 0.5,
        "healthy_replicas": 1,
        "unhealthy_replicas": 0,
        "last_decision": "hold",
    }
    fields.update(kw)
    return DeploymentStatusView(**fields)


async def put_status(
    client: Bus, app: str, status: str, **deployments: DeploymentStatusView
) -> None:
    kv = await client.kv(KV_STATUS)
    view = AppStatusView(app, status, f"/{app}", None, time.time(), 1, deployments)
    await kv.put(app, view.encode())


async def test_status_json_reflects_fp_status_and_apps_waiting_for_the_controller(
    nats_url: str, client: Bus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await deploy(nats_url, write(tmp_path, TWO_APPS)) == 0
    await put_status(
        client,
        "shop",
        "RUNNING",
        Api=health(target_replicas=2, running_replicas=2, healthy_replicas=2, demand=3.5),
        Cart=health(status="UPSCALING", target_replicas=2, last_decision="upscale 1->2"),
    )
    capsys.readouterr()
    assert await status(nats_url) == 0
    printed = capsys.readouterr().out
    doc = json.loads(printed)
    assert printed == json.dumps(doc, indent=2, sort_keys=True) + "\n"
    shop = doc["applications"]["shop"]
    assert shop["status"] == "RUNNING" and shop["route_prefix"] == "/shop"
    assert shop["deployments"]["Api"]["running_replicas"] == 2
    assert shop["deployments"]["Api"]["demand"] == 3.5
    assert shop["deployments"]["Cart"]["status"] == "UPSCALING"
    assert shop["deployments"]["Cart"]["last_decision"] == "upscale 1->2"
    blog = doc["applications"]["blog"]
    assert blog["status"] == "DEPLOYING"
    assert blog["deployments"]["Web"]["message"] == "waiting for controller"

    assert await status(nats_url, app="blog") == 0
    assert list(json.loads(capsys.readouterr().out)["applications"]) == ["blog"]
    assert await status(nats_url, app="nope") == 2
    assert "no application 'nope' (known: blog, shop)" in capsys.readouterr().err


async def test_status_table_and_an_empty_server(
    nats_url: str, client: Bus, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await status(nats_url, json=False) == 0
    assert "no applications deployed" in capsys.readouterr().out
    assert await status(nats_url) == 0
    assert json.loads(capsys.readouterr().out) == {"applications": {}, "controllers": {}}
    with pytest.raises(BucketNotFound):
        await client.kv(KV_STATUS, create=False)  # a read-only command created nothing
    await client.kv(KV_STATUS)
    await client.kv(KV_APPS)
    assert await status(nats_url) == 0  # buckets that exist but are empty
    assert json.loads(capsys.readouterr().out) == {"applications": {}, "controllers": {}}

    await put_status(
        client, "shop", "UNHEALTHY", Api=health(status="UNHEALTHY", unhealthy_replicas=1)
    )
    assert await status(nats_url, json=False) == 0
    text = capsys.readouterr().out
    assert "shop" in text and "UNHEALTHY" in text and "1 bad" in text


async def test_status_watch_prints_each_change(
    nats_url: str, client: Bus, capsys: pytest.CaptureFixture[str]
) -> None:
    await put_status(client, "shop", "DEPLOYING", Api=health(status="UPDATING"))
    watch = asyncio.create_task(status(nats_url, watch=True, interval=0.1, duration=3.0))
    await wait_for(lambda: "UPDATING" in capsys.readouterr().out, what="the first document")
    await put_status(client, "shop", "RUNNING", Api=health())
    seen: list[dict[str, Any]] = []

    def running() -> bool:
        seen.extend(json.loads(line) for line in capsys.readouterr().out.splitlines())
        return any(d["applications"]["shop"]["status"] == "RUNNING" for d in seen)

    await wait_for(running, what="the change")
    await (await client.kv(KV_STATUS)).delete("shop")
    await wait_for(lambda: '{"applications": {}}' in capsys.readouterr().out, what="the delete")
    assert await watch == 0


async def test_status_watch_table_ends_at_its_duration(
    nats_url: str, client: Bus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await deploy(nats_url, ECHO_YAML) == 0
    capsys.readouterr()
    started = time.monotonic()
    assert await status(nats_url, json=False, watch=True, interval=0.1, duration=0.5) == 0
    assert 0.5 <= time.monotonic() - started < 3.0
    out = capsys.readouterr().out
    assert "fleetpulse status" in out and "echo" in out and "waiting for controller" in out


async def test_unreachable_nats_exits_1_with_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    args = argparse.Namespace(nats=url, connect_timeout=0.3, file=str(ECHO_YAML), dry_run=False)
    assert await asyncio.to_thread(run_deploy, args) == 1
    assert f"fleetpulse deploy: error: cannot reach NATS at {url}:" in capsys.readouterr().err
    args = argparse.Namespace(
        nats=url, connect_timeout=0.3, app=None, json=True, watch=False, interval=1.0, duration=None
    )
    assert await asyncio.to_thread(run_status, args) == 1
    assert f"fleetpulse status: error: cannot reach NATS at {url}:" in capsys.readouterr().err


async def wait_for(cond: Callable[[], bool], *, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

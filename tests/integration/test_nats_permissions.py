"""The compose NATS accounts on a real server: each role can do its job and nothing it must not.

The server runs `compose/nats/accounts.conf` (the committed, generated file) with passwords from
the environment, as compose runs it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from shared.bus import Bus
from shared.errors import BusAuthError, BusError
from shared.natsauth import NatsAuth
from shared.natsbus import NatsBus
from shared.natsserver import NatsServer
from shared.subjects import KV_APPS, KV_MEMBERSHIP, KV_STATUS, KV_TARGETS
from tests.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
ACCOUNTS = ROOT / "compose" / "nats" / "accounts.conf"
ROLES = ("controller", "agent", "replica", "router", "recorder", "operator")
CONTROL = (KV_TARGETS, KV_MEMBERSHIP, KV_STATUS)
REFUSED_WITHIN_S = 0.3


def password(role: str) -> str:
    return f"test-{role}-secret"


def role_env(role: str) -> dict[str, str]:
    return {"FLEETPULSE_NATS_USER": role, "FLEETPULSE_NATS_PASSWORD": password(role)}


@pytest.fixture(scope="module")
def server() -> Iterator[NatsServer]:
    mp = pytest.MonkeyPatch()
    for role in (*ROLES, "admin"):
        mp.setenv(f"FP_{role.upper()}_PASSWORD", password(role))
    s = NatsServer(config_file=ACCOUNTS)
    try:
        s.start()
        yield s
    finally:
        s.stop()
        mp.undo()


@pytest.fixture
async def connect(server: NatsServer) -> AsyncIterator[object]:
    opened: list[NatsBus] = []

    async def _connect(role: str) -> NatsBus:
        bus = await NatsBus.connect(
            server.url, name=f"test-{role}", auth=NatsAuth(user=role, password=password(role))
        )
        opened.append(bus)
        return bus

    yield _connect
    for bus in opened:
        await bus.close()


async def _seed(bus: Bus) -> None:
    """The controller and operator create the control buckets, as in a running fleet."""
    for bucket in CONTROL:
        await (await bus.kv(bucket)).put("app.Dep", b"by-the-controller")


async def _refused_put(bus: NatsBus, bucket: str) -> None:
    before = bus.permission_violations
    with pytest.raises(BusError):
        await bus.request(f"$KV.{bucket}.app.Dep", b"forged", timeout=REFUSED_WITHIN_S)
    await eventually(
        lambda: bus.permission_violations > before, 2, f"a permissions violation for {bucket}"
    )


async def test_only_the_controller_writes_control_buckets(connect) -> None:  # type: ignore[no-untyped-def]
    controller = await connect("controller")
    await _seed(controller)
    operator = await connect("operator")
    await (await operator.kv(KV_APPS)).put("app", b"{}")
    for role in ("agent", "replica", "router", "recorder", "operator"):
        bus = await connect(role)
        for bucket in CONTROL:
            await _refused_put(bus, bucket)
        if role != "operator":
            await _refused_put(bus, KV_APPS)
    for bucket in CONTROL:  # nothing forged landed
        entry = await (await controller.kv(bucket)).get("app.Dep")
        assert entry is not None and entry.value == b"by-the-controller"
    entry = await (await operator.kv(KV_APPS)).get("app")
    assert entry is not None and entry.value == b"{}"


async def test_a_replica_cannot_call_or_impersonate_a_deployment(connect) -> None:  # type: ignore[no-untyped-def]
    victim = await connect("replica")
    got: list[bytes] = []

    async def on_rpc(msg: object) -> None:
        got.append(msg.data)  # type: ignore[attr-defined]

    await victim.subscribe("fp.v1.rpc.bank.Ledger.r1", on_rpc)  # type: ignore[arg-type]
    await victim.flush()
    attacker = await connect("replica")
    before = attacker.permission_violations
    await attacker.publish("fp.v1.rpc.bank.Ledger.r1", b"transfer all")
    await attacker.publish("fp.v1.call.bank.Ledger", b"transfer all")
    await attacker.flush()
    router = await connect("router")
    await router.publish("fp.v1.rpc.bank.Ledger.r1", b"a real call")
    await router.flush()
    await eventually(lambda: got and attacker.permission_violations >= before + 2, 2, "refusals")
    assert got == [b"a real call"]
    assert attacker.permission_violations >= before + 2


async def test_a_router_can_probe_a_replica(connect) -> None:  # type: ignore[no-untyped-def]
    """A router probes a replica that went silent on an admitted request; refused, the probe
    timed out, the router took the replica for alive and busy, and requests in flight on a
    replica whose container was killed hung (seen on a real Docker engine)."""
    replica = await connect("replica")

    async def on_probe(msg: object) -> None:
        await replica.publish(msg.reply, b"alive")  # type: ignore[attr-defined]

    await replica.subscribe("fp.v1.probe.greeter-r1", on_probe)  # type: ignore[arg-type]
    await replica.flush()
    router = await connect("router")
    reply = await router.request("fp.v1.probe.greeter-r1", b"probe", timeout=2)
    assert reply.data == b"alive"
    assert router.permission_violations == 0


async def test_each_role_can_do_its_job(connect) -> None:  # type: ignore[no-untyped-def]
    controller = await connect("controller")
    await _seed(controller)
    await controller.kv("fp_agents")  # creates it, as the controller does at start
    agent = await connect("agent")
    await (await agent.kv("fp_agents")).put("a1", b"{}")
    watch = await (await agent.kv(KV_TARGETS)).watch()
    first = await asyncio.wait_for(watch.__anext__(), 5)
    assert first is not None and first.value == b"by-the-controller"
    await watch.stop()
    replica = await connect("replica")
    assert (await (await replica.kv(KV_MEMBERSHIP, create=False)).get("app.Dep")) is not None
    await replica.publish("fp.v1.report.heartbeat.app.Dep", b"x")
    router = await connect("router")
    await (await router.kv("fp_routes")).put("app", b"{}")
    assert (await (await router.kv(KV_STATUS, create=False)).get("app.Dep")) is not None
    for bus in (controller, agent, replica, router):
        await bus.flush()
        assert bus.permission_violations == 0


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("FLEETPULSE_NATS_")}
    full.update(env, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        cwd=ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_operator_deploys_and_a_wrong_password_is_refused_clearly(
    server: NatsServer, tmp_path: Path
) -> None:
    app = str(ROOT / "compose" / "apps" / "app.yaml")
    ok = _cli(["deploy", app, "--nats", server.url], role_env("operator"))
    assert ok.returncode == 0, ok.stderr
    by_flag = _cli(
        ["deploy", app, "--nats", server.url, "--nats-user", "operator",
         "--nats-password", password("operator")],
        {},
    )  # fmt: skip
    assert by_flag.returncode == 0, by_flag.stderr
    # a replica may read fp_apps (it follows its user_config) but never write it
    changed = tmp_path / "app.yaml"
    changed.write_text(Path(app).read_text().replace("greeting: hello", "greeting: hijacked"))
    denied = _cli(["deploy", str(changed), "--nats", server.url], role_env("replica"))
    assert denied.returncode != 0
    started = time.monotonic()
    wrong = _cli(
        ["status", "--nats", server.url],
        {"FLEETPULSE_NATS_USER": "operator", "FLEETPULSE_NATS_PASSWORD": "nope"},
    )
    assert wrong.returncode == 2
    assert "refused the credentials (user 'operator')" in wrong.stderr, wrong.stderr
    assert "nope" not in wrong.stderr  # never echo a secret
    assert time.monotonic() - started < 10
    half = _cli(["status", "--nats", server.url], {"FLEETPULSE_NATS_USER": "operator"})
    assert half.returncode == 2 and "has no password" in half.stderr


async def test_wrong_password_raises_typed_error_fast(server: NatsServer) -> None:
    started = time.monotonic()
    with pytest.raises(BusAuthError, match="refused the credentials"):
        await NatsBus.connect(
            server.url, name="t", auth=NatsAuth(user="replica", password="wrong"), connect_timeout=5
        )
    assert time.monotonic() - started < 3


def test_only_the_operator_deploys_and_each_change_is_recorded_under_its_user(
    server: NatsServer, tmp_path: Path
) -> None:
    """Deploy rights are code-execution rights: every role but the operator is refused by the
    server, and each deploy and delete leaves a record the server vouches for (its key starts
    with the writer's user, the only one it may write under)."""
    app = tmp_path / "app.yaml"
    app.write_text(
        (ROOT / "compose" / "apps" / "app.yaml")
        .read_text()
        .replace("name: greeter", "name: audited")
        .replace("route_prefix: /greet", "route_prefix: /audited")
    )
    for role in ("controller", "agent", "replica", "router", "recorder"):
        refused = _cli(["deploy", str(app), "--nats", server.url], role_env(role))
        assert refused.returncode != 0, f"{role} could deploy: {refused.stdout}"
    ok = _cli(["deploy", str(app), "--nats", server.url], role_env("operator"))
    assert ok.returncode == 0, ok.stderr
    gone = _cli(["delete", "audited", "--nats", server.url], role_env("operator"))
    assert gone.returncode == 0, gone.stderr
    shown = _cli(
        ["audit", "--app", "audited", "--json", "--nats", server.url], role_env("operator")
    )
    assert shown.returncode == 0, shown.stderr
    records = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [(r["action"], r["user"], r["app"]) for r in records] == [
        ("deploy", "operator", "audited"),
        ("delete", "operator", "audited"),
    ]
    assert records[0]["versions"] and records[0]["revision"] == records[1]["revision"]
    text = _cli(["audit", "--nats", server.url], role_env("operator"))
    assert "operator" in text.stdout and "deploy" in text.stdout, text.stdout


async def test_nobody_writes_a_record_in_another_users_name(connect) -> None:  # type: ignore[no-untyped-def]
    operator = await connect("operator")
    audit = await operator.kv("fp_audit", history=64)
    await audit.put("operator.app", b"{}")
    with pytest.raises(BusError):
        await operator.request("$KV.fp_audit.controller.app", b"forged", timeout=REFUSED_WITHIN_S)
    for role in ("controller", "agent", "router", "recorder"):
        bus = await connect(role)
        with pytest.raises(BusError):
            await bus.request(f"$KV.fp_audit.{role}.app", b"forged", timeout=REFUSED_WITHIN_S)

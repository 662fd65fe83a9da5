"""Code packages on a real nats-server: the object store, who may touch it, the agent's cache.

- Permissions (the auth callout issues shared/natsroles.py): the operator writes packages, an
  agent reads them and cannot write, a replica identity and the router cannot even read.
- deploy's packaging: a directory is uploaded once by content address; unchanged, nothing goes
  up again; garbage collection marks, then deletes after the grace period.
- the agent's cache: fetched once, verified (a package whose bytes do not match its address is
  refused and nothing is unpacked).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.agent.packages import PackageCache
from services.ops import packaging
from shared import packages
from shared.appconfig import AppConfig, DeploymentConfig
from shared.natsbus import NatsBus
from shared.natsserver import NatsServer
from shared.packagestore import NatsPackageStore
from tests.integration.authcallout import callout_server

pytestmark = pytest.mark.integration
JS_TIMEOUT_S = 1.0


def _store(bus: NatsBus, *, create: bool = False) -> NatsPackageStore:
    return NatsPackageStore(bus.nc.jetstream(timeout=JS_TIMEOUT_S), create=create)


def _zip(tmp: Path, text: str = "X = 1\n") -> tuple[Path, str, int]:
    src = tmp / "src"
    src.mkdir(exist_ok=True)
    (src / "mod.py").write_text(text)
    out = tmp / "pkg.zip"
    sha, size = packages.build_zip(src, out, limit=1 << 20)
    return out, sha, size


@pytest.fixture
async def nats(tmp_path: Path) -> AsyncIterator[NatsBus]:
    server = NatsServer()
    server.start()
    bus = await NatsBus.connect(server.url, name="packages-test")
    try:
        yield bus
    finally:
        await bus.close()
        server.stop()


async def test_only_the_operator_writes_packages_and_replicas_cannot_read_them(
    tmp_path: Path,
) -> None:
    async for callout in callout_server(tmp_path, "global"):
        zip_path, sha, _ = _zip(tmp_path)
        operator = await callout.role("operator")
        await _store(operator, create=True).put_file(sha, zip_path)

        agent = await callout.role("agent")
        got = tmp_path / "got.zip"
        await _store(agent).get_to_file(sha, got)
        assert got.read_bytes() == zip_path.read_bytes()
        with pytest.raises(Exception):  # noqa: B017 - nats-py's timeout or permission error
            await _store(agent).put_file("f" * 64, zip_path)
        with pytest.raises(Exception):  # noqa: B017
            await _store(agent).delete(sha)

        for who in (await callout.replica("A", "d", "a1"), await callout.role("router")):
            with pytest.raises(Exception):  # noqa: B017 - binding the store is refused
                await _store(who).get_to_file(sha, tmp_path / "stolen.zip")
            await asyncio.sleep(0)
        assert await _store(operator).has(sha)  # nothing deleted by the refused
        assert await _store(agent).has("f" * 64) is False


async def test_deploy_uploads_a_directory_once_and_gc_removes_it_after_the_grace(
    nats: NatsBus, tmp_path: Path
) -> None:
    src = tmp_path / "wd"
    src.mkdir()
    (src / "app.py").write_text("A = 1\n")
    (src / "big.bin").write_bytes(b"\0" * 4096)
    local = {"working_dir": {"path": str(src), "excludes": ["*.bin"]}}
    app = AppConfig("a", (DeploymentConfig("d", "app:A", runtime_env=local),))
    store = _store(nats, create=True)

    first = packaging.Packager(store)
    (resolved,) = await packaging.resolve_apps([app], first)
    ref = resolved.deployments[0].runtime_env["working_dir"]
    assert set(ref) == {"sha256", "size"} and first.stats.uploaded == 1
    assert AppConfig.from_json(resolved.to_json()) == resolved  # what fp_apps may hold

    again = packaging.Packager(store)
    (same,) = await packaging.resolve_apps([app], again)
    assert same == resolved and again.stats.uploaded == 0 and again.stats.reused == 1

    (src / "app.py").write_text("A = 2\n")  # a changed working_dir: a new package, a new version
    (changed,) = await packaging.resolve_apps([app], packaging.Packager(store))
    assert changed.deployments[0].runtime_env["working_dir"]["sha256"] != ref["sha256"]
    assert changed.version_of(changed.deployments[0]) != resolved.version_of(
        resolved.deployments[0]
    )

    in_use = packaging.referenced([changed])
    marked = await packaging.collect_garbage(store, in_use, now=1000.0, grace_s=60)
    assert marked.marked == (ref["sha256"],) and marked.deleted == ()
    kept = await packaging.collect_garbage(store, in_use, now=1030.0, grace_s=60)
    assert kept.deleted == () and await store.has(ref["sha256"])
    gone = await packaging.collect_garbage(store, in_use, now=1061.0, grace_s=60)
    assert gone.deleted == (ref["sha256"],) and not await store.has(ref["sha256"])
    assert await store.has(next(iter(in_use)))


async def test_the_agent_fetches_once_and_refuses_a_package_that_does_not_match(
    nats: NatsBus, tmp_path: Path
) -> None:
    zip_path, sha, size = _zip(tmp_path)
    store = _store(nats, create=True)
    await store.put_file(sha, zip_path)
    cache = PackageCache(tmp_path / "cache", lambda: store)
    refs = {"sha256": sha, "size": size}
    paths = await asyncio.gather(*(cache.ensure(refs) for _ in range(5)))
    assert len(set(paths)) == 1 and (paths[0] / "mod.py").read_text() == "X = 1\n"
    assert cache.fetches == 1
    await cache.ensure(refs)
    assert cache.fetches == 1  # unchanged: never fetched again

    other, other_sha, other_size = _zip(tmp_path, "X = 'evil'\n")
    forged = "0" * 64
    await store.put_file(forged, other)  # bytes that are not what their name says
    with pytest.raises(packages.PackageError, match="does not match"):
        await cache.ensure({"sha256": forged, "size": other_size})
    await store.put_file(other_sha, other)
    with pytest.raises(packages.PackageError, match="declared"):
        await cache.ensure({"sha256": other_sha, "size": other_size + 1})
    assert not (tmp_path / "cache" / forged).exists()
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [sha]


async def test_an_agent_killed_while_it_fetches_leaves_nothing_half_installed(
    tmp_path: Path,
) -> None:
    """SIGKILL the agent process mid-download of a large package: nothing under the package's
    name; restarted on the same cache, it cleans the leftovers, fetches again and starts it."""
    from shared.kv.status import AppStatusView
    from shared.subjects import KV_STATUS
    from tests.procs import ServiceProcesses
    from tests.runtimeenv_fixtures import write_app
    from tests.waiting import eventually

    wd = write_app(tmp_path / "wd", "v1")
    (wd / "weights.dat").write_bytes(os.urandom(48 << 20))  # incompressible: a long fetch
    config = tmp_path / "app.yaml"
    config.write_text(
        "applications:\n  - name: heavy\n    route_prefix: null\n"
        f"    import_path: shipped_app:app\n    runtime_env: {{working_dir: {wd}}}\n"
    )
    server = NatsServer()
    server.start()
    procs = ServiceProcesses()
    cache = tmp_path / "cache"
    agent_args = ["-m", "services.cli", "agent", "--nats", server.url, "--agent-id", "a1",
                  "--cache-dir", str(cache), "--log-dir", str(tmp_path / "replicas")]  # fmt: skip
    bus = await NatsBus.connect(server.url, name="kill-test")
    try:
        procs.start(["-m", "services.cli", "controller", "--nats", server.url],
                    log=tmp_path / "controller.log")  # fmt: skip
        agent = procs.start(agent_args, log=tmp_path / "agent1.log")
        deploy = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "services.cli", "deploy", str(config), "--nats", server.url],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert deploy.returncode == 0, deploy.stdout + deploy.stderr
        packages_dir = cache / "packages"

        def downloading() -> bool:
            return packages_dir.is_dir() and any(
                p.name.startswith(packages.PARTIAL_PREFIX) and p.stat().st_size > 0
                for p in packages_dir.iterdir()
            )

        await eventually(downloading, 60, "the agent downloading the package")
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
        assert [p for p in packages_dir.iterdir() if packages.SHA256_RE.fullmatch(p.name)] == []

        procs.start(agent_args, log=tmp_path / "agent2.log")
        status = await bus.kv(KV_STATUS)

        async def running() -> bool:
            entry = await status.get("heavy")
            return entry is not None and AppStatusView.decode(entry.value).status == "RUNNING"

        await eventually(running, 120, "heavy RUNNING after the restart")
        left = sorted(p.name for p in packages_dir.iterdir())
        assert len(left) == 1 and packages.SHA256_RE.fullmatch(left[0]), left
        assert (packages_dir / left[0] / "weights.dat").stat().st_size == 48 << 20
    finally:
        await bus.close()
        procs.stop_all(timeout=20)
        server.stop()

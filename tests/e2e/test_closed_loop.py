"""The closed loop through the CLI: `fleetpulse controller`, `fleetpulse agent` and
`fleetpulse deploy` as separate processes on a real nats-server, traffic from a DeploymentHandle."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from services.router.config import RouterConfig
from services.router.handle import DeploymentHandle, connect_handle
from shared.bus import Bus, Msg
from shared.kv.status import AppStatusView
from shared.kv.targets import ReplicaTarget, app_pattern
from shared.kv.view import DocKV
from shared.natsbus import NatsBus
from shared.natsserver import NatsServer
from shared.subjects import KV_APPS, KV_STATUS, KV_TARGETS
from shared.wire import decode_as
from shared.wire.messages import Heartbeat, ReplicaReport
from tests.procs import ROOT, ServiceProcesses
from tests.waiting import eventually as until

pytestmark = pytest.mark.e2e

APP_YAML = """
applications:
  - name: shop
    route_prefix: /shop
    deployments:
      - name: Model
        import_path: services.examples.model:Model
        init_kwargs: {base_latency_s: 0.05, contention: 0.5}
        max_ongoing_requests: 6
        health_check_period_s: 0.5
        health_check_timeout_s: 2
        graceful_shutdown_timeout_s: 5
        autoscaling_config:
          min_replicas: 0
          max_replicas: 3
          target_ongoing_requests: 2
          upscale_delay_s: 0.5
          downscale_delay_s: 3
          downscale_to_zero_delay_s: 3
          look_back_period_s: 1.5
          metrics_interval_s: 0.5
"""


def cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.fixture
def server() -> Iterator[NatsServer]:
    s = NatsServer()
    s.start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
async def bus(server: NatsServer) -> AsyncIterator[Bus]:
    b = await NatsBus.connect(server.url, name="e2e", reconnect_wait=0.1)
    yield b
    await b.close()


class Fleet:
    def __init__(self, url: str, tmp: Path) -> None:
        self.url, self.tmp = url, tmp
        self.procs = ServiceProcesses()
        self.agents: dict[str, subprocess.Popen[bytes]] = {}

    def controller(self) -> subprocess.Popen[bytes]:
        return self.procs.start(
            ["-m", "services.cli", "controller", "--nats", self.url, "--rebuild-s", "10"],
            log=self.tmp / "controller.log",
        )

    def agent(self, name: str, capacity: int = 4) -> subprocess.Popen[bytes]:
        p = self.procs.start(
            ["-m", "services.cli", "agent", "--nats", self.url, "--agent-id", name,
             "--max-replicas", str(capacity), "--log-dir", str(self.tmp / f"replicas-{name}")],
            log=self.tmp / f"agent-{name}.log",
        )  # fmt: skip
        self.agents[name] = p
        return p

    def stop(self) -> None:
        self.procs.stop_all(timeout=20)


@pytest.fixture
def fleet(server: NatsServer, tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(server.url, tmp_path)
    try:
        yield f
    finally:
        f.stop()


async def app_status(bus: Bus) -> AppStatusView | None:
    entry = await (await bus.kv(KV_STATUS)).get("shop")
    return AppStatusView.decode(entry.value) if entry else None


async def targets(bus: Bus) -> list[ReplicaTarget]:
    """shop.Model's fp_targets values (one key per replica, on any agent)."""
    docs = DocKV(await bus.kv(KV_TARGETS), ReplicaTarget)
    return [
        c.doc
        for c in await docs.snapshot(app_pattern("shop"))
        if c.doc and c.doc.deployment == "Model"
    ]


async def model(bus: Bus) -> tuple[str, int, int]:
    st = await app_status(bus)
    d = st.deployments.get("Model") if st else None
    return (d.status, d.target_replicas, d.running_replicas) if d else ("", -1, -1)


async def load(handle: DeploymentHandle, callers: int, seconds: float) -> tuple[int, int]:
    ok = failed = 0
    stop = time.monotonic() + seconds
    predict = handle.options(method="predict", deadline_s=30)

    async def one() -> None:
        nonlocal ok, failed
        while time.monotonic() < stop:
            try:
                await predict.remote(1.0)
                ok += 1
            except Exception:
                failed += 1

    await asyncio.gather(*(one() for _ in range(callers)))
    return ok, failed


def deploy(tmp: Path, url: str) -> None:
    path = tmp / "app.yaml"
    path.write_text(APP_YAML)
    res = cli("deploy", str(path), "--nats", url)
    assert res.returncode == 0, res.stderr
    assert "deployed shop" in res.stdout


async def test_invalid_yaml_is_refused_and_nothing_is_written(
    server: NatsServer, bus: Bus, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(APP_YAML.replace("max_replicas: 3", "max_replicas: lots"))
    res = cli("deploy", str(bad), "--nats", server.url)
    assert res.returncode == 2
    assert "bad.yaml" in res.stderr and "max_replicas" in res.stderr
    assert await (await bus.kv(KV_APPS)).keys() == []


async def test_scale_up_down_to_zero_and_wake(
    fleet: Fleet, server: NatsServer, bus: Bus, tmp_path: Path
) -> None:
    fleet.controller()
    fleet.agent("a1")
    deploy(tmp_path, server.url)
    await until(lambda: _is(model(bus), ("HEALTHY", 0, 0)), 30, "settled at zero")
    handle = await connect_handle(
        "shop", "Model", bus=bus, config=RouterConfig(metrics_interval_s=0.5)
    )
    try:
        # a request at zero wakes the deployment and succeeds
        assert (await handle.options(method="predict", deadline_s=30).remote(2.0))["y"] == 4.0
        # traffic drives scale-up: 8 callers / target 2 -> wants 4, capped at max 3
        ok, failed = await load(handle, callers=8, seconds=6)
        assert failed == 0 and ok > 50
        await until(lambda: _target_is(bus, 3), 10, "scaled to max 3")
        # idle brings it to zero; no request in flight is lost on the way down
        await until(lambda: _is(model(bus), ("HEALTHY", 0, 0)), 30, "back to zero")
        assert (await handle.options(method="predict", deadline_s=30).remote(1.0))["y"] == 2.0
    finally:
        await handle.close()
    res = cli("status", "--json", "--nats", server.url)
    assert res.returncode == 0 and '"shop"' in res.stdout


async def test_requests_in_flight_during_downscale_all_complete(
    fleet: Fleet, server: NatsServer, bus: Bus, tmp_path: Path
) -> None:
    fleet.controller()
    fleet.agent("a1")
    deploy(tmp_path, server.url)
    await until(lambda: _is(model(bus), ("HEALTHY", 0, 0)), 30, "settled at zero")
    handle = await connect_handle(
        "shop", "Model", bus=bus, config=RouterConfig(metrics_interval_s=0.5)
    )
    try:
        ok, failed = await load(handle, callers=8, seconds=8)
        await until(lambda: _target_is(bus, 3), 10, "scaled up")
        # a trickle keeps flowing while the deployment shrinks from 3 to 1
        ok, failed = await load(handle, callers=1, seconds=8)
        assert failed == 0 and ok > 20
    finally:
        await handle.close()


async def test_killed_replica_is_replaced_and_restarted_agent_recovers(
    fleet: Fleet, server: NatsServer, bus: Bus, tmp_path: Path
) -> None:
    fleet.controller()
    fleet.agent("a1")
    path = tmp_path / "app.yaml"
    path.write_text(APP_YAML.replace("min_replicas: 0", "min_replicas: 2"))
    assert cli("deploy", str(path), "--nats", server.url).returncode == 0
    await until(lambda: _is(model(bus), ("HEALTHY", 2, 2)), 30, "two replicas")
    handle = await connect_handle("shop", "Model", bus=bus)
    try:
        pid = (await handle.options(method="predict").remote(1.0))["pid"]
        os.kill(pid, signal.SIGKILL)
        first = {t.replica_id for t in await targets(bus)}
        assert len(first) == 2

        async def replaced() -> bool:
            ids = {t.replica_id for t in await targets(bus)}
            return len(ids) == 2 and ids != first

        await until(replaced, 20, "the killed replica replaced")
        await until(lambda: _is(model(bus), ("HEALTHY", 2, 2)), 30, "healthy again")
        # kill the agent (its replicas die with it), start it again: the fleet recovers
        fleet.agents["a1"].send_signal(signal.SIGKILL)
        fleet.agents["a1"].wait(10)
        fleet.agent("a1")
        await until(lambda: _is(model(bus), ("HEALTHY", 2, 2)), 60, "recovered after agent restart")
        assert (await handle.options(method="predict", deadline_s=30).remote(3.0))["y"] == 6.0
    finally:
        await handle.close()


async def test_nats_restart_reconnects_without_verdicts_or_scale_down(
    fleet: Fleet, server: NatsServer, bus: Bus, tmp_path: Path
) -> None:
    fleet.controller()
    fleet.agent("a1")
    path = tmp_path / "app.yaml"
    path.write_text(APP_YAML.replace("min_replicas: 0", "min_replicas: 2"))
    assert cli("deploy", str(path), "--nats", server.url).returncode == 0
    await until(lambda: _is(model(bus), ("HEALTHY", 2, 2)), 30, "two replicas")
    before = {t.replica_id for t in await targets(bus)}
    assert len(before) == 2
    handle = await connect_handle("shop", "Model", bus=bus)
    try:
        await asyncio.to_thread(server.restart)
        restarted = time.monotonic()

        async def serves() -> bool:
            try:
                await handle.options(method="predict", deadline_s=2).remote(1.0)
                return True
            except Exception:
                return False

        await until(serves, 20, "requests work again")
        assert time.monotonic() - restarted < 20
        await asyncio.sleep(5)  # long enough for any spurious verdict or scale-down to show
        after = {t.replica_id for t in await targets(bus)}
        assert after == before, "no replica may be replaced because of a NATS restart"
        assert await model(bus) == ("HEALTHY", 2, 2)
    finally:
        await handle.close()


async def _is(coro: Any, want: tuple[str, int, int]) -> bool:
    return bool(await coro == want)


async def _target_is(bus: Bus, n: int) -> bool:
    return (await model(bus))[1] == n


PUSH_YAML = """
applications:
  - name: pushy
    route_prefix: null
    deployments:
      - name: Echo
        import_path: services.examples.echo:Echo
        push_metrics: true
        health_check_period_s: 0.5
        autoscaling_config: {min_replicas: 1, max_replicas: 1, metrics_interval_s: 0.5}
"""


async def test_agent_started_replicas_push_their_own_reports_when_the_deployment_says_so(
    fleet: Fleet, server: NatsServer, bus: Bus, tmp_path: Path
) -> None:
    """`push_metrics` and the deployment's `metrics_interval_s` reach a replica an agent
    starts (through its target's spec): it publishes its own reports every 0.5 s, its health
    rides them, and once they flow it sends no standalone heartbeat."""
    reports: list[tuple[float, ReplicaReport]] = []
    heartbeats: list[float] = []

    async def on(msg: Msg) -> None:
        kind = msg.subject.split(".")[3]
        if kind == "replica":
            reports.append((time.monotonic(), decode_as(msg.data, ReplicaReport)))
        elif kind == "heartbeat":
            decode_as(msg.data, Heartbeat)
            heartbeats.append(time.monotonic())

    sub = await bus.subscribe("fp.v1.report.*.pushy.Echo.*", on)  # its own id ends the subject
    fleet.controller()
    fleet.agent("a1")
    path = tmp_path / "push.yaml"
    path.write_text(PUSH_YAML)
    assert cli("deploy", str(path), "--nats", server.url).returncode == 0
    try:
        await until(lambda: len(reports) >= 6, 60, "six reports of its own")
        times = [t for t, _ in reports]
        gaps = [b - a for a, b in zip(times[-5:], times[-4:], strict=False)]
        assert max(gaps) < 2.0  # the deployment's 0.5 s, not the default 10 s
        assert all(r.health is not None and r.health.healthy for _, r in reports[-3:])
        # once its reports flow they carry its health: no standalone heartbeat after the first
        assert [t for t in heartbeats if t > times[0]] == []
    finally:
        await sub.unsubscribe()


def test_up_demo_finishes_and_exits_zero() -> None:
    res = cli("up", "--quick", "--no-live", "--http-port", "0", timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    for step in ("settled at zero", "woke from zero", "scaled up under load",
                 "scaled to zero when idle", "woke again", "answered over HTTP"):  # fmt: skip
        assert f"✔ {step}" in res.stdout
    assert "stopped." in res.stdout

"""Health delivery as specified (issue 14): a handle-owning host's own health, the gates on its
self-entry, frame suppression, and bad news going out at once. Fake bus; the replica runtime on
the real clock with short periods (deadlines generous, no fixed sleeps where a condition works)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from services.controller.core import ControllerConfig, ControllerCore, Event, Probe
from services.controller.kv_delta import PutDoc
from services.replica.config import ReplicaConfig
from services.replica.runtime import ReplicaRuntime
from services.replica.usercode import UserDeployment
from services.router.config import RouterConfig
from services.router.handle import DeploymentHandle
from shared.appconfig import AppConfig, DeploymentConfig
from shared.bus import Msg
from shared.fakebus import FakeBus, FakeServer
from shared.kv.targets import ReplicaTarget
from shared.localhealth import LocalHealthProviders
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.wire import decode_as, encode
from shared.wire.columnar import handle_report_to_columnar
from shared.wire.messages import HandleReport, HealthStatus, Heartbeat, Lifecycle
from tests.waiting import eventually

ECHO = "services.examples.echo:Echo"


async def host(
    bus: FakeBus,
    providers: LocalHealthProviders,
    *,
    app: str = "front",
    period: float = 0.2,
    fail_file: Path | None = None,
    **cfg: Any,
) -> ReplicaRuntime:
    c = ReplicaConfig.of(
        app=app,
        deployment="api",
        import_path=ECHO,
        replica_id="host-1",
        health_check_period_s=period,
        health_check_timeout_s=1.0,
        init_kwargs={"fail_health_file": str(fail_file)} if fail_file else {},
        **cfg,
    )
    user = await UserDeployment.create(
        c.spec.import_path, c.spec.init_args, dict(c.spec.init_kwargs)
    )
    rt = ReplicaRuntime(c, bus, user, providers=providers)
    await rt.start()
    return rt


def in_report(report: HandleReport, rid: str = "host-1") -> bool:
    return rid in {h.replica_id for h in report.health}


# -- the self-entry: which routers take it ---------------------------------------------------


async def test_a_router_to_another_app_leaves_the_host_health_to_the_host() -> None:
    """Item 1: a report to another app lands at that app's owner, which cannot apply the host's
    entry; consuming it there would stamp it carried and stop the host's heartbeat."""
    bus = FakeServer().connect()
    providers = LocalHealthProviders()
    rt = await host(bus, providers, app="front")
    other = DeploymentHandle("back", "model", bus=bus, providers=providers)
    same = DeploymentHandle("front", "model", bus=bus, providers=providers)
    try:
        assert not in_report(other.router.make_report())
        assert rt.carriage.heartbeat_due(rt.clock.monotonic())  # still the host's job
        assert in_report(same.router.make_report())  # same app: the same owner gets it
        assert not rt.carriage.heartbeat_due(rt.clock.monotonic())
    finally:
        await other.close()
        await same.close()
        await rt.stop()
        await bus.close()


async def test_a_self_reporting_host_does_not_hand_its_health_to_routers() -> None:
    """Item 2: its own reports carry its health; the router must not send it a second time."""
    bus = FakeServer().connect()
    providers = LocalHealthProviders()
    rt = await host(bus, providers, push_metrics=True, metrics_interval_s=0.1)
    h = DeploymentHandle("front", "model", bus=bus, providers=providers)
    try:
        assert not in_report(h.router.make_report())
        assert len(providers) == 0
    finally:
        await h.close()
        await rt.stop()
        await bus.close()


async def test_heartbeats_resume_after_the_in_process_handle_is_closed() -> None:
    """Item 7: while the router consumes the host's health, no heartbeat; once closed, they
    come back on their own within about a freshness window."""
    bus = FakeServer().connect()
    beats: list[float] = []

    async def on_beat(msg: Msg) -> None:
        beats.append(time.monotonic())

    await bus.subscribe(S.report("heartbeat", "front", "api") + ".*", on_beat)
    providers = LocalHealthProviders()
    rt = await host(bus, providers)  # 0.2 s period: 1 s window
    h = DeploymentHandle("front", "model", bus=bus, providers=providers)
    try:
        h.router.make_report()
        start = len(beats)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2.0:
            h.router.make_report()
            await asyncio.sleep(0.3)
        assert len(beats) == start  # riding: none for two windows
        await h.close()
        closed = time.monotonic()
        await eventually(lambda: len(beats) > start)
        assert beats[-1] - closed < 1.0 + 1.0  # window + one tick, with room
    finally:
        await h.close()
        await rt.stop()
        await bus.close()


# -- frames and bad news ---------------------------------------------------------------------


async def test_no_frames_while_the_in_process_router_consumes_the_host_health() -> None:
    """Item 3: ~20 frames in 4.5 s were measured while the router consumed every 0.3 s. Then,
    with nothing riding, frames (not heartbeats) carry the held request's health again."""
    bus = FakeServer().connect()
    providers = LocalHealthProviders()
    rt = await host(bus, providers)
    h = DeploymentHandle("front", "model", bus=bus, providers=providers)
    caller = DeploymentHandle("front", "api", bus=bus, config=RouterConfig())
    try:
        await _membership(bus, "front", "api", rt)
        frames_before = rt.stats.frames
        call = asyncio.ensure_future(caller.options(method="sleep").remote(2.5))
        await eventually(lambda: rt.admission.ongoing == 1)
        t0 = time.monotonic()
        while not call.done():
            h.router.make_report()
            await asyncio.sleep(0.3)
        assert await call == 2.5
        assert time.monotonic() - t0 > 2.0
        assert rt.stats.frames == frames_before

        await h.close()  # nothing rides now: frames take over from one window on
        beats = rt.stats.heartbeats
        assert await caller.options(method="sleep").remote(2.5) == 2.5
        assert rt.stats.frames - frames_before >= 4
        assert rt.stats.heartbeats - beats <= 1
    finally:
        await caller.close()
        await h.close()
        await rt.stop()
        await bus.close()


async def test_every_failed_check_goes_out_at_once_while_admissions_carry_health(
    tmp_path: Path,
) -> None:
    """Item 4: after an admission carried a failure, failures 2 and 3 waited for a handle report
    (up to a metrics interval); each must leave on a heartbeat at once."""
    bus = FakeServer().connect()
    got: list[Heartbeat] = []

    async def on_beat(msg: Msg) -> None:
        got.append(decode_as(msg.data, Heartbeat))

    await bus.subscribe(S.report("heartbeat", "front", "api") + ".*", on_beat)
    fail = tmp_path / "fail"
    rt = await host(bus, LocalHealthProviders(), fail_file=fail)
    caller = DeploymentHandle("front", "api", bus=bus, config=RouterConfig())
    stop = asyncio.Event()

    async def traffic() -> None:  # admissions every 20 ms carry the latest status
        while not stop.is_set():
            await caller.options(method="echo").remote(0)
            await asyncio.sleep(0.02)

    try:
        await _membership(bus, "front", "api", rt)
        task = asyncio.ensure_future(traffic())
        await eventually(lambda: rt.stats.admitted > 3)
        fail.touch()
        await eventually(lambda: (rt.tracker.latest or _ok()).consecutive_failures >= 3)
        await eventually(lambda: {b.health.consecutive_failures for b in got} >= {1, 2, 3})
        stop.set()
        await task
    finally:
        await caller.close()
        await rt.stop()
        await bus.close()


def _ok() -> HealthStatus:
    return HealthStatus("x", True, 0.0, 0)


async def _membership(bus: FakeBus, app: str, dep: str, rt: ReplicaRuntime) -> None:
    from services.router.testing import Seat, put_membership

    await put_membership(bus, app, dep, 1, [Seat(rt.cfg.replica_id, rt.rpc_subject)])


# -- the controller: a host's entry on a report to another deployment of its app -----------


def _two_deployments() -> AppConfig:
    deps = tuple(
        DeploymentConfig(
            name=name,
            import_path="m:M",
            health_check_period_s=0.2,
            health_check_timeout_s=1.0,
            num_replicas=1,
        )
        for name in ("Front", "Model")
    )
    return AppConfig("shop", deps, route_prefix="/shop", ingress="Front", version="v1")


class _Core:
    def __init__(self) -> None:
        self.core = ControllerCore(ControllerConfig())
        self.t = 100.0
        self.seq = 0
        self.core.set_apps({"shop": _two_deployments()}, self.t)
        self.ids: dict[str, str] = {}
        self.probes: list[Probe] = []
        self.events: list[Event] = []
        self.tick()
        for dep, rid in self.ids.items():
            for state in ("starting", "ready"):
                ev = Lifecycle(
                    rid, "", state, self.wall(), S.rpc("shop", dep, rid), "v1", None, "shop", dep
                )
                self.core.ingest(S.report("lifecycle", "shop", dep), encode(ev), self.t)
        self.tick()

    def wall(self) -> float:
        return 1_700_000_000.0 + self.t

    def tick(self) -> None:
        self.t = round(self.t + 0.1, 6)
        for a in self.core.tick(self.t, self.wall()):
            if isinstance(a, PutDoc) and isinstance(a.doc, ReplicaTarget):
                self.ids.setdefault(a.doc.deployment, a.doc.replica_id)
            elif isinstance(a, Probe):
                self.probes.append(a)
            elif isinstance(a, Event):
                self.events.append(a)

    def model_report(self, health: tuple[HealthStatus, ...], columnar: bool) -> None:
        self.seq += 1
        model = self.ids["Model"]
        r = HandleReport(
            "h1", "shop", "Model", self.wall(), self.seq, 0.0, {model: 0.0}, health, 1, {}
        )
        subject = S.report("handle", "shop", "Model")
        parts = handle_report_to_columnar(r) if columnar else [encode(r)]
        for part in parts:
            self.core.ingest(subject, part, self.t)


@pytest.mark.parametrize("columnar", [False, True])
def test_the_host_entry_on_a_report_to_a_sibling_deployment_reaches_the_host(
    columnar: bool,
) -> None:
    """Item 1 at the controller: the entry used to be applied to Model's index and dropped."""
    sim = _Core()
    front, model = sim.ids["Front"], sim.ids["Model"]
    for k in range(50):  # 5 s; the host checks every 0.2 s, the router reports every 0.3 s
        if k % 3 == 0:
            ok = HealthStatus(front, True, sim.wall(), 0)
            sim.model_report((HealthStatus(model, True, sim.wall(), 0), ok), columnar)
        sim.tick()
    assert not [p for p in sim.probes if p.replica_id == front]
    assert sim.core.stats.ingested["host_health"] > 0
    for n in (1, 2, 3):  # the host's check fails: acted on
        sim.model_report((HealthStatus(front, False, sim.wall(), n),), columnar)
        sim.tick()
    assert any(e.kind == "replica_unhealthy" and e.replica_id == front for e in sim.events)

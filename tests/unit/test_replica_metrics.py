"""A replica's Prometheus metrics move with its requests and health checks (in-memory bus)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from services.replica.admission import Admission as AdmissionSlots
from services.replica.config import ReplicaConfig
from services.replica.runtime import ReplicaRuntime
from services.replica.usercode import UserDeployment
from shared.bus import Bus
from shared.fakebus import FakeServer
from shared.metrics_catalog import REQUEST_LATENCY_BUCKETS_S
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.wire import decode, encode
from shared.wire.messages import Admission, CallArgs, End, ErrorReply, Request
from tests.waiting import eventually

APP = "metered"


def value(name: str, deployment: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, {"app": APP, "deployment": deployment, **labels}) or 0.0


async def replica(bus: Bus, deployment: str, **kw: Any) -> ReplicaRuntime:
    cfg = ReplicaConfig.of(
        app=APP,
        deployment=deployment,
        import_path="services.examples.echo:Echo",
        replica_id=f"{deployment}-r1",
        health_check_period_s=0.05,
        health_check_timeout_s=1.0,
        **kw,
    )
    user = await UserDeployment.create(
        cfg.spec.import_path, cfg.spec.init_args, cfg.spec.init_kwargs
    )
    rt = ReplicaRuntime(cfg, bus, user)
    await rt.start()
    return rt


async def call(bus: Bus, rt: ReplicaRuntime, method: str, *args: Any) -> Any:
    """The last message of the reply: End, an ErrorReply, or a refusing Admission."""
    req = Request(uuid.uuid4().hex, method, False, False, None, encode(CallArgs(args, {})), "args")
    stream = await bus.request_stream(rt.rpc_subject, encode(req))
    try:
        while True:
            msg = decode((await stream.next(2.0)).data)
            if isinstance(msg, End | ErrorReply) or (
                isinstance(msg, Admission) and not msg.accepted
            ):
                return msg
    finally:
        await stream.close()


async def test_requests_admissions_and_ongoing() -> None:
    server = FakeServer()
    rbus, cbus = server.connect(), server.connect()
    dep = "requests"
    rt = await replica(rbus, dep, max_ongoing_requests=1)
    duration = "fleetpulse_replica_request_duration_seconds_count"
    try:
        assert isinstance(await call(cbus, rt, "echo", 1), End)
        assert isinstance(await call(cbus, rt, "fail", "boom"), ErrorReply)
        held = asyncio.create_task(call(cbus, rt, "sleep", 0.3))
        await eventually(lambda: rt.admission.ongoing, 5, every_s=0.005)
        assert value("fleetpulse_replica_ongoing_requests", dep) == 1
        refused = await call(cbus, rt, "echo", 2)
        assert isinstance(refused, Admission) and not refused.accepted
        assert isinstance(await held, End)
    finally:
        await rt.stop()
        await rbus.close()
        await cbus.close()
    assert value("fleetpulse_replica_ongoing_requests", dep) == 0
    assert value(duration, dep, outcome="ok") == 2
    assert value(duration, dep, outcome="user_error") == 1
    assert value("fleetpulse_replica_admissions_total", dep, result="accepted") == 3
    assert value("fleetpulse_replica_admissions_total", dep, result="rejected") == 1


async def test_health_checks_and_heartbeats(tmp_path: Path) -> None:
    server = FakeServer()
    bus = server.connect()
    dep = "health"
    flag = tmp_path / "fail"
    rt = await replica(bus, dep, init_kwargs={"fail_health_file": str(flag)})
    try:
        probe = await bus.request(S.probe(rt.cfg.replica_id), b"", timeout=1.0)
        assert probe.data
        flag.touch()
        checks = "fleetpulse_replica_health_checks_total"
        await eventually(lambda: value(checks, dep, result="unhealthy"), 5, every_s=0.005)
        await eventually(
            lambda: value("fleetpulse_replica_health_messages_total", dep, channel="heartbeat"),
            5,
            every_s=0.005,
        )
    finally:
        await rt.stop()
        await bus.close()
    assert value(checks, dep, result="healthy") >= 1
    assert value("fleetpulse_replica_health_messages_total", dep, channel="probe") == 1


def test_request_metrics_are_read_when_scraped_and_sum_a_deployments_replicas() -> None:
    """No update per request: the gauge and the admissions counter read each replica's
    admission and totals; a stopped replica stays in the sums (its counts never go down)."""
    from services.replica.metrics import ReplicaMetrics
    from services.replica.runtime import ReplicaStats

    dep = "read-when-scraped"
    one, two = AdmissionSlots(4), AdmissionSlots(4)
    ReplicaMetrics(APP, dep, one, ReplicaStats(admitted=5, rejected=1))
    ReplicaMetrics(APP, dep, two, ReplicaStats(admitted=2))
    assert one.try_admit() and two.try_admit() and two.try_admit()
    assert value("fleetpulse_replica_ongoing_requests", dep) == 3
    two.release()
    two.release()
    assert value("fleetpulse_replica_ongoing_requests", dep) == 1
    assert value("fleetpulse_replica_admissions_total", dep, result="accepted") == 7
    assert value("fleetpulse_replica_admissions_total", dep, result="rejected") == 1


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["ok", "user_error", "cancelled"]),
            st.one_of(
                st.sampled_from(REQUEST_LATENCY_BUCKETS_S),  # on a bound: counted in it
                st.floats(min_value=0.0, max_value=300.0, allow_nan=False),
            ),
        ),
        max_size=40,
    )
)
def test_request_durations_expose_what_prometheus_clients_histogram_would(
    observed: list[tuple[str, float]],
) -> None:
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from services.replica.metrics import REQUEST_SECONDS_NAME, Durations, _Replica, _RequestMetrics
    from services.replica.runtime import ReplicaStats

    theirs_registry = CollectorRegistry()
    theirs = Histogram(REQUEST_SECONDS_NAME, "h", ["app", "deployment", "outcome"],
                       buckets=REQUEST_LATENCY_BUCKETS_S, registry=theirs_registry)  # fmt: skip
    ours = _RequestMetrics()
    halves = [Durations(), Durations()]  # two replicas of the deployment: their sum is shown
    for durations in halves:
        ours.add(APP, "d", _Replica(AdmissionSlots(1), ReplicaStats(), durations))
    for i, (outcome, seconds) in enumerate(observed):
        theirs.labels(APP, "d", outcome).observe(seconds)
        halves[i % 2].observe(outcome, seconds)
    ours_registry = CollectorRegistry()
    ours_registry.register(ours)

    def samples(registry: CollectorRegistry) -> list[str]:
        text = generate_latest(registry).decode()
        return sorted(line for line in text.splitlines()
                      if line.startswith(REQUEST_SECONDS_NAME) and "_created" not in line)  # fmt: skip

    ours_lines, theirs_lines = samples(ours_registry), samples(theirs_registry)
    assert [line.rsplit(" ", 1)[0] for line in ours_lines] == [
        line.rsplit(" ", 1)[0] for line in theirs_lines
    ]
    for a, b in zip(ours_lines, theirs_lines, strict=True):
        assert float(a.rsplit(" ", 1)[1]) == pytest.approx(float(b.rsplit(" ", 1)[1]))

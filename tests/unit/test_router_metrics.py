"""A router's Prometheus metrics move with its calls (fake replicas on the in-memory bus)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest
from prometheus_client import REGISTRY

from services.router.config import RouterConfig
from services.router.errors import BackPressureError, DeadlineExceeded, RequestFailed
from services.router.handle import DeploymentHandle, connect_handle
from services.router.http import call_http
from services.router.metrics import outcome_of
from services.router.testing import FakeReplica, put_membership
from shared.clock import FakeClock
from shared.fakebus import FakeBus, FakeServer
from shared.wire.messages import ErrorReply, HttpRequest
from tests.waiting import eventually

APP = "metered"
FAST = RouterConfig(
    admission_timeout_s=0.05,
    queue_poll_max_s=0.01,
    metrics_interval_s=60.0,
    max_queued_requests=1,
)


def value(name: str, deployment: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, {"app": APP, "deployment": deployment, **labels}) or 0.0


def calls(deployment: str, outcome: str) -> float:
    return value("fleetpulse_router_request_duration_seconds_count", deployment, outcome=outcome)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def buses(clock: FakeClock) -> AsyncIterator[tuple[FakeBus, FakeBus]]:
    server = FakeServer(clock=clock)
    a, b = server.connect("router"), server.connect("replicas")
    yield a, b
    await a.close()
    await b.close()


async def open_handle(bus: FakeBus, clock: FakeClock, deployment: str) -> DeploymentHandle:
    return await connect_handle(
        APP, deployment, bus=bus, config=FAST, clock=clock, rng=random.Random(1)
    )


async def test_calls_are_timed_by_outcome_and_retries_counted(
    buses: tuple[FakeBus, FakeBus], clock: FakeClock
) -> None:
    bus, rbus = buses
    dep = "calls"
    full = await FakeReplica(rbus, APP, dep, "r1", clock=clock).start()
    ok = await FakeReplica(rbus, APP, dep, "r2", clock=clock).start()
    full.reject = True
    await put_membership(rbus, APP, dep, 1, [full.member, ok.member])
    before = (calls(dep, "ok"), calls(dep, "user_error"))
    retried = value("fleetpulse_router_retries_total", dep, reason="rejected")
    h = await open_handle(bus, clock, dep)
    try:
        for _ in range(4):
            await h.remote("x")
            clock.advance(1.0)  # the backoff of r1 runs out: it is tried (and refuses) again
        response = await call_http(
            h.router, HttpRequest("GET", "/", "", (), b""), method="__call__", deadline_s=None
        )
        assert response.status == 200
        ok.error = full.error = ErrorReply("user_error", "boom", False)
        with pytest.raises(RequestFailed):
            await h.remote("y")
    finally:
        await h.close()
    assert (calls(dep, "ok") - before[0], calls(dep, "user_error") - before[1]) == (5, 1)
    assert value("fleetpulse_router_retries_total", dep, reason="rejected") - retried >= 2


async def test_queue_gauge_and_failures_while_waiting(
    buses: tuple[FakeBus, FakeBus], clock: FakeClock
) -> None:
    bus, rbus = buses
    dep = "queue"
    await put_membership(rbus, APP, dep, 1, [])  # no replica: requests wait
    before = (calls(dep, "deadline_exceeded"), calls(dep, "backpressure"))
    h = await open_handle(bus, clock, dep)
    try:
        waiting = asyncio.create_task(h.options(deadline_s=5.0).remote())
        await eventually(lambda: h.router.queued_now, 5, every_s=0.005)
        assert value("fleetpulse_router_queued_requests", dep) == 1
        with pytest.raises(BackPressureError):  # max_queued_requests=1
            await h.options(deadline_s=5.0).remote()
        clock.advance(10.0)
        with pytest.raises(DeadlineExceeded):
            await waiting
    finally:
        await h.close()
    assert value("fleetpulse_router_queued_requests", dep) == 0
    assert calls(dep, "deadline_exceeded") - before[0] == 1
    assert calls(dep, "backpressure") - before[1] == 1


def test_outcomes_stay_a_small_set() -> None:
    assert outcome_of(RequestFailed("user_error", "x", False)) == "user_error"
    assert outcome_of(RequestFailed("made-up code", "x", False)) == "failed"
    assert outcome_of(asyncio.CancelledError()) == "cancelled"
    assert outcome_of(ValueError()) == "error"

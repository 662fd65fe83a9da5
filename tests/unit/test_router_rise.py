"""Early reports on a jump in load (services/router/rise.py): a rise that holds is reported at
once with averages over the rise only; a burst shorter than the settle time, a small change and
a second rise within the minimum interval are not."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.router.config import RouterConfig
from services.router.handle import DeploymentHandle
from services.router.rise import RISE_FACTOR, RISE_MIN, RISE_SETTLE_S, RiseDetector
from services.router.testing import FakeReplica, put_membership
from shared.bus import Msg
from shared.fakebus import FakeBus, FakeServer
from shared.wire.codec import decode_as
from shared.wire.messages import HandleReport

APP, DEP = "shop", "cart"


def test_a_rise_that_holds_reports_once_per_interval() -> None:
    r = RiseDetector(min_interval_s=1.0)
    r.reported(3.0)
    assert not r.begin(7.0, 0.0)  # below 2 x 3 + 2
    assert r.begin(8.0, 0.0)
    assert not r.begin(20.0, 0.05)  # already looking
    assert r.settled(8.0, 0.1)
    r.reported(0.5)  # the early report's average (the rise had only just begun)
    assert not r.begin(20.0, 0.5)  # within the minimum interval
    assert r.begin(20.0, 1.2)


def test_a_burst_that_ends_before_the_settle_time_is_not_reported() -> None:
    r = RiseDetector(min_interval_s=1.0)
    assert r.begin(4.0, 0.0)
    assert not r.settled(1.0, 0.1)
    assert r.begin(4.0, 0.2)  # and a later rise may start again at once


@given(st.floats(0, 1e6), st.floats(0, 1e6))
def test_property_a_rise_needs_double_plus_two(reported: float, load: float) -> None:
    r = RiseDetector(min_interval_s=1.0)
    r.reported(reported)
    assert r.begin(load, 10.0) == (load >= RISE_FACTOR * reported + RISE_MIN)


@pytest.fixture
async def buses() -> AsyncIterator[tuple[FakeBus, FakeBus]]:
    server = FakeServer()
    a, b = server.connect("router"), server.connect("replica")
    yield a, b
    await a.close()
    await b.close()


async def test_a_step_is_reported_at_once_with_the_rise_averaged_alone(
    buses: tuple[FakeBus, FakeBus],
) -> None:
    bus, rbus = buses
    replica = await FakeReplica(rbus, APP, DEP, "r1").start()
    replica.hang = True  # held: the load stays
    await put_membership(rbus, APP, DEP, 1, [replica.member])
    reports: list[HandleReport] = []

    async def on_report(msg: Msg) -> None:
        reports.append(decode_as(msg.data, HandleReport))

    await bus.subscribe(f"fp.v1.report.handle.{APP}.{DEP}", on_report)
    h = DeploymentHandle(APP, DEP, bus=bus, config=RouterConfig(metrics_interval_s=30.0))
    await h.router.wait_ready(2.0)
    calls = [asyncio.create_task(h.options(deadline_s=60).remote()) for _ in range(8)]
    try:
        async with asyncio.timeout(10):
            while not reports:  # noqa: ASYNC110 - the report arrives through the bus
                await asyncio.sleep(0.01)
        (early,) = reports
        # the regular cadence is 30 s: this one came from the rise, covering only the rise
        assert sum(early.running.values()) == pytest.approx(8.0, abs=0.5)
    finally:
        for c in calls:
            c.cancel()
        await h.close()
        await replica.stop()


async def test_short_requests_below_the_threshold_send_no_early_report(
    buses: tuple[FakeBus, FakeBus],
) -> None:
    bus, rbus = buses
    replica = await FakeReplica(rbus, APP, DEP, "r1").start()
    await put_membership(rbus, APP, DEP, 1, [replica.member])
    sent: list[int] = []

    async def on_report(msg: Msg) -> None:
        sent.append(1)

    await bus.subscribe(f"fp.v1.report.handle.{APP}.{DEP}", on_report)
    h = DeploymentHandle(APP, DEP, bus=bus, config=RouterConfig(metrics_interval_s=30.0))
    await h.router.wait_ready(2.0)
    try:
        for _ in range(20):  # one at a time: the load never reaches 2
            await h.remote()
        await asyncio.sleep(3 * RISE_SETTLE_S)
        assert sent == []
    finally:
        await h.close()
        await replica.stop()

"""record_autoscaling_stats() in the replica: validation, isolation, and the reports it rides."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from typing import Any

import numpy as np
import pytest

from services.replica.config import ReplicaConfig
from services.replica.custom_stats import (
    BAD_NAME,
    BUSY,
    NOT_FINITE,
    RAISED,
    TIMEOUT,
    TOO_MANY,
    WRONG_TYPE,
    BadStats,
    CustomStats,
    validate,
)
from services.replica.runtime import ReplicaRuntime
from services.replica.usercode import UserDeployment
from shared.badinput import BadInput
from shared.bus import Msg
from shared.clock import FakeClock
from shared.fakebus import FakeServer
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.wire import decode_as
from shared.wire.limits import MAX_CUSTOM_METRICS, MAX_CUSTOM_NAME_LEN
from shared.wire.messages import ReplicaReport
from tests.waiting import eventually

log = logging.getLogger("test_custom_stats")


class Stats:
    """A deployment whose stats answer is set by the test (class attribute: one per process)."""

    answer: Any = {"kv_cache_use": 0.5}

    def echo(self, x: Any) -> Any:
        return x

    def record_autoscaling_stats(self) -> Any:
        if isinstance(Stats.answer, BaseException):
            raise Stats.answer
        return Stats.answer


class AsyncStats(Stats):
    async def record_autoscaling_stats(self) -> Any:  # type: ignore[override]
        return {"queue_depth": 3}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"kv_cache_use": 0.25, "tokens": 12}, {"kv_cache_use": 0.25, "tokens": 12.0}),
        ({"x": np.float64(1.5), "y": np.int64(2)}, {"x": 1.5, "y": 2.0}),
        ({}, {}),
        ({"n" * MAX_CUSTOM_NAME_LEN: -1.0}, {"n" * MAX_CUSTOM_NAME_LEN: -1.0}),
    ],
)
def test_valid_answers_become_floats(value: Any, expected: dict[str, float]) -> None:
    assert validate(value) == expected


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ([("x", 1.0)], WRONG_TYPE),
        (0.5, WRONG_TYPE),
        ({"x": "0.5"}, WRONG_TYPE),
        ({"x": True}, WRONG_TYPE),
        ({"x": None}, WRONG_TYPE),
        ({"x": math.nan}, NOT_FINITE),
        ({"x": math.inf}, NOT_FINITE),
        ({"x": np.float64("-inf")}, NOT_FINITE),
        ({1: 0.5}, BAD_NAME),
        ({"": 0.5}, BAD_NAME),
        ({"é" * (MAX_CUSTOM_NAME_LEN // 2 + 1): 0.5}, BAD_NAME),  # counted in UTF-8 bytes
        ({f"m{i}": 1.0 for i in range(MAX_CUSTOM_METRICS + 1)}, TOO_MANY),
    ],
)
def test_invalid_answers_name_their_reason(value: Any, reason: str) -> None:
    with pytest.raises(BadStats) as err:
        validate(value)
    assert err.value.reason == reason


def collector(
    fn: Any, timeout_s: float = 0.2, clock: FakeClock | None = None
) -> tuple[CustomStats, BadInput, list[str]]:
    outcomes: list[str] = []
    bad = BadInput("replica r1", log, clock=clock or FakeClock())
    return CustomStats(fn, timeout_s, bad, outcomes.append), bad, outcomes


async def test_an_exception_is_counted_and_logged_rate_limited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()

    def broken() -> dict[str, float]:
        raise RuntimeError("cache probe failed")

    stats, bad, outcomes = collector(broken, clock=clock)
    with caplog.at_level(logging.WARNING, logger="test_custom_stats"):
        for _ in range(5):
            assert await stats.collect() == {}
        clock.advance(10)
        assert await stats.collect() == {}
    assert outcomes == [RAISED] * 6 and bad.counts[RAISED] == 6
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2  # the first, then one after the interval with the suppressed count
    assert "RuntimeError: cache probe failed" in lines[0]
    assert "4 more since last report" in lines[1]


async def test_a_slow_sync_call_times_out_and_no_second_call_piles_up() -> None:
    release = threading.Event()
    calls = 0

    def stuck() -> dict[str, float]:
        nonlocal calls
        calls += 1
        release.wait(10)
        return {"x": 1.0}

    stats, _, outcomes = collector(stuck, timeout_s=0.05)
    try:
        assert await stats.collect() == {}
        assert await stats.collect() == {}  # the thread is still at work: not called again
        assert outcomes == [TIMEOUT, BUSY] and calls == 1
    finally:
        release.set()
    await eventually(lambda: stats._running is not None and stats._running.done(), 5, "thread")
    assert await stats.collect() == {"x": 1.0}  # the method recovered: values flow again
    assert outcomes[-1] == "ok" and calls == 2


async def test_a_slow_async_call_is_cancelled_at_the_timeout() -> None:
    cancelled = asyncio.Event()

    async def slow() -> dict[str, float]:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return {}

    stats, _, outcomes = collector(slow, timeout_s=0.05)
    assert await stats.collect() == {}
    assert outcomes == [TIMEOUT] and cancelled.is_set()


async def test_no_method_means_no_call_and_no_outcome() -> None:
    stats, bad, outcomes = collector(None)
    assert await stats.collect() == {}
    assert outcomes == [] and bad.total == 0


async def replica(server: FakeServer, import_path: str, **spec: Any) -> ReplicaRuntime:
    cfg = ReplicaConfig.of(
        app="app",
        deployment="dep",
        import_path=import_path,
        replica_id="r1",
        health_check_period_s=0.5,
        metrics_interval_s=0.1,  # the method gets half of it
        **spec,
    )
    user = await UserDeployment.create(import_path, (), {})
    rt = ReplicaRuntime(cfg, server.connect(), user)
    await rt.start()
    return rt


async def reports(server: FakeServer) -> tuple[list[ReplicaReport], Any]:
    got: list[ReplicaReport] = []
    bus = server.connect()

    async def on(msg: Msg) -> None:
        got.append(decode_as(msg.data, ReplicaReport))

    await bus.subscribe(S.report("replica", "app", "dep") + ".*", on)  # any replica's
    return got, bus


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("tests.unit.test_custom_stats:Stats", {"kv_cache_use": 0.5}),
        ("tests.unit.test_custom_stats:AsyncStats", {"queue_depth": 3.0}),
    ],
)
async def test_a_deployment_with_the_method_pushes_reports_carrying_its_values(
    path: str, expected: dict[str, float]
) -> None:
    Stats.answer = {"kv_cache_use": 0.5}
    server = FakeServer()
    got, bus = await reports(server)
    rt = await replica(server, path)  # push_metrics not set: the method turns reports on
    try:
        assert rt.push_metrics
        await eventually(lambda: any(r.custom == expected for r in got), 5, "custom values")
        assert {r.replica_id for r in got} == {"r1"}
    finally:
        await rt.stop()
        await bus.close()


async def test_without_the_method_reports_stay_off_unless_push_metrics() -> None:
    server = FakeServer()
    got, bus = await reports(server)
    rt = await replica(server, "services.examples.echo:Echo")
    try:
        assert not rt.push_metrics
        await asyncio.sleep(0.3)  # three report intervals: none may come
        assert got == []
    finally:
        await rt.stop()
        await bus.close()


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (ValueError("boom"), RAISED),
        ({"x": math.nan}, NOT_FINITE),
        ({"x": "high"}, WRONG_TYPE),
        ({"bad name " * 20: 1.0}, BAD_NAME),
        ("0.5", WRONG_TYPE),
    ],
)
async def test_a_bad_method_costs_only_its_values(answer: Any, reason: str) -> None:
    Stats.answer = answer
    server = FakeServer()
    got, bus = await reports(server)
    rt = await replica(server, "tests.unit.test_custom_stats:Stats")
    try:
        await eventually(lambda: len(got) >= 3, 5, "reports despite the bad method")
        assert all(r.custom == {} for r in got)
        assert rt.bad.counts[reason] >= 3
        # the values come back once the method recovers
        Stats.answer = {"kv_cache_use": 0.75}
        await eventually(lambda: got[-1].custom == {"kv_cache_use": 0.75}, 5, "values back")
    finally:
        Stats.answer = {"kv_cache_use": 0.5}
        await rt.stop()
        await bus.close()

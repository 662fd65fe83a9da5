"""The group shell's self-fencing: a member lets go when it cannot refresh its entry, but not
because one refresh timed out while its own event loop was busy (fake bus, fake clock)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from services.controller.group import GroupCore
from services.controller.group_shell import GroupRunner
from shared.clock import FakeClock
from shared.errors import BusError, BusTimeout
from shared.fakebus import FakeServer
from tests.waiting import eventually

PARTITIONS = 4
TTL_S = 2.0


def member(on_take: Callable[[int, int], Awaitable[None]]) -> tuple[GroupRunner, list[int]]:
    """A member on a fake bus and clock; the list collects the partitions it drops."""
    dropped: list[int] = []

    async def on_drop(p: int) -> None:
        dropped.append(p)

    runner = GroupRunner(
        FakeServer().connect("m1"),
        GroupCore("m1", PARTITIONS, TTL_S),
        on_take,
        on_drop,
        heartbeat_s=0.01,
        describe=dict,
        clock=FakeClock(),
    )
    return runner, dropped


async def running_member() -> tuple[GroupRunner, FakeClock, list[int]]:
    async def on_take(p: int, epoch: int) -> None:
        return None

    runner, dropped = member(on_take)
    clock = runner.clock
    assert isinstance(clock, FakeClock)
    await runner.start()
    await eventually(lambda: len(runner.core.owned) == PARTITIONS, 5, "owns every partition")
    return runner, clock, dropped


class FlakyPuts:
    """The member's KV, except that the next `failures` puts time out after the loop was
    blocked past the TTL."""

    def __init__(self, kv: Any, clock: FakeClock, failures: int) -> None:
        self.kv, self.clock, self.failures, self.calls = kv, clock, failures, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kv, name)

    async def put(self, key: str, value: bytes) -> int:
        self.calls += 1
        if self.calls <= self.failures:
            self.clock.advance(TTL_S + 3.0)
            raise BusTimeout(f"KV put fp_controllers/{key}: timed out")
        return int(await self.kv.put(key, value))


def failing_puts(runner: GroupRunner, clock: FakeClock, failures: int) -> FlakyPuts:
    flaky = FlakyPuts(runner.members_kv, clock, failures)
    runner.members_kv = flaky
    return flaky


async def test_one_refresh_timed_out_by_a_blocked_loop_keeps_the_partitions() -> None:
    runner, clock, dropped = await running_member()
    try:
        flaky = failing_puts(runner, clock, failures=1)
        await eventually(lambda: flaky.calls >= 4, 5, "several refreshes after the failed one")
        assert dropped == []
        assert len(runner.core.owned) == PARTITIONS
    finally:
        await runner.step_down()


async def test_a_member_that_cannot_refresh_lets_go_of_everything() -> None:
    runner, clock, dropped = await running_member()
    try:
        failing_puts(runner, clock, failures=10**6)
        await eventually(lambda: sorted(dropped) == list(range(PARTITIONS)), 5, "dropped all")
        await asyncio.sleep(0.05)
        assert not runner.core.owned
    finally:
        await runner.step_down()


class BrokenOnce:
    """The member's KV, except that the next put raises what no caller expects."""

    def __init__(self, kv: Any) -> None:
        self.kv, self.calls = kv, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kv, name)

    async def put(self, key: str, value: bytes) -> int:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("a bug somewhere under the heartbeat")
        return int(await self.kv.put(key, value))


async def test_an_unexpected_error_in_a_step_does_not_end_the_member() -> None:
    runner, _, dropped = await running_member()
    try:
        broken = BrokenOnce(runner.members_kv)
        runner.members_kv = broken
        await eventually(lambda: broken.calls >= 4, 5, "heartbeats after the failed step")
        assert runner.loop_errors == 1
        assert dropped == [] and len(runner.core.owned) == PARTITIONS
    finally:
        await runner.step_down()


async def test_a_partition_that_fails_to_start_is_handed_back_and_taken_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A take whose start fails on NATS (a consumer create that timed out) must not leave the
    lease held with nothing reading the partition: it is handed back, and taken again later."""
    started: list[int] = []
    failures = {2: 1}

    async def on_take(p: int, epoch: int) -> None:
        if failures.get(p, 0) > 0:
            failures[p] -= 1
            raise BusTimeout(f"partition {p}'s consumer: timed out")
        started.append(p)

    runner, dropped = member(on_take)
    with caplog.at_level(logging.WARNING, logger="services.controller.group_shell"):
        await runner.start()
        try:
            await eventually(lambda: sorted(started) == list(range(PARTITIONS)), 5, "all started")
            assert dropped == [2]  # the failed start was undone before the lease went back
            assert len(runner.core.owned) == PARTITIONS
            assert runner.loop_errors == 0  # handled where it happened, not as a failed step
        finally:
            await runner.step_down()
    handed = [r for r in caplog.records if "handing it back" in r.getMessage()]
    assert len(handed) == 1 and handed[0].exc_info is None


async def test_nats_trouble_in_a_step_is_one_line_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runner, _, dropped = await running_member()
    beat, calls = runner._beat, [0]

    async def failing_once() -> None:
        calls[0] += 1
        if calls[0] == 1:
            raise BusError("lease read: connection draining") from TimeoutError()
        await beat()

    runner._beat = failing_once  # type: ignore[method-assign]
    try:
        with caplog.at_level(logging.WARNING, logger="services.controller.group_shell"):
            await eventually(lambda: calls[0] >= 3, 5, "steps after the failed one")
        assert runner.loop_errors == 1
        lines = [r for r in caplog.records if "group step failed" in r.getMessage()]
        assert len(lines) == 1 and lines[0].exc_info is None
        assert dropped == [] and len(runner.core.owned) == PARTITIONS
    finally:
        await runner.step_down()

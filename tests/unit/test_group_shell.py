"""The group shell's self-fencing: a member lets go when it cannot refresh its entry, but not
because one refresh timed out while its own event loop was busy (fake bus, fake clock)."""

from __future__ import annotations

import asyncio
from typing import Any

from services.controller.group import GroupCore
from services.controller.group_shell import GroupRunner
from shared.clock import FakeClock
from shared.errors import BusTimeout
from shared.fakebus import FakeServer
from tests.waiting import eventually

PARTITIONS = 4
TTL_S = 2.0


async def running_member() -> tuple[GroupRunner, FakeClock, list[int]]:
    clock = FakeClock()
    dropped: list[int] = []

    async def on_take(p: int, epoch: int) -> None:
        return None

    async def on_drop(p: int) -> None:
        dropped.append(p)

    runner = GroupRunner(
        FakeServer().connect("m1"),
        GroupCore("m1", PARTITIONS, TTL_S),
        on_take,
        on_drop,
        heartbeat_s=0.01,
        describe=dict,
        clock=clock,
    )
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

"""Time as an input.

Cores take `now` (or a `Clock`) from their caller and never read `time.*`. `wall()` is unix
seconds, used only to stamp outgoing messages; `monotonic()` is this process's steady clock and
is what every age decision uses (a remote wall clock is never compared against a local one).
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def wall(self) -> float:
        """Unix time in seconds (for stamping messages)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a steady local clock (for every age decision)."""
        ...


class SystemClock:
    """The real clock."""

    __slots__ = ()

    def wall(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that moves only when told to. Wall and monotonic advance together."""

    __slots__ = ("_mono", "_wall")

    def __init__(self, wall: float = 1_700_000_000.0, monotonic: float = 1000.0) -> None:
        self._wall = wall
        self._mono = monotonic

    def wall(self) -> float:
        return self._wall

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        self._wall += seconds
        self._mono += seconds

    def skew_wall(self, seconds: float) -> None:
        """Move only the wall clock (an NTP step): age decisions must not notice."""
        self._wall += seconds


async def sleep_until(clock: Clock, deadline_monotonic: float) -> None:
    """Sleep until `clock.monotonic()` reaches the deadline (shell helper, real clocks)."""
    delay = deadline_monotonic - clock.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


SYSTEM_CLOCK: Clock = SystemClock()

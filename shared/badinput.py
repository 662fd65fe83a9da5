"""Counting, rate-limited logging and dropping of bad input, for every subscriber.

A subscriber that receives something it cannot decode must not crash, must not flood the log, and
must leave a trace an operator can see: `BadInput.drop(reason, detail)` counts by reason and logs
at most one line per reason per interval (with how many were suppressed since the last line).
"""

from __future__ import annotations

import logging
from collections import Counter

from shared.clock import SYSTEM_CLOCK, Clock

DEFAULT_LOG_INTERVAL_S = 5.0


class BadInput:
    __slots__ = ("_clock", "_interval", "_last_logged", "_logger", "_suppressed", "counts", "where")

    def __init__(
        self,
        where: str,
        logger: logging.Logger,
        *,
        clock: Clock = SYSTEM_CLOCK,
        interval_s: float = DEFAULT_LOG_INTERVAL_S,
    ) -> None:
        self.where = where
        self.counts: Counter[str] = Counter()
        self._logger = logger
        self._clock = clock
        self._interval = interval_s
        self._last_logged: dict[str, float] = {}
        self._suppressed: Counter[str] = Counter()

    def drop(self, reason: str, detail: str = "") -> None:
        self.counts[reason] += 1
        now = self._clock.monotonic()
        last = self._last_logged.get(reason)
        if last is not None and now - last < self._interval:
            self._suppressed[reason] += 1
            return
        self._last_logged[reason] = now
        more = self._suppressed.pop(reason, 0)
        suffix = f" ({more} more since last report)" if more else ""
        self._logger.warning(
            "%s: dropped bad message (%s) %s%s", self.where, reason, detail, suffix
        )

    @property
    def total(self) -> int:
        return sum(self.counts.values())

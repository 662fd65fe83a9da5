"""When a router reports early: a jump in load that holds.

How it works: a router's handle reports carry time-weighted averages over the report interval,
so a step in load shows fully only one interval after it happened, and the autoscaler's upscale
delay starts from the first report that shows it. A rise is a load (requests in flight plus
queued at this router) of at least `RISE_FACTOR` x what the last report said plus `RISE_MIN`.
When one starts, the router restarts its averaging windows there (`begin` returns True) and
looks again `RISE_SETTLE_S` later: if the load still holds at the threshold, it sends a report
at once (`settled` returns True), whose averages cover only the rise; otherwise it waits for the
regular report. At most one early report per `min_interval_s`, so a load that keeps doubling
costs one report a second, and a burst shorter than the settle time costs nothing. The next
regular report follows one interval after the early one, with a full average that corrects an
early report made on a burst that stopped after it.

Pure: the caller passes loads and `now`.
"""

from __future__ import annotations

import math
from typing import Final

RISE_FACTOR: Final = 2.0
RISE_MIN: Final = 2.0
RISE_SETTLE_S: Final = 0.1


class RiseDetector:
    __slots__ = ("_armed_at", "_last_early", "min_interval_s", "reported_load")

    def __init__(self, min_interval_s: float) -> None:
        self.min_interval_s = min_interval_s
        self.reported_load = 0.0
        """What the last report said: running plus queued, averaged over its window."""
        self._armed_at: float | None = None
        self._last_early = -math.inf

    def _rising(self, load: float) -> bool:
        return load >= RISE_FACTOR * self.reported_load + RISE_MIN

    def begin(self, load: float, now: float) -> bool:
        """A load change: True when a rise starts here (look again at `now + RISE_SETTLE_S`)."""
        if self._armed_at is not None or not self._rising(load):
            return False
        if now - self._last_early < self.min_interval_s:
            return False
        self._armed_at = now
        return True

    def settled(self, load: float, now: float) -> bool:
        """The settle time passed: True when the rise held (report now)."""
        self._armed_at = None
        if not self._rising(load):
            return False
        self._last_early = now
        return True

    def reported(self, load: float) -> None:
        self.reported_load = load

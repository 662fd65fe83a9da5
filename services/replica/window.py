"""Time-weighted mean of a level (ongoing requests) over a reporting window.

The replica reports `running_requests` as the mean over the last interval, not a sample, so a
burst between two reports is not missed and a momentary idle is not mistaken for zero load.
"""

from __future__ import annotations


class LevelAverage:
    __slots__ = ("_area", "_level", "_since", "_window_start")

    def __init__(self, now: float, level: float = 0.0) -> None:
        self._level = level
        self._since = now
        self._window_start = now
        self._area = 0.0

    def set(self, level: float, now: float) -> None:
        self._area += self._level * max(0.0, now - self._since)
        self._level = level
        self._since = now

    def take(self, now: float) -> float:
        """Mean level since the previous take (or creation); starts a new window."""
        self.set(self._level, now)
        span = now - self._window_start
        mean = self._area / span if span > 0 else self._level
        self._area = 0.0
        self._window_start = now
        return mean

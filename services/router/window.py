"""Time-weighted averages over a metrics window: in-flight requests per replica, queued requests.

How it works: each tracked count is a step function of time. On every change we add the area under
the step since the last change (value x elapsed) to a running integral, so a change costs O(1) plain
float arithmetic on the request path. `roll(now)` closes the window: it adds the area of the last
step for every key at once (numpy over the whole width), divides by the window length, and starts
the next window at `now` with the current values carried over. A window of length zero reports the
current values (an immediate report right after another one still says what is in flight now).

Pure: the caller passes `now` (local monotonic seconds); a `now` that goes backwards counts as no
elapsed time.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np


class TimeWeightedCounts:
    """Per-key time-weighted averages (running requests per replica)."""

    __slots__ = ("_area", "_index", "_keys", "_last", "_value", "_window_start")

    def __init__(self, now: float) -> None:
        self._window_start = now
        self._index: dict[str, int] = {}
        self._keys: list[str] = []
        self._value: list[float] = []
        self._area: list[float] = []
        self._last: list[float] = []

    def add(self, key: str, delta: float, now: float) -> None:
        i = self._index.get(key)
        if i is None:
            i = self._index[key] = len(self._keys)
            self._keys.append(key)
            self._value.append(0.0)
            self._area.append(0.0)
            self._last.append(max(now, self._window_start))
        elapsed = now - self._last[i]
        if elapsed > 0:
            self._area[i] += self._value[i] * elapsed
            self._last[i] = now
        self._value[i] += delta

    def value(self, key: str) -> float:
        i = self._index.get(key)
        return self._value[i] if i is not None else 0.0

    def keys(self) -> tuple[str, ...]:
        return tuple(self._keys)

    def averages(self, now: float) -> dict[str, float]:
        """Averages of the current window up to `now`, without closing it."""
        if not self._keys:
            return {}
        value = np.asarray(self._value, dtype=np.float64)
        last = np.asarray(self._last, dtype=np.float64)
        area = np.asarray(self._area, dtype=np.float64) + value * np.maximum(now - last, 0.0)
        span = now - self._window_start
        avg = area / span if span > 0 else value
        return dict(zip(self._keys, avg.tolist(), strict=True))

    def roll(self, now: float) -> dict[str, float]:
        """Close the window at `now`: return each key's average over it and start the next one."""
        result = self.averages(now)
        n = len(self._keys)
        self._area = [0.0] * n
        self._last = [now] * n
        self._window_start = now
        return result

    def forget_idle(self, keep: Collection[str]) -> None:
        """Stop tracking keys outside `keep` that are at zero with nothing accumulated (a departed
        replica whose last request finished before the window closed)."""
        drop = {
            k
            for k, i in self._index.items()
            if k not in keep and self._value[i] == 0 and self._area[i] == 0
        }
        if not drop:
            return
        kept = [i for k, i in self._index.items() if k not in drop]
        self._keys = [self._keys[i] for i in kept]
        self._value = [self._value[i] for i in kept]
        self._area = [self._area[i] for i in kept]
        self._last = [self._last[i] for i in kept]
        self._index = {k: j for j, k in enumerate(self._keys)}


class TimeWeightedGauge:
    """One time-weighted average (requests queued at a handle)."""

    __slots__ = ("_area", "_last", "_value", "_window_start")

    def __init__(self, now: float) -> None:
        self._window_start = now
        self._last = now
        self._value = 0.0
        self._area = 0.0

    @property
    def value(self) -> float:
        return self._value

    def add(self, delta: float, now: float) -> None:
        elapsed = now - self._last
        if elapsed > 0:
            self._area += self._value * elapsed
            self._last = now
        self._value += delta

    def average(self, now: float) -> float:
        span = now - self._window_start
        if span <= 0:
            return self._value
        return (self._area + self._value * max(now - self._last, 0.0)) / span

    def roll(self, now: float) -> float:
        result = self.average(now)
        self._area = 0.0
        self._last = now
        self._window_start = now
        return result

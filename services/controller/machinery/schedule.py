"""Which deployments a control tick visits: the dirty ones, the busy ones and those whose timer fired.

How it works: a deployment is in one of three places.

- *dirty*: something arrived for it since its last visit (a report, a lifecycle event, a probe
  answer, a new config, a takeover). Visited at the next tick, then placed again.
- *busy*: its last visit left work that moves every tick (replicas starting or draining, a
  rollout, a delay running, stale replicas to probe, a demand window still sliding under a
  policy that reads it). Visited every tick until a visit finds it quiet.
- *sleeping* until a due time: the earliest moment its last visit could come out differently
  with no new input (a replica's health going stale, a silent handle expiring, the last change
  of demand leaving the look-back window, an unhealthy hold running out). A binary heap holds
  the due times; an entry superseded by a later placement is skipped when it surfaces (lazy
  deletion), so placing a deployment is O(log n) and a tick costs O(visited · log n), not
  O(deployments). A deployment with no due time (inf) is not in the heap at all.

`due(now)` returns the keys to visit in a stable order the caller chooses (the order a visit of
every deployment would take), so decisions and their order are those of visiting everyone:
tests/unit/test_schedule_equivalence.py runs the same inputs both ways and compares every action.

`TickLog` keeps the recent tick times: a deployment skipped for some ticks catches up on its first
visit by adding the demand samples those ticks would have added (its demand was constant: nothing
arrived and nothing expired, or it would have been visited).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

K = TypeVar("K", bound=Hashable)

BUSY = -math.inf
"""A due time meaning "visit at every tick"."""
SLEEP = math.inf
"""A due time meaning "only when something arrives"."""


class Schedule(Generic[K]):
    """Dirty set, busy set and a heap of due times (see the module docstring)."""

    __slots__ = ("_busy", "_dirty", "_due", "_heap", "_seq")

    def __init__(self) -> None:
        self._dirty: set[K] = set()
        self._busy: set[K] = set()
        self._due: dict[K, float] = {}
        """The live due time of each sleeping key (heap entries that disagree are stale)."""
        self._heap: list[tuple[float, int, K]] = []
        self._seq = 0

    def touch(self, key: K) -> None:
        """Something arrived for `key`: visit it at the next tick."""
        self._dirty.add(key)

    def touch_all(self, keys: Iterable[K]) -> None:
        self._dirty.update(keys)

    def place(self, key: K, due: float) -> None:
        """After a visit: when `key` needs the next one (BUSY, a time, or SLEEP)."""
        self._dirty.discard(key)
        if due == BUSY:
            self._busy.add(key)
            self._due.pop(key, None)
            return
        self._busy.discard(key)
        if due == SLEEP:
            self._due.pop(key, None)
            return
        if self._due.get(key) == due:
            return
        self._due[key] = due
        self._seq += 1
        heapq.heappush(self._heap, (due, self._seq, key))
        if len(self._heap) > 64 and len(self._heap) > 4 * len(self._due):
            self._compact()

    def replace(self, key: K, due: float) -> None:
        """An input moved a sleeping `key`'s next visit to `due`, earlier or later; a dirty or
        busy key keeps its claim (its visit places it anew)."""
        if key in self._dirty or key in self._busy:
            return
        self.place(key, due)

    def forget(self, key: K) -> None:
        self._dirty.discard(key)
        self._busy.discard(key)
        self._due.pop(key, None)

    def due(self, now: float) -> set[K]:
        """Keys to visit at `now`: dirty, busy, and sleeping ones whose time has come (these
        leave the heap; the visit places them again)."""
        return self._dirty | self._busy | self.fired(now)

    def fired(self, now: float) -> set[K]:
        """The sleeping keys whose time has come (they leave the heap)."""
        out: set[K] = set()
        heap = self._heap
        while heap and heap[0][0] <= now:
            t, _, key = heapq.heappop(heap)
            if self._due.get(key) == t:
                del self._due[key]
                out.add(key)
        return out

    def pending(self) -> set[K]:
        """Dirty and busy keys (visited at the next tick whatever the time)."""
        return self._dirty | self._busy

    def next_due(self) -> float:
        """The earliest sleeping due time (SLEEP when none); for tests and benchmarks."""
        while self._heap and self._due.get(self._heap[0][2]) != self._heap[0][0]:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else SLEEP

    def __len__(self) -> int:
        """Keys with any claim on a future visit."""
        return len(self._dirty | self._busy | self._due.keys())

    def _compact(self) -> None:
        live = [(t, s, k) for t, s, k in self._heap if self._due.get(k) == t]
        heapq.heapify(live)
        self._heap = live


FloatArray = npt.NDArray[np.float64]


class TickLog:
    """Recent control-tick times, enough for any deployment to catch up its demand window.

    Keeps every tick within `horizon_s` of the newest plus the newest one before that (a window
    of `horizon_s` still sees that sample's hold, as `DemandWindow.trim` keeps it)."""

    __slots__ = ("_head", "_t", "_tail", "_widest", "horizon_s")

    def __init__(self, horizon_s: float = 0.0) -> None:
        self.horizon_s = horizon_s
        self._t: FloatArray = np.empty(1024, dtype=np.float64)
        self._head = 0
        self._tail = 0
        self._widest = 0.0
        """At least the widest gap between two kept ticks (narrowed again when looked at)."""

    def add(self, t: float) -> None:
        if self._tail == self._t.shape[0]:
            live = self._tail - self._head
            keep = self._t[self._head : self._tail]
            if live * 2 > self._t.shape[0]:
                grown = np.empty(self._t.shape[0] * 2, dtype=np.float64)
                grown[:live] = keep
                self._t = grown
            else:
                self._t[:live] = keep
            self._head, self._tail = 0, live
        if self._tail > self._head:
            self._widest = max(self._widest, t - float(self._t[self._tail - 1]))
        self._t[self._tail] = t
        self._tail += 1
        live_t = self._t[self._head : self._tail]
        first = int(live_t.searchsorted(t - self.horizon_s, side="right")) - 1
        if first > 0:
            self._head += first

    def since(self, after: float, keep_s: float) -> FloatArray:
        """Tick times after `after` that a window trimmed to `keep_s` at the newest tick still
        holds: those after `newest - keep_s`, and the newest at or before it."""
        live = self._t[self._head : self._tail]
        lo = int(live.searchsorted(after, side="right"))
        if lo >= live.shape[0]:
            return live[0:0]
        edge = int(live.searchsorted(float(live[-1]) - keep_s, side="right")) - 1
        return live[max(lo, edge) :]

    def gap_over(self, ticks: FloatArray, gap_s: float) -> bool:
        """Whether two consecutive ones of `ticks` (a slice `since` gave) are more than `gap_s`
        apart; without a look at them while no kept gap is that wide (the usual case)."""
        if self._widest <= gap_s:
            return False
        live = self._t[self._head : self._tail]
        self._widest = float(np.diff(live).max()) if live.shape[0] > 1 else 0.0
        return self._widest > gap_s and bool((np.diff(ticks) > gap_s).any())

    @property
    def last(self) -> float | None:
        return float(self._t[self._tail - 1]) if self._tail > self._head else None

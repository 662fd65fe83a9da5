"""One deployment's total-demand time series, answering time-weighted means over recent windows.

How it works: the controller appends `(monotonic time, demand)` samples at its control-loop tick
(or in bulk when it rebuilds a window from the retained report stream). The series is a step
function: each sample holds its value until the next sample, and the last one until the query's
`now`, but no sample vouches for more than `max_gap_s` after its own time. Time that no sample
vouches for is *not covered*: after a controller outage or a failover the window has a hole, and
`coverage` says so instead of the hole silently reading as zero load (missing data is not zero
load; the policy refuses to scale down until a window is fully covered).

`mean(now, period)` is the integral of the covered step function over `[now - period, now]`
divided by the covered time; a sample older than the window start still counts for the part of
its hold that reaches into the window. A sample at the same time as an earlier one supersedes it
(the earlier one holds for zero time).

A rise opens the window at its onset (`rise_above=level`, the demand the current target serves):
when the newest sample is above the level, the mean covers only the trailing run of samples above
it, so the idle time before a step in load does not dilute the step (averaging zeros from before
the step made a 0 -> 8 step look like 3 for most of a 5 s window and cost a second delay). A run
that started before the window is the whole window; a rise that has not held yet because its
only sample is at `now` (the first tick of a step) reads as that sample. When the newest sample
is at or below the level the mean is over the whole window, so a fall is judged on the full
look-back period as before. Coverage (`is_full`) is always that of the whole window.

Storage is two float64 arrays used as a sliding buffer: `add` writes at the tail, growing by
doubling or compacting when `trim` has moved the head far enough; queries take the live slice,
find the window with `searchsorted` and integrate the clipped segments in numpy, so a query costs
O(log n + samples in the window) with no Python loop per sample.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from shared.appconfig import AutoscalingConfig
from shared.errors import UsageError

from .policy import rise_level

# Ray Serve's default metrics interval; a window without a sample for two intervals has lost data.
DEFAULT_MAX_GAP_S = 2 * 10.0
_INITIAL_CAPACITY = 256
# Coverage is a sum of float segment lengths; a window that is full up to rounding is full.
FULL_TOLERANCE_S = 1e-6

FloatArray = npt.NDArray[np.float64]


class DemandWindow:
    """Time-weighted demand samples for one deployment (see the module docstring)."""

    __slots__ = ("_head", "_max_gap_s", "_t", "_tail", "_v")

    def __init__(
        self, max_gap_s: float = DEFAULT_MAX_GAP_S, *, capacity: int = _INITIAL_CAPACITY
    ) -> None:
        if not (math.isfinite(max_gap_s) and max_gap_s > 0):
            raise UsageError(f"max_gap_s must be a positive number, got {max_gap_s!r}")
        capacity = max(1, capacity)
        self._max_gap_s = float(max_gap_s)
        self._t: FloatArray = np.empty(capacity, dtype=np.float64)
        self._v: FloatArray = np.empty(capacity, dtype=np.float64)
        self._head = 0
        self._tail = 0

    @classmethod
    def for_policy(cls, cfg: AutoscalingConfig) -> DemandWindow:
        """A window whose gap limit is two of the deployment's metrics intervals."""
        return cls(max_gap_s=2 * cfg.metrics_interval_s)

    @property
    def max_gap_s(self) -> float:
        return self._max_gap_s

    def __len__(self) -> int:
        return self._tail - self._head

    @property
    def last_time(self) -> float | None:
        return float(self._t[self._tail - 1]) if self._tail > self._head else None

    @property
    def last_value(self) -> float | None:
        return float(self._v[self._tail - 1]) if self._tail > self._head else None

    # -- writing ---------------------------------------------------------------------------

    def add(self, t_mono: float, demand: float) -> None:
        """Append one sample; `t_mono` must not be earlier than the last sample's time."""
        if not math.isfinite(t_mono):
            raise UsageError(f"sample time must be finite, got {t_mono!r}")
        if not (math.isfinite(demand) and demand >= 0):
            raise UsageError(f"demand must be a finite number >= 0, got {demand!r}")
        last = self.last_time
        if last is not None and t_mono < last:
            raise UsageError(f"sample time {t_mono!r} is before the last sample's {last!r}")
        self._reserve(1)
        self._t[self._tail] = t_mono
        self._v[self._tail] = demand
        self._tail += 1

    def add_many(
        self, ts: Sequence[float] | FloatArray, values: Sequence[float] | FloatArray
    ) -> None:
        """Append samples in bulk (rebuilding from a replayed stream); same rules as `add`.

        Validates everything before appending anything, so a bad batch leaves the window as it was.
        """
        t = np.asarray(ts, dtype=np.float64)
        v = np.asarray(values, dtype=np.float64)
        if t.ndim != 1 or v.shape != t.shape:
            raise UsageError(f"ts and values must be 1-D of equal length, got {t.shape} {v.shape}")
        n = t.shape[0]
        if n == 0:
            return
        if not bool(np.isfinite(t).all()):
            raise UsageError("sample times must be finite")
        if not bool((np.isfinite(v) & (v >= 0)).all()):
            raise UsageError("demand must be finite numbers >= 0")
        if n > 1 and bool((np.diff(t) < 0).any()):
            raise UsageError("sample times must be non-decreasing")
        self._append(t, v)

    def extend_constant(self, ts: FloatArray, value: float) -> None:
        """Append `value` at each of the increasing tick times `ts` (a skipped deployment catching
        up on the ticks it missed): `add_many` without its checks of every element, which cost
        more than the append at one catch-up per report."""
        n = ts.shape[0]
        if n == 0:
            return
        if not (math.isfinite(value) and value >= 0):
            raise UsageError(f"demand must be a finite number >= 0, got {value!r}")
        self._append(ts, value)

    def _append(self, t: FloatArray, v: FloatArray | float) -> None:
        n = t.shape[0]
        last = self.last_time
        if last is not None and t[0] < last:
            raise UsageError(f"sample time {float(t[0])!r} is before the last sample's {last!r}")
        self._reserve(n)
        self._t[self._tail : self._tail + n] = t
        self._v[self._tail : self._tail + n] = v
        self._tail += n

    def trim(self, now: float, keep_s: float) -> None:
        """Drop samples no window of at most `keep_s` ending at `now` or later can see.

        The newest sample at or before `now - keep_s` is kept: its hold reaches into such windows.
        """
        if not (math.isfinite(keep_s) and keep_s >= 0):
            raise UsageError(f"keep_s must be a finite number >= 0, got {keep_s!r}")
        live = self._t[self._head : self._tail]
        first_needed = int(live.searchsorted(now - keep_s, side="right")) - 1
        if first_needed > 0:
            self._head += first_needed
        if self._head == self._tail:
            self._head = self._tail = 0

    def clear(self) -> None:
        self._head = self._tail = 0

    def _reserve(self, n: int) -> None:
        capacity = self._t.shape[0]
        if self._tail + n <= capacity:
            return
        live = self._tail - self._head
        needed = live + n
        if needed * 2 <= capacity:
            # Compacting is O(live) and only happens after trim freed at least half the buffer,
            # so appends stay O(1) amortised without the buffer growing.
            self._t[:live] = self._t[self._head : self._tail]
            self._v[:live] = self._v[self._head : self._tail]
        else:
            new_capacity = max(capacity * 2, needed * 2)
            t = np.empty(new_capacity, dtype=np.float64)
            v = np.empty(new_capacity, dtype=np.float64)
            t[:live] = self._t[self._head : self._tail]
            v[:live] = self._v[self._head : self._tail]
            self._t, self._v = t, v
        self._head, self._tail = 0, live

    # -- reading ---------------------------------------------------------------------------

    def mean(self, now: float, period_s: float, *, rise_above: float | None = None) -> float | None:
        """Time-weighted mean demand over the covered part of `[now - period_s, now]`, from
        the onset of a rise above `rise_above` when there is one (module docstring).

        None when no time in the window is covered (no data: never read that as zero load).
        """
        seg = self._segments(now, period_s)
        if seg is None:
            return None
        return _mean(*seg, now, rise_above)

    def mean_and_full(
        self, now: float, period_s: float, *, rise_above: float | None = None
    ) -> tuple[float | None, bool]:
        """`mean(now, period_s, rise_above=...)` and `is_full(now, period_s)` from one scan."""
        seg = self._segments(now, period_s)
        if seg is None:
            return None, False
        covered = float(seg[0].sum())
        return _mean(*seg, now, rise_above), covered >= period_s - FULL_TOLERANCE_S

    def policy_demand(
        self, cfg: AutoscalingConfig, target: int, now: float
    ) -> tuple[float | None, float | None, bool]:
        """What the policy reads at `target`: the look-back mean, the panic-window mean (only
        in panic mode, else None), both from the onset of a rise above what `target` serves,
        and whether the look-back window is full."""
        rise = rise_level(cfg, target)
        mean, full = self.mean_and_full(now, cfg.look_back_period_s, rise_above=rise)
        short = self.mean(now, cfg.panic_window_s, rise_above=rise) if cfg.panic_mode else None
        return mean, short, full

    def coverage(self, now: float, period_s: float) -> float:
        """Seconds of `[now - period_s, now]` covered by data."""
        seg = self._segments(now, period_s)
        return 0.0 if seg is None else float(seg[0].sum())

    def is_full(self, now: float, period_s: float) -> bool:
        """Whether the whole window `[now - period_s, now]` is covered (up to float rounding)."""
        return self.coverage(now, period_s) >= period_s - FULL_TOLERANCE_S

    def _segments(self, now: float, period_s: float) -> tuple[FloatArray, FloatArray, float] | None:
        """(durations, values, time of the newest sample) of the window, or None if empty."""
        if not (math.isfinite(period_s) and period_s > 0):
            raise UsageError(f"period_s must be a positive number, got {period_s!r}")
        if not math.isfinite(now):
            raise UsageError(f"now must be finite, got {now!r}")
        start = now - period_s
        live_t = self._t[self._head : self._tail]
        # The newest sample at or before the window start holds into it; samples after `now`
        # are in the query's future and do not count.
        lo = max(int(live_t.searchsorted(start, side="right")) - 1, 0)
        hi = int(live_t.searchsorted(now, side="right"))
        if hi <= lo:
            return None
        t = live_t[lo:hi]
        ends = np.empty_like(t)
        ends[:-1] = t[1:]
        ends[-1] = now
        np.minimum(ends, t + self._max_gap_s, out=ends)
        durations = np.clip(ends - np.maximum(t, start), 0.0, None)
        return durations, self._v[self._head + lo : self._head + hi], float(t[-1])


def _mean(
    durations: FloatArray, values: FloatArray, newest_t: float, now: float, rise_above: float | None
) -> float | None:
    if rise_above is not None and values[-1] > rise_above:
        at_or_below = np.flatnonzero(values <= rise_above)
        onset = int(at_or_below[-1]) + 1 if at_or_below.size else 0
        durations, values = durations[onset:], values[onset:]
        if float(durations.sum()) <= 0:
            # a fresh sample at `now` is data; one that a gap has made stale is not
            return float(values[-1]) if newest_t >= now else None
    covered = float(durations.sum())
    if covered <= 0:
        return None
    return float(np.dot(durations, values)) / covered

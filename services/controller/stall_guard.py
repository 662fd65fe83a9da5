"""The systemic stall guard and the probe limiter: a controller that is behind must not act on it.

How it works:

- `StallGuard.tick` runs once per control tick with what the shell can measure: ingest lag (the
  JetStream consumer's pending count and/or how many seconds behind it is; either may be missing),
  the fleet-wide number of stale replicas out of those expected to report (summed over every
  deployment's `HealthEvaluation`), and whether the control loop overran its interval. Any trigger
  enters the stall at once; the guard leaves only after a calm period (`calm_s`, about one
  freshness window) with no trigger at all, so a lag that hovers at its threshold does not flap.
  Mass staleness needs both a share (`max_stale_share`) and a count (`min_stale_replicas`), so
  two silent replicas of a five-replica fleet are an ordinary probe, not a stall. A single overrun
  (a GC pause) is not a stall: `overrun_ticks` in a row are.
- While stalled, verdicts from absences are held (see `HealthRegistry.evaluate(hold_verdicts=)`)
  and probes are capped to the stalled rate. Holding forever would hide a real mass failure (a
  zone outage also looks like mass staleness), so when the only trigger left has been mass
  staleness for `max_hold_s` (the controller's own input calm for `calm_s`), the hold expires:
  the probe cap stays, so verdicts then arrive at the capped probe rate, not all at once. Any
  controller-side trigger (lag, overrun) resumes the hold.
- The guard returns `StallEvent`s (entered / left / hold_expired / hold_resumed, with reasons) for
  the shell to log once and count; it never logs itself.
- `ProbeLimiter` picks which stale replicas get a pull probe this tick: a token bucket (normal or
  stalled rate, burst-capped, so a burst of 10,000 stale replicas yields at most the bucket), at
  most one outstanding probe per replica (until `done`, or `outstanding_ttl_s` if the shell never
  says), and no re-probe within `reprobe_after_s` (one freshness window) of the last send. The
  order is the caller's staleness order (most overdue first), ties kept in input order, so the
  choice is deterministic.

Pure: no clock, no I/O; every call takes `now` (local monotonic seconds).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from shared.errors import ConfigError, UsageError

K = TypeVar("K", bound=Hashable)

_TOKEN_EPSILON: Final = 1e-9


class StallReason(enum.StrEnum):
    INGEST_PENDING = "ingest_pending"
    INGEST_LAG = "ingest_lag"
    MASS_STALENESS = "mass_staleness"
    LOOP_OVERRUN = "loop_overrun"


CONTROLLER_SIDE: Final = frozenset(
    {StallReason.INGEST_PENDING, StallReason.INGEST_LAG, StallReason.LOOP_OVERRUN}
)
"""Triggers that say the controller's own view is behind (so the hold never expires on them)."""


class StallEventKind(enum.StrEnum):
    ENTERED = "entered"
    LEFT = "left"
    HOLD_EXPIRED = "hold_expired"
    HOLD_RESUMED = "hold_resumed"


@dataclass(frozen=True, slots=True)
class StallThresholds:
    max_pending: int | None = 10_000
    """Consumer messages pending above which the controller is behind (None: not used)."""
    max_lag_s: float | None = 5.0
    """Seconds behind the stream head above which the controller is behind (None: not used)."""
    max_stale_share: float = 0.3
    min_stale_replicas: int = 10
    overrun_ticks: int = 3
    calm_s: float = 15.0
    """Trigger-free time before leaving a stall: set it to the largest freshness window."""
    max_hold_s: float | None = 300.0
    """How long mass staleness alone may hold verdicts (None: forever)."""

    def __post_init__(self) -> None:
        src = "stall_guard"
        if self.max_pending is not None and self.max_pending < 0:
            raise ConfigError("must be >= 0", source=src, field="max_pending")
        if self.max_lag_s is not None and not self.max_lag_s >= 0:
            raise ConfigError("must be >= 0", source=src, field="max_lag_s")
        if not 0 < self.max_stale_share <= 1:
            raise ConfigError("must be in (0, 1]", source=src, field="max_stale_share")
        if self.min_stale_replicas < 1:
            raise ConfigError("must be >= 1", source=src, field="min_stale_replicas")
        if self.overrun_ticks < 1:
            raise ConfigError("must be >= 1", source=src, field="overrun_ticks")
        if not self.calm_s >= 0:
            raise ConfigError("must be >= 0", source=src, field="calm_s")
        if self.max_hold_s is not None and not self.max_hold_s > 0:
            raise ConfigError("must be > 0", source=src, field="max_hold_s")


@dataclass(frozen=True, slots=True)
class StallEvent:
    kind: StallEventKind
    at: float
    reasons: tuple[StallReason, ...]
    """Triggers active at `at`; for LEFT, the reason the stall was entered with."""
    stalled_for_s: float


@dataclass(frozen=True, slots=True)
class StallState:
    stalled: bool
    hold_verdicts: bool
    reason: StallReason | None
    """Why the current stall was entered (None when not stalled)."""
    triggers: tuple[StallReason, ...]
    """Triggers active at this tick."""
    events: tuple[StallEvent, ...]

    @property
    def cap_probes(self) -> bool:
        return self.stalled


class StallGuard:
    __slots__ = (
        "_entered_at",
        "_hold_expired",
        "_last_controller_trigger",
        "_last_trigger",
        "_overruns",
        "_reason",
        "thresholds",
    )

    def __init__(self, thresholds: StallThresholds | None = None) -> None:
        self.thresholds = thresholds or StallThresholds()
        self._entered_at: float | None = None
        self._reason: StallReason | None = None
        self._last_trigger = -math.inf
        self._last_controller_trigger = -math.inf
        self._overruns = 0
        self._hold_expired = False

    @property
    def stalled(self) -> bool:
        return self._entered_at is not None

    @property
    def hold_verdicts(self) -> bool:
        return self.stalled and not self._hold_expired

    def triggers(
        self, *, pending: int | None, lag_s: float | None, stale: int, known: int, overruns: int
    ) -> tuple[StallReason, ...]:
        t = self.thresholds
        found: list[StallReason] = []
        if pending is not None and t.max_pending is not None and pending > t.max_pending:
            found.append(StallReason.INGEST_PENDING)
        if lag_s is not None and t.max_lag_s is not None and lag_s > t.max_lag_s:
            found.append(StallReason.INGEST_LAG)
        if known > 0 and stale >= t.min_stale_replicas and stale > t.max_stale_share * known:
            found.append(StallReason.MASS_STALENESS)
        if overruns >= t.overrun_ticks:
            found.append(StallReason.LOOP_OVERRUN)
        return tuple(found)

    def tick(
        self,
        now: float,
        *,
        pending: int | None = None,
        lag_s: float | None = None,
        stale: int = 0,
        known: int = 0,
        overrun: bool = False,
    ) -> StallState:
        """Feed one control tick's measurements. `stale`/`known`: fleet-wide stale replicas and
        replicas expected to report (`HealthEvaluation.stale` / `.candidates`, summed)."""
        if stale < 0 or known < 0 or stale > known:
            raise UsageError(f"stall guard: need 0 <= stale <= known, got {stale}/{known}")
        self._overruns = self._overruns + 1 if overrun else 0
        found = self.triggers(
            pending=pending, lag_s=lag_s, stale=stale, known=known, overruns=self._overruns
        )
        if found:
            self._last_trigger = now
        controller_side = any(r in CONTROLLER_SIDE for r in found)
        if controller_side:
            self._last_controller_trigger = now
        events: list[StallEvent] = []
        if self._entered_at is None:
            if found:
                self._entered_at = now
                self._reason = found[0]
                events.append(StallEvent(StallEventKind.ENTERED, now, found, 0.0))
        else:
            stalled_for = now - self._entered_at
            if not found and now - self._last_trigger >= self.thresholds.calm_s:
                assert self._reason is not None
                events.append(StallEvent(StallEventKind.LEFT, now, (self._reason,), stalled_for))
                self._entered_at = None
                self._reason = None
                self._hold_expired = False
            else:
                events.extend(self._hold_step(now, stalled_for, found, controller_side))
        return StallState(
            stalled=self.stalled,
            hold_verdicts=self.hold_verdicts,
            reason=self._reason,
            triggers=found,
            events=tuple(events),
        )

    def _hold_step(
        self, now: float, stalled_for: float, found: tuple[StallReason, ...], controller_side: bool
    ) -> list[StallEvent]:
        max_hold = self.thresholds.max_hold_s
        if self._hold_expired:
            if controller_side:
                self._hold_expired = False
                return [StallEvent(StallEventKind.HOLD_RESUMED, now, found, stalled_for)]
            return []
        controller_calm = now - self._last_controller_trigger >= self.thresholds.calm_s
        if max_hold is not None and stalled_for >= max_hold and controller_calm:
            self._hold_expired = True
            return [StallEvent(StallEventKind.HOLD_EXPIRED, now, found, stalled_for)]
        return []


# -- probes ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProbeLimits:
    rate_per_s: float = 200.0
    burst: float = 200.0
    stalled_rate_per_s: float = 10.0
    stalled_burst: float = 10.0
    reprobe_after_s: float = 15.0
    """No second probe to one replica within this long of the last (one freshness window)."""
    outstanding_ttl_s: float = 60.0
    """An outstanding probe the shell never reported `done` is forgotten after this long."""

    def __post_init__(self) -> None:
        for name in ("rate_per_s", "stalled_rate_per_s", "reprobe_after_s", "outstanding_ttl_s"):
            if not getattr(self, name) >= 0:
                raise ConfigError("must be >= 0", source="probe_limits", field=name)
        for name in ("burst", "stalled_burst"):
            if not getattr(self, name) >= 1:
                raise ConfigError("must be >= 1", source="probe_limits", field=name)


class ProbeLimiter(Generic[K]):
    """Keys are whatever names a replica fleet-wide (the replica id, or (deployment, slot))."""

    __slots__ = ("_last_refill", "_last_sent", "_outstanding", "_tokens", "limits")

    def __init__(self, limits: ProbeLimits | None = None) -> None:
        self.limits = limits or ProbeLimits()
        self._tokens = self.limits.burst
        self._last_refill: float | None = None
        # both dicts are in send order (a key is popped before it is set again), so expiry pops
        # from the front instead of scanning
        self._outstanding: dict[K, float] = {}
        self._last_sent: dict[K, float] = {}

    @property
    def outstanding(self) -> int:
        return len(self._outstanding)

    def is_outstanding(self, key: K) -> bool:
        return key in self._outstanding

    def tokens(self, now: float, stalled: bool) -> float:
        """Probes the bucket allows right now (refilling it up to `now`)."""
        lim = self.limits
        rate, cap = (
            (lim.stalled_rate_per_s, lim.stalled_burst) if stalled else (lim.rate_per_s, lim.burst)
        )
        if self._last_refill is not None and now > self._last_refill:
            self._tokens += (now - self._last_refill) * rate
        if self._last_refill is None or now > self._last_refill:
            self._last_refill = now
        self._tokens = min(self._tokens, cap)
        return self._tokens

    def candidate_limit(self, now: float, stalled: bool) -> int:
        """The most candidates `select(..., now, stalled)` can look at: its budget plus every key
        it would skip (outstanding or probed recently). A caller need not build more than this
        many, which keeps a tick cheap when thousands of replicas are stale at once."""
        budget = math.floor(self.tokens(now, stalled) + _TOKEN_EPSILON)
        return max(0, budget) + len(self._outstanding) + len(self._last_sent)

    def select(
        self,
        candidates: Sequence[K],
        now: float,
        stalled: bool,
        *,
        stale_since: npt.ArrayLike | None = None,
    ) -> list[K]:
        """Choose the stale replicas to probe now and mark them outstanding.

        `candidates` in priority order, or with `stale_since` (parallel; earliest first wins,
        ties in input order). Repeated keys are probed once.
        """
        self._expire(now)
        # the epsilon keeps 0.2 s x 10/s from flooring to 1 (float refill sums)
        budget = math.floor(self.tokens(now, stalled) + _TOKEN_EPSILON)
        if budget <= 0 or not candidates:
            return []
        if stale_since is None:
            order: Sequence[int] | npt.NDArray[np.intp] = range(len(candidates))
        else:
            since = np.asarray(stale_since, dtype=np.float64)
            if since.shape != (len(candidates),):
                raise UsageError("select: stale_since must be parallel to candidates")
            order = np.argsort(since, kind="stable")
        chosen: list[K] = []
        outstanding, last_sent = self._outstanding, self._last_sent
        for i in order:
            key = candidates[int(i)]
            if key in outstanding or key in last_sent:
                continue
            outstanding[key] = now
            last_sent[key] = now
            chosen.append(key)
            if len(chosen) >= budget:
                break
        self._tokens -= len(chosen)
        return chosen

    def done(self, key: K) -> None:
        """The probe to `key` ended (answered, timed out or no responders)."""
        self._outstanding.pop(key, None)

    def forget(self, key: K) -> None:
        """The replica was removed: drop everything about it."""
        self._outstanding.pop(key, None)
        self._last_sent.pop(key, None)

    def _expire(self, now: float) -> None:
        _pop_older(self._outstanding, now - self.limits.outstanding_ttl_s)
        _pop_older(self._last_sent, now - self.limits.reprobe_after_s)


def _pop_older(d: dict[K, float], horizon: float) -> None:
    """Drop entries stamped at or before `horizon` from the front of an insertion-ordered dict."""
    while d:
        key, at = next(iter(d.items()))
        if at > horizon:
            return
        del d[key]

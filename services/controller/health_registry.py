"""The controller's health registry for one deployment: newest health per replica, staleness, verdicts.

How it works: per-replica facts live in numpy arrays indexed by the deployment's `ReplicaIndex`
slots (the same slots the metrics store uses), so a columnar handle report merges with one sort and
a few fancy indexes, never a Python loop per row. Every channel that carries a `HealthStatus`
(handle reports, replica reports, heartbeats, probe answers) is offered here.

- Ordering: the entry with the newest `checked_at` (the replica's own clock) wins; an older or
  equal one is ignored, so out-of-order delivery resolves itself. Duplicate slots in one batch
  collapse to their newest row (the first of equals) before the merge.
- Freshness is judged only by controller receipt time (`recv`, local monotonic seconds), never by
  `checked_at`: a replica whose wall clock is hours off is judged exactly like any other. An
  accepted entry makes the replica fresh until `recv + stale_after_s` (a first report ends the
  startup grace).
- Direct vs relayed channels. A *direct* message (the replica's own report, a heartbeat, a probe
  answer) was sent by the replica just now, so receiving the SAME `checked_at` again refreshes
  receipt time (a replica whose check is slow re-sends its latest status on heartbeats and probe
  answers, and must not look stale for it). A *relayed* entry (a router's handle report) with an
  equal `checked_at` is ignored: routers re-send the entries they hold for up to 30 s after they
  got them, so a repeat proves nothing about the replica now, and a dead replica would look fresh
  for half a minute. Also, once the held entry is stale, a direct entry is accepted even if its
  `checked_at` is older: the replica's wall clock stepped back, and what it says now is the truth.
- Staleness: `stale_after_s` = the freshness window `max(1.5 x period, 1 s)` plus a small slack
  (the replica heartbeats only once a whole window passed without carriage, checked on a tick of up
  to 1 s, so receipt gaps of an idle healthy replica run slightly over the window; without slack
  every idle replica would flap stale and be probed once a window). A relayed entry is late by
  construction: the router holds it until its next report, up to one metrics interval after the
  replica's check went out, so a replica whose health only rides on handle reports sees receipt
  gaps of up to a period (+10% jitter) plus one report interval; an entry refreshed by a relayed
  channel therefore stays fresh `relay_slack_s` (the deployment's metrics interval) longer, or
  about one replica in a hundred would be probed every period at a 10 s interval
  (docs/benchmarks.md, "Fleet scale"). A replica just added gets a
  startup grace (`health_check_period_s + health_check_timeout_s` by default) before it counts
  stale. Stale replicas need a pull probe; `evaluate` lists them, most overdue first.
- Verdicts (unhealthy -> replace), issued once per replica and kept until it is removed. Facts:
  exited (`mark_exited`) and the replica's own `consecutive_failures >= failure_threshold`.
  Absences: `probe_timeout_limit` consecutive probe timeouts, and gone (a probe found no
  responders: the replica's connection is gone). With `hold_verdicts` (the stall guard says the
  controller is behind) absences issue no verdict, while facts still do. Probe timeouts seen
  while held are discarded, not saved up for a burst when the hold ends; gone is kept, because
  during a bus outage replicas resubscribe at different times and the calm period before a stall
  ends gives every live one a window to report (any accepted entry clears gone and timeouts). A
  replica never heard from (maybe still loading its model) with no responders counts a probe
  timeout, not gone.

Cost: `evaluate` runs every control tick for every deployment, and in a steady fleet it finds
nothing: no replica stale, no new verdict. So the registry keeps what it needs to know that
without looking: a counter of changes that could create a verdict (a failure count reaching the
threshold, an exit, a probe that failed, a membership change), a lower bound on the earliest
`fresh_until` of the open replicas (lowered by every observation, recomputed by each full
evaluation), and the counts the evaluation reports. While no such change happened and `now` has
not reached the bound, `evaluate` returns the same empty result without touching the arrays
(a test checks it against the full evaluation over random histories).

Pure: no clock, no I/O, no logging. Membership follows the index: every entry point first syncs
with it (cheap when `index.version` is unchanged; one pass over the slots when it changed).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Final, TypeVar

import numpy as np
import numpy.typing as npt

from shared.errors import ConfigError, UsageError
from shared.freshness import freshness_window
from shared.wire.messages import HealthStatus

from .machinery.tiny import FEW, all_set, any_set, highest, lowest
from .replica_index import NO_SLOT, ReplicaIndex

DEFAULT_FAILURE_THRESHOLD: Final = 3
DEFAULT_PROBE_TIMEOUT_LIMIT: Final = 3
MAX_STALE_SLACK_S: Final = 2.0
"""Slack over the freshness window: the replica's heartbeat tick (at most 1 s) plus transport."""

_NEVER: Final = -math.inf
_NO_REASONS: Final = np.zeros(0, dtype=np.int8)
_NO_REASONS.setflags(write=False)
_NO_SLOTS: Final = np.zeros(0, dtype=np.int64)
_NO_SLOTS.setflags(write=False)
_NO_TIMES: Final = np.zeros(0, dtype=np.float64)
_NO_TIMES.setflags(write=False)
_T = TypeVar("_T", bound=np.generic)

Int64Array = npt.NDArray[np.int64]
Int8Array = npt.NDArray[np.int8]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


def default_stale_slack(window_s: float) -> float:
    return min(MAX_STALE_SLACK_S, window_s / 2)


class ProbeOutcome(enum.Enum):
    ANSWERED = "answered"
    TIMEOUT = "timeout"
    NO_RESPONDERS = "no_responders"


class VerdictReason(enum.IntEnum):
    EXITED = 1
    GONE = 2
    FAILURES = 3
    PROBE_TIMEOUTS = 4
    NEVER_REPORTED = 5

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, slots=True)
class HealthEvaluation:
    """One `evaluate` result. Slots index the deployment's ReplicaIndex."""

    stale_slots: Int64Array
    """Live, uncondemned replicas with no fresh push, most overdue first (ties by slot)."""
    stale_since: FloatArray
    """When each stale slot went stale (local monotonic), parallel to `stale_slots`."""
    unhealthy_slots: Int64Array
    """NEW verdicts of this evaluation only."""
    unhealthy_reasons: Int8Array
    """`VerdictReason` values parallel to `unhealthy_slots`."""
    live: int
    stale: int
    unreported: int
    condemned: int
    """Replicas holding a verdict (including the new ones)."""
    held: int
    """Verdicts withheld by `hold_verdicts` this evaluation."""

    @property
    def candidates(self) -> int:
        """Replicas expected to report: live and not condemned (the stale share's denominator)."""
        return self.live - self.condemned

    @property
    def stale_share(self) -> float:
        n = self.candidates
        return self.stale / n if n > 0 else 0.0


@dataclass(frozen=True, slots=True)
class ReplicaHealth:
    """What the registry holds about one replica (for status output and tests)."""

    slot: int
    replica_id: str
    healthy: bool | None
    checked_at: float | None
    consecutive_failures: int
    received_at: float | None
    fresh_until: float
    exited: bool
    gone: bool
    probe_timeouts: int
    condemned: bool


def _grown(arr: npt.NDArray[_T], size: int, fill: object) -> npt.NDArray[_T]:
    out: npt.NDArray[_T] = np.full(size, fill, dtype=arr.dtype)
    out[: len(arr)] = arr
    return out


class HealthRegistry:
    __slots__ = (
        "_checked",
        "_condemned",
        "_counts",
        "_evaluated_facts",
        "_exited",
        "_facts",
        "_failures",
        "_fresh_until",
        "_gone",
        "_healthy",
        "_ids",
        "_index",
        "_live",
        "_probe_timeouts",
        "_recv",
        "_stale_floor",
        "_synced_version",
        "failure_threshold",
        "fast_path",
        "freshness_s",
        "probe_timeout_limit",
        "relay_slack_s",
        "stale_after_s",
        "startup_grace_s",
    )

    def __init__(
        self,
        index: ReplicaIndex,
        health_check_period_s: float,
        health_check_timeout_s: float,
        failure_threshold: int = DEFAULT_FAILURE_THRESHOLD,
        *,
        probe_timeout_limit: int = DEFAULT_PROBE_TIMEOUT_LIMIT,
        stale_slack_s: float | None = None,
        startup_grace_s: float | None = None,
        relay_slack_s: float = 0.0,
    ) -> None:
        if not health_check_period_s > 0 or not health_check_timeout_s > 0:
            raise ConfigError("health check period and timeout must be > 0", field="health_check")
        if failure_threshold < 1 or probe_timeout_limit < 1:
            raise ConfigError("failure threshold and probe timeout limit must be >= 1")
        self._index = index
        self.failure_threshold = failure_threshold
        self.probe_timeout_limit = probe_timeout_limit
        self.freshness_s = freshness_window(health_check_period_s)
        slack = default_stale_slack(self.freshness_s) if stale_slack_s is None else stale_slack_s
        if slack < 0:
            raise ConfigError("stale slack must be >= 0", field="stale_slack_s")
        if not relay_slack_s >= 0:
            raise ConfigError("relay slack must be >= 0", field="relay_slack_s")
        self.relay_slack_s = relay_slack_s
        self.stale_after_s = self.freshness_s + slack
        self.startup_grace_s = (
            health_check_period_s + health_check_timeout_s
            if startup_grace_s is None
            else startup_grace_s
        )
        self._ids: list[str | None] = []
        self._live: BoolArray = np.zeros(0, dtype=np.bool_)
        self._checked: FloatArray = np.zeros(0, dtype=np.float64)
        self._healthy: BoolArray = np.zeros(0, dtype=np.bool_)
        self._failures = np.zeros(0, dtype=np.int32)
        self._recv: FloatArray = np.zeros(0, dtype=np.float64)
        self._fresh_until: FloatArray = np.zeros(0, dtype=np.float64)
        self._exited: BoolArray = np.zeros(0, dtype=np.bool_)
        self._gone: BoolArray = np.zeros(0, dtype=np.bool_)
        self._probe_timeouts = np.zeros(0, dtype=np.int32)
        self._condemned: BoolArray = np.zeros(0, dtype=np.bool_)
        self._synced_version = -1
        self._facts = 0
        """Bumped by every change that could make an open replica due a verdict."""
        self._evaluated_facts = -1
        """`_facts` at the last full, unheld evaluation (-1: none yet, or it was held)."""
        self._stale_floor = -math.inf
        """No open replica's `fresh_until` is below this (a lower bound; -inf: unknown)."""
        self._counts = (0, 0, 0)
        """(live, unreported, condemned) as of the last full evaluation."""
        self.fast_path = True
        """False: always evaluate in full (the reference the fast path is tested against)."""

    # -- membership ----------------------------------------------------------------------------

    def sync(self, now: float) -> None:
        """Follow the index: clear removed slots, start added ones (grace from `now`). A slot freed
        and reused since the last sync is seen by its changed id and starts afresh."""
        if self._synced_version == self._index.version:
            return
        self._grow(self._index.capacity)
        id_at = self._index.id_at
        ids = self._ids
        changed = self._index.changed_since(self._synced_version)
        for slot in range(self._index.capacity) if changed is None else sorted(set(changed)):
            rid = id_at(slot)
            if rid != ids[slot]:
                self._reset(slot)
                if rid is not None:
                    self._live[slot] = True
                    self._fresh_until[slot] = now + self.startup_grace_s
                ids[slot] = rid
        self._synced_version = self._index.version
        self._facts += 1
        self._stale_floor = -math.inf

    def _grow(self, capacity: int) -> None:
        old = len(self._live)
        if capacity <= old:
            return
        size = max(capacity, 2 * old)
        self._ids.extend([None] * (size - old))
        self._live = _grown(self._live, size, False)
        self._checked = _grown(self._checked, size, _NEVER)
        self._healthy = _grown(self._healthy, size, False)
        self._failures = _grown(self._failures, size, 0)
        self._recv = _grown(self._recv, size, math.nan)
        self._fresh_until = _grown(self._fresh_until, size, _NEVER)
        self._exited = _grown(self._exited, size, False)
        self._gone = _grown(self._gone, size, False)
        self._probe_timeouts = _grown(self._probe_timeouts, size, 0)
        self._condemned = _grown(self._condemned, size, False)

    def _reset(self, slot: int) -> None:
        self._live[slot] = False
        self._checked[slot] = _NEVER
        self._healthy[slot] = False
        self._failures[slot] = 0
        self._recv[slot] = math.nan
        self._fresh_until[slot] = _NEVER
        self._exited[slot] = False
        self._gone[slot] = False
        self._probe_timeouts[slot] = 0
        self._condemned[slot] = False

    def _slot(self, replica: int | str, now: float) -> int:
        self.sync(now)
        slot = self._index.slot(replica) if isinstance(replica, str) else replica
        if 0 <= slot < len(self._live) and self._live[slot]:
            return slot
        return NO_SLOT

    # -- observations --------------------------------------------------------------------------

    def observe_batch(
        self,
        slots: npt.ArrayLike,
        healthy: npt.ArrayLike,
        checked_at: npt.ArrayLike,
        failures: npt.ArrayLike,
        recv: float,
        *,
        direct: bool = False,
    ) -> int:
        """Merge many entries received at `recv`; return how many became a replica's entry.

        Rows whose slot is NO_SLOT, out of range or not live, and rows with a non-finite
        `checked_at` (no health in that row), are skipped. `direct` is False for relayed entries
        (handle reports); pass True for a batch of the replicas' own reports.
        """
        self.sync(recv)
        s = np.asarray(slots, dtype=np.int64)
        ca = np.asarray(checked_at, dtype=np.float64)
        h = np.asarray(healthy, dtype=np.bool_)
        f = np.asarray(failures, dtype=np.int32)
        if not s.shape == ca.shape == h.shape == f.shape or s.ndim != 1:
            raise UsageError("observe_batch: columns must be 1-d and of equal length")
        size = len(self._live)
        if s.size == 0:
            return 0
        if lowest(s) >= 0 and highest(s) < size:
            # the usual batch: every slot in range (fewer array operations: on a report's few
            # rows each costs more than its work)
            ok = self._live[s] & np.isfinite(ca)
        else:
            in_range = (s >= 0) & (s < size)
            ok = in_range & self._live[np.where(in_range, s, 0)] & np.isfinite(ca)
        if all_set(ok):
            rows = None
            picked = s
        else:
            rows = np.flatnonzero(ok)
            if len(rows) == 0:
                return 0
            picked = s[rows]
        if not _repeats(picked):
            if rows is None:  # one row per slot, all of them kept: no gathers
                return self._merge(s, ca, h, f, recv, direct)
            return self._merge(picked, ca[rows], h[rows], f[rows], recv, direct)
        # newest row per slot: sort by slot, checked_at, then reversed arrival, and keep each
        # slot's last row; among equal checked_at the earliest row wins, as across batches.
        # (Only when a slot repeats: a router's report names each replica once, and the sort
        # is most of the cost of a wide report.)
        if rows is None:
            rows = np.arange(s.size)
        order = rows[np.lexsort((-rows, ca[rows], s[rows]))]
        sorted_slots = s[order]
        last = np.ones(len(order), dtype=np.bool_)
        last[:-1] = sorted_slots[1:] != sorted_slots[:-1]
        pick = order[last]
        return self._merge(s[pick], ca[pick], h[pick], f[pick], recv, direct)

    def _merge(
        self, p: Int64Array, c: npt.NDArray[np.float64], h: npt.NDArray[np.bool_],
        f: npt.NDArray[np.int32], recv: float, direct: bool,
    ) -> int:  # fmt: skip
        """Merge rows of distinct live slots `p` (`observe_batch` checked them)."""
        held = self._checked[p]
        replace = c > held
        if direct:
            refresh = replace | (c == held)
            back = (c < held) & (recv > self._fresh_until[p])
            replace |= back
            refresh |= back
        else:
            refresh = replace
        if not any_set(refresh):
            return 0  # a relay of entries already held (the other router's report, usually)
        n = int(np.count_nonzero(replace))
        if n == replace.size:
            rp, rc, rh, rf, rheld = p, c, h, f, held
        else:
            rp, rc, rh, rf, rheld = p[replace], c[replace], h[replace], f[replace], held[replace]
        if n and (highest(rf) >= self.failure_threshold or lowest(rheld) == _NEVER):
            self._facts += 1  # a failure count at the threshold, or a first report (counts)
        self._checked[rp] = rc
        self._healthy[rp] = rh
        self._failures[rp] = rf
        heard = p if all_set(refresh) else p[refresh]
        self._mark_heard(heard, recv, 0.0 if direct else self.relay_slack_s)
        return n

    def _mark_heard(self, slots: Int64Array | int, recv: float, slack: float = 0.0) -> None:
        # the latest receipt decides (a first report ends the startup grace early)
        self._recv[slots] = np.fmax(self._recv[slots], recv)
        fresh = self._recv[slots] + (self.stale_after_s + slack)
        self._fresh_until[slots] = fresh
        self._probe_timeouts[slots] = 0
        self._gone[slots] = False
        # a direct entry after a relayed one can move fresh_until back (no relay slack)
        if isinstance(fresh, np.ndarray):
            if fresh.size:
                self._stale_floor = min(self._stale_floor, float(lowest(fresh)))
        else:  # one slot
            self._stale_floor = min(self._stale_floor, float(fresh))

    def observe(
        self, replica: int | str, status: HealthStatus, recv: float, *, direct: bool = True
    ) -> bool:
        """One entry (heartbeat, probe answer, replica report: direct by default). True if it
        became the replica's entry."""
        slot = self._slot(replica, recv)
        if slot == NO_SLOT or not math.isfinite(status.checked_at):
            return False
        held = float(self._checked[slot])
        c = status.checked_at
        replace = c > held or (direct and c < held and recv > self._fresh_until[slot])
        if replace:
            if held == _NEVER or status.consecutive_failures >= self.failure_threshold:
                self._facts += 1
            self._checked[slot] = c
            self._healthy[slot] = status.healthy
            self._failures[slot] = status.consecutive_failures
        if replace or (direct and c == held):
            self._mark_heard(slot, recv)
        return replace

    def mark_exited(self, replica: int | str, now: float) -> bool:
        """The replica's process is gone: unhealthy at the next `evaluate`, held or not."""
        slot = self._slot(replica, now)
        if slot == NO_SLOT:
            return False
        self._exited[slot] = True
        self._facts += 1
        return True

    def probe_result(
        self,
        replica: int | str,
        outcome: ProbeOutcome,
        recv: float,
        status: HealthStatus | None = None,
    ) -> bool:
        """Record how a pull probe ended. An answer is a direct observation; an answer without a
        status still proves the replica is alive. False if the replica is not known."""
        slot = self._slot(replica, recv)
        if slot == NO_SLOT:
            return False
        if outcome is ProbeOutcome.ANSWERED:
            if status is None:
                self._mark_heard(slot, recv)
            else:
                self.observe(slot, status, recv, direct=True)
        elif outcome is ProbeOutcome.NO_RESPONDERS and self._checked[slot] != _NEVER:
            self._gone[slot] = True
            self._facts += 1
        else:
            self._probe_timeouts[slot] += 1
            self._facts += 1
        return True

    # -- decisions -----------------------------------------------------------------------------

    def evaluate(self, now: float, *, hold_verdicts: bool) -> HealthEvaluation:
        """Stale replicas (to probe) and new unhealthy verdicts at `now`."""
        self.sync(now)
        if self.fast_path and not hold_verdicts and self._facts == self._evaluated_facts:
            if now > self._stale_floor:
                self.raise_floor()
            if now <= self._stale_floor:
                # nothing could have earned a verdict since the last evaluation found none
                # left, and no open replica's freshness has run out yet
                n_live, unreported, condemned = self._counts
                return HealthEvaluation(
                    _NO_SLOTS, _NO_TIMES, _NO_SLOTS, _NO_REASONS, n_live, 0, unreported,
                    condemned, 0,
                )  # fmt: skip
        return self._evaluate(now, hold_verdicts)

    def raise_floor(self) -> None:
        """The floor exactly, from the open replicas' freshness: entries heard since the last
        evaluation only ever lower the floor (`_mark_heard`), so a deployment whose replicas
        keep reporting would otherwise run a full evaluation each time the old floor passes
        (at 10,000 apps, hundreds in one tick when their replicas started together). Only
        while the facts are those of the last evaluation: then the open set is that one's."""
        if not self.fast_path or self._facts != self._evaluated_facts:
            return
        open_fresh = self._fresh_until[self._live & ~self._condemned]
        self._stale_floor = float(lowest(open_fresh)) if open_fresh.size else math.inf

    def quiet_until(self) -> float:
        """Until when `evaluate` (unheld) is certain to find what the last one found: nothing
        stale, no new verdict. -inf when a change since could earn a verdict (or the fast path
        is off)."""
        if not self.fast_path or self._facts != self._evaluated_facts:
            return -math.inf
        return self._stale_floor

    def _evaluate(self, now: float, hold_verdicts: bool) -> HealthEvaluation:
        live = self._live
        failed = self._failures >= self.failure_threshold
        fact = self._exited | failed
        absent = self._gone | (self._probe_timeouts >= self.probe_timeout_limit)
        if hold_verdicts:
            # timeouts seen while the controller itself is behind are not evidence
            self._probe_timeouts[:] = 0
        open_ = live & ~self._condemned
        new = open_ & fact
        absent_new = open_ & absent & ~fact
        held = int(absent_new.sum()) if hold_verdicts else 0
        if not hold_verdicts:
            new |= absent_new
        new_slots = np.flatnonzero(new).astype(np.int64)
        reasons = _NO_REASONS if new_slots.size == 0 else self._reasons(new_slots, failed)
        self._condemned[new_slots] = True

        still_open = live & ~self._condemned
        open_fresh = self._fresh_until[still_open]
        self._stale_floor = float(lowest(open_fresh)) if open_fresh.size else math.inf
        stale_mask = still_open & (now > self._fresh_until)
        idx = np.flatnonzero(stale_mask).astype(np.int64)
        since = self._fresh_until[idx]
        if idx.size > 1:
            order = np.lexsort((idx, since))
            idx, since = idx[order], since[order]
        n_live = int(live.sum())
        unreported = int((live & (self._checked == _NEVER)).sum())
        condemned = int((live & self._condemned).sum())
        self._counts = (n_live, unreported, condemned)
        # under a hold, absences wait for the hold to end: the next evaluation must look again
        self._evaluated_facts = -1 if hold_verdicts else self._facts
        return HealthEvaluation(
            stale_slots=idx,
            stale_since=since,
            unhealthy_slots=new_slots,
            unhealthy_reasons=reasons,
            live=n_live,
            stale=len(idx),
            unreported=unreported,
            condemned=condemned,
            held=held,
        )

    def _reasons(self, new_slots: Int64Array, failed: BoolArray) -> Int8Array:
        never = self._checked[new_slots] == _NEVER
        return np.select(
            [
                self._exited[new_slots],
                self._gone[new_slots],
                failed[new_slots],
                never,
            ],
            [
                VerdictReason.EXITED,
                VerdictReason.GONE,
                VerdictReason.FAILURES,
                VerdictReason.NEVER_REPORTED,
            ],
            default=VerdictReason.PROBE_TIMEOUTS,
        ).astype(np.int8)

    # -- queries -------------------------------------------------------------------------------

    def get(self, replica: int | str, now: float) -> ReplicaHealth | None:
        slot = self._slot(replica, now)
        if slot == NO_SLOT:
            return None
        rid = self._ids[slot]
        assert rid is not None
        reported = self._checked[slot] != _NEVER
        recv = float(self._recv[slot])
        return ReplicaHealth(
            slot=slot,
            replica_id=rid,
            healthy=bool(self._healthy[slot]) if reported else None,
            checked_at=float(self._checked[slot]) if reported else None,
            consecutive_failures=int(self._failures[slot]),
            received_at=None if math.isnan(recv) else recv,
            fresh_until=float(self._fresh_until[slot]),
            exited=bool(self._exited[slot]),
            gone=bool(self._gone[slot]),
            probe_timeouts=int(self._probe_timeouts[slot]),
            condemned=bool(self._condemned[slot]),
        )

    def condemned_slots(self) -> Int64Array:
        """Slots holding an unhealthy verdict (to replace)."""
        return np.flatnonzero(self._live & self._condemned).astype(np.int64)


def _repeats(slots: Int64Array) -> bool:
    """Whether a slot occurs twice: a set for a few rows (one call), a count for many."""
    if slots.size <= FEW:
        return len(set(slots.tolist())) != slots.size
    return bool(np.bincount(slots).max() > 1)

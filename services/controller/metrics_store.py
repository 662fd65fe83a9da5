"""The controller's metrics store for one deployment: staleness-gated, vectorised ingest.

How it works. Every per-replica fact is a numpy array indexed by `ReplicaIndex` slot. A replica
report sets its replica's own entry (`_own`, NaN = none). A handle (router) source owns one row
of running values over slots (and one per custom metric), rewritten by each report it sends:

- object path (`HandleReport`): the `running` dict is mapped to slots with one dict lookup per
  replica (that path is per-replica Python already: msgpack decoded every entry);
- columnar path (`ColumnarHandleReport`): the report's replica-id dictionary is mapped to slots
  once and cached per (handle, part), then every report merges with numpy fancy indexing. The
  cache entry is reused while the membership epoch, `index.version` and the dictionary itself
  (Arrow `.equals`, a memcmp) are all unchanged, so it can never map a row to a wrong slot.

Both paths produce bit-identical rows for the same data, and the aggregates are computed from
the rows by one code path, so a fleet with mixed senders aggregates exactly like an all-object
one. Every change to the rows bumps a version, and the total demand (read every control tick) is
recomputed only when it moved; `expire` keeps a lower bound on the oldest receipt time it
guards, so a tick with nothing old enough to drop costs no pass over handles or slots. A source lives in exactly one store (its row has one format); when a handle switches
format its row is cleared first, so nothing is counted twice.

A single-part report replaces the handle's row. Parts of a split report merge row by row as they
arrive; once every part of a report has arrived, slots none of them wrote are cleared (replicas
that left the report). A lost part leaves its replicas at their previous values until the
handle expires: missing data is not zero load.

Running-replica gate: only slots in the running set (`set_running`) take values or count; a slot
that leaves it is cleared at once in every row, so a late report from a stopped replica cannot
inflate or suppress live metrics. Health carried by reports is extracted for every known slot
(running or not) and handed back as arrays for the health registry, which decides newest-wins.

Assumptions (the caller's job): reports were decoded and validated, and belong to this
deployment; widths are bounded by the decoder's limits. No clock and no I/O here: every method
takes local monotonic receipt time. Aggregates are recomputed on demand with one vector add per
handle (see docs/benchmarks.md, "Ingest", for why not an incremental total).
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from typing import Final, Literal, TypeVar, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from services.controller.machinery.tiny import all_set, lowest
from services.controller.metrics_types import (
    ACCEPTED,
    F64,
    I64,
    NOT_RUNNING,
    UNKNOWN_REPLICA,
    IngestResult,
    Mask,
    MetricsSnapshot,
    columnar_foreign,
    columnar_health,
    object_health,
)
from services.controller.replica_index import NO_SLOT, ReplicaIndex
from services.controller.staleness import (
    GATE_RETENTION_FACTOR,
    SourceGate,
    Verdict,
    source_timeout_s,
)
from shared.wire.columnar import ColumnarHandleReport
from shared.wire.messages import HandleReport, ReplicaReport

Format = Literal["object", "columnar"]
_A = TypeVar("_A", bound=npt.NDArray[np.generic])

OBJECT: Final = "object"
COLUMNAR: Final = "columnar"


@dataclass(slots=True, eq=False)
class _SlotMap:
    """Cached dictionary position -> slot mapping of one (handle, part)."""

    epoch: int
    index_version: int
    dictionary: pa.Array
    slots: I64
    known: Mask
    identity: pa.Array
    """int32 0..n-1: the indices of a report whose rows are its dictionary in order."""
    running_version: int = -1
    ok: Mask = field(default_factory=lambda: np.zeros(0, np.bool_))
    """known and running, per dictionary position (refreshed when the running set changes)."""
    n_ok: int = 0


@dataclass(slots=True, eq=False)
class _Handle:
    fmt: Format
    running: F64
    custom: dict[str, F64] = field(default_factory=dict)
    queued: float = 0.0
    last_recv: float = 0.0
    gen: int = 0
    written: I64 | None = None
    """Generation of the split report that last wrote each slot (only once a report splits)."""
    maps: dict[int, _SlotMap] = field(default_factory=dict)


def _nan(n: int) -> F64:
    return np.full(n, np.nan)


def _grown(a: _A, n: int, fill: float | bool) -> _A:
    out = np.full(n, fill, dtype=a.dtype)
    out[: a.size] = a
    return cast(_A, out)


def _column(columns: dict[str, F64], name: str, n: int) -> F64:
    """The named custom column, created all-NaN (no values) on first use."""
    col = columns.get(name)
    if col is None:
        col = columns[name] = _nan(n)
    return col


def _put(dst: F64, slots: I64, ok: Mask | None, values: F64) -> None:
    """dst[slots] = values on the rows `ok` marks (None = all rows)."""
    if ok is None:
        dst[slots] = values
    else:
        dst[slots[ok]] = values[ok]


class DeploymentMetrics:
    """Metrics of one deployment: ingest from both formats, aggregates on demand."""

    def __init__(self, index: ReplicaIndex, metrics_interval_s: float) -> None:
        self._index = index
        self.timeout_s = source_timeout_s(metrics_interval_s)
        n = index.capacity
        self._cap = n
        self._index_version = index.version
        self._running_ids: set[str] = set()
        self._owner: dict[int, str] = {}
        self._slot_of_running: dict[str, int] = {}
        """The inverse of `_owner`."""
        self._running = np.zeros(n, np.bool_)
        self._running_version = 0
        self._own: F64 = _nan(n)
        self._own_recv: F64 = np.full(n, -np.inf)
        self._own_custom: dict[str, F64] = {}
        self._handles: dict[str, _Handle] = {}
        self._handle_gate = SourceGate()
        self._replica_gate = SourceGate()
        self._version = 0
        """Bumped by every change to the rows, the running set or the handles (cache key)."""
        self._demand: tuple[int, float] = (-1, 0.0)
        self._oldest_recv = math.inf
        """No handle's `last_recv` and no finite `_own_recv` is below this (a lower bound)."""
        self.slot_map_builds = 0
        """Columnar dictionary -> slot mappings built (cache misses), for metrics and tests."""

    # -- running-replica gate ------------------------------------------------------------------

    def set_running(self, replica_ids: Iterable[str]) -> None:
        """The replicas the deployment state says are RUNNING. Ids the index does not hold are
        remembered and count once the index adds them. A replica leaving the set is cleared from
        every store at once."""
        self._sync()
        self._running_ids = set(replica_ids)
        self._resolve_running()

    def update_running(self, changed: Iterable[str], running: Container[str]) -> None:
        """`set_running` by delta: the replicas in `changed` may have started or stopped running,
        or been added to or removed from the index; `running` answers for each (O(changed))."""
        if self._index.version != self._index_version:
            self._index_version = self._index.version
            self._grow(self._index.capacity)
        dropped: list[int] = []
        touched = False
        for rid in changed:
            if rid in running:
                self._running_ids.add(rid)
            else:
                self._running_ids.discard(rid)
            old = self._slot_of_running.get(rid, NO_SLOT)
            new = self._index.slot(rid) if rid in self._running_ids else NO_SLOT
            if old == new:
                continue
            touched = True
            if old != NO_SLOT:
                del self._slot_of_running[rid]
                if self._owner.get(old) == rid:
                    del self._owner[old]
                    self._running[old] = False
                    dropped.append(old)
            if new != NO_SLOT:
                prev = self._owner.get(new)
                if prev is not None:  # the slot was another replica's: its data goes
                    del self._slot_of_running[prev]
                    dropped.append(new)
                self._owner[new] = rid
                self._slot_of_running[rid] = new
                self._running[new] = True
        if not touched:
            return
        self._version += 1
        self._running_version += 1
        if dropped:
            self._clear_slots(np.asarray(sorted(set(dropped)), dtype=np.int64))

    def running_ids(self) -> list[str]:
        self._sync()
        return sorted(self._owner.values())

    def _sync(self) -> None:
        if self._index.version == self._index_version:
            return
        self._index_version = self._index.version
        self._grow(self._index.capacity)
        self._resolve_running()

    def _resolve_running(self) -> None:
        # Python over running replicas, but only when the running set or the index changes.
        owner: dict[int, str] = {}
        for rid in self._running_ids:
            slot = self._index.slot(rid)
            if slot != NO_SLOT:
                owner[slot] = rid
        if owner == self._owner:
            return
        # A slot whose replica left (or whose slot was reused by another) loses its data.
        dropped = [s for s, rid in self._owner.items() if owner.get(s) != rid]
        self._owner = owner
        self._slot_of_running = {rid: s for s, rid in owner.items()}
        self._version += 1
        self._running = np.zeros(self._cap, np.bool_)
        self._running[np.fromiter(owner, np.int64, len(owner))] = True
        self._running_version += 1
        if dropped:
            self._clear_slots(np.asarray(dropped, dtype=np.int64))

    def _clear_slots(self, slots: I64) -> None:
        self._own[slots] = np.nan
        self._own_recv[slots] = -np.inf
        for a in self._own_custom.values():
            a[slots] = np.nan
        for h in self._handles.values():
            h.running[slots] = 0.0
            for a in h.custom.values():
                a[slots] = np.nan

    def _grow(self, n: int) -> None:
        if n <= self._cap:
            return
        self._cap = n
        self._version += 1
        self._running = _grown(self._running, n, False)
        self._own = _grown(self._own, n, np.nan)
        self._own_recv = _grown(self._own_recv, n, -np.inf)
        self._own_custom = {k: _grown(a, n, np.nan) for k, a in self._own_custom.items()}
        for h in self._handles.values():
            h.running = _grown(h.running, n, 0.0)
            h.custom = {k: _grown(a, n, np.nan) for k, a in h.custom.items()}
            if h.written is not None:
                h.written = _grown(h.written, n, -1)

    def _row_ok(self, slots: I64) -> Mask | None:
        """Rows whose slot is known and running; None when that is every row."""
        if slots.size and lowest(slots) >= 0:  # the usual report: every replica known
            ok = self._running[slots]
        else:
            ok = self._running[np.where(slots >= 0, slots, 0)] & (slots >= 0)
        return None if all_set(ok) else ok

    # -- replica reports -------------------------------------------------------------------

    def ingest_replica_report(self, r: ReplicaReport, recv: float) -> IngestResult:
        """A replica's own report: it covers every handle, so it wins over handle sums."""
        self._sync()
        slot = self._index.slot(r.replica_id)
        if slot == NO_SLOT:
            return IngestResult(False, UNKNOWN_REPLICA)
        verdict = self._replica_gate.admit(r.replica_id, r.sent_at, r.seq, recv)
        if not verdict.accepted:
            return IngestResult(False, verdict.value)
        health = None if r.health is None else object_health(self._index, (r.health,))[0]
        if not self._running[slot]:
            return IngestResult(False, NOT_RUNNING, health, ignored=1)
        self._version += 1
        self._oldest_recv = min(self._oldest_recv, recv)
        self._own[slot] = r.running_requests
        self._own_recv[slot] = recv
        for name, a in self._own_custom.items():
            if name not in r.custom:
                a[slot] = np.nan
        for name, value in r.custom.items():
            _column(self._own_custom, name, self._cap)[slot] = value
        return IngestResult(True, ACCEPTED, health, rows=1)

    # -- handle reports ------------------------------------------------------------------------

    def ingest_handle_report(self, r: HandleReport, recv: float) -> IngestResult:
        """An object-path handle report: always whole, so it replaces the handle's row."""
        self._sync()
        verdict = self._handle_gate.admit(r.handle_id, r.sent_at, r.seq, recv)
        if not verdict.accepted:
            return IngestResult(False, verdict.value)
        h = self._handle_for(r.handle_id, OBJECT, recv)
        h.queued = r.queued_requests
        slots = self._index.slots_for(r.running)
        ok = self._row_ok(slots)
        h.running.fill(0.0)
        _put(h.running, slots, ok, np.fromiter(r.running.values(), np.float64, len(slots)))
        for name in [k for k in h.custom if k not in r.custom]:
            del h.custom[name]
        for name, per in r.custom.items():
            cslots = self._index.slots_for(list(per))
            dst = _column(h.custom, name, self._cap)
            dst.fill(np.nan)
            _put(dst, cslots, self._row_ok(cslots), np.fromiter(per.values(), np.float64))
        merged = len(slots) if ok is None else int(np.count_nonzero(ok))
        health, foreign = object_health(self._index, r.health)
        return IngestResult(True, ACCEPTED, health, merged, len(slots) - merged, foreign)

    def ingest_columnar(self, c: ColumnarHandleReport, recv: float) -> IngestResult:
        """One FPC1 part, merged with fancy indexing over cached slots (no per-row Python)."""
        self._sync()
        verdict = self._handle_gate.admit(c.handle_id, c.sent_at, c.seq, recv, c.part, c.parts)
        if not verdict.accepted:
            return IngestResult(False, verdict.value)
        h = self._handle_for(c.handle_id, COLUMNAR, recv)
        h.queued = c.queued_requests  # report-level: set, never added over parts
        split = c.parts > 1
        if verdict is Verdict.NEW_REPORT:
            h.gen += 1
            if h.maps and max(h.maps) >= c.parts:
                h.maps = {p: m for p, m in h.maps.items() if p < c.parts}
        slots, ok, known, merged = self._rows(self._slot_map(h, c), c)
        if not split:
            h.running.fill(0.0)
        _put(h.running, slots, ok, c.running)
        self._merge_custom(h, c, slots, ok, split)
        if split:
            self._mark_part(h, c.handle_id, slots, ok)
        health = columnar_health(c, slots, known)
        foreign = columnar_foreign(c, known)
        return IngestResult(True, ACCEPTED, health, merged, slots.size - merged, foreign)

    @staticmethod
    def _rows(m: _SlotMap, c: ColumnarHandleReport) -> tuple[I64, Mask | None, Mask, int]:
        """Per row: slot, rows to merge (None = all), rows with a known slot; rows merged."""
        indices = c.replica_ids.indices
        if len(indices) == m.slots.size and m.identity.equals(indices):
            # Writers emit one dictionary entry per row, in row order: no gather needed.
            return m.slots, None if m.n_ok == m.slots.size else m.ok, m.known, m.n_ok
        idx = np.asarray(indices.to_numpy(zero_copy_only=False))
        row_ok = m.ok[idx]
        merged = int(np.count_nonzero(row_ok))
        return m.slots[idx], None if merged == idx.size else row_ok, m.known[idx], merged

    def _merge_custom(
        self, h: _Handle, c: ColumnarHandleReport, slots: I64, ok: Mask | None, split: bool
    ) -> None:
        names = c.custom_names
        for name in [k for k in h.custom if k not in names]:
            if split:  # this part says "no value" for its rows; other parts' rows stay
                _put(h.custom[name], slots, ok, _nan(slots.size))
            else:
                del h.custom[name]
        for name in names:
            dst = _column(h.custom, name, self._cap)
            if not split:
                dst.fill(np.nan)
            _put(dst, slots, ok, c.custom(name))

    def _mark_part(self, h: _Handle, handle_id: str, slots: I64, ok: Mask | None) -> None:
        if h.written is None:
            h.written = np.full(self._cap, -1, np.int64)
        h.written[slots if ok is None else slots[ok]] = h.gen
        if self._handle_gate.complete(handle_id):
            # Every part arrived: replicas none of them named are no longer in the report.
            gone = h.written != h.gen
            h.running[gone] = 0.0
            for a in h.custom.values():
                a[gone] = np.nan

    def _handle_for(self, handle_id: str, fmt: Format, recv: float) -> _Handle:
        # every accepted handle report comes through here before it changes a row
        self._version += 1
        self._oldest_recv = min(self._oldest_recv, recv)
        h = self._handles.get(handle_id)
        if h is None:
            h = self._handles[handle_id] = _Handle(fmt, np.zeros(self._cap))
        elif h.fmt != fmt:
            # The source moves stores: its old row goes first, so nothing is counted twice.
            h.fmt = fmt
            h.running.fill(0.0)
            h.custom.clear()
            h.written = None
            h.maps.clear()
        h.last_recv = recv
        return h

    def _slot_map(self, h: _Handle, c: ColumnarHandleReport) -> _SlotMap:
        d = c.replica_dictionary
        m = h.maps.get(c.part)
        if (
            m is None
            or m.epoch != c.membership_epoch
            or m.index_version != self._index.version
            or not m.dictionary.equals(d)
        ):
            self.slot_map_builds += 1
            ids = d.to_pylist()
            slots = self._index.slots_for(ids)
            # An owned copy: holding `d` would pin the whole received payload in memory.
            owned = pa.array(ids, type=pa.utf8())
            identity = pa.array(np.arange(len(ids), dtype=np.int32))
            # Read-only: these arrays are handed out (HealthBatch.slots) and must stay intact.
            slots.setflags(write=False)
            m = h.maps[c.part] = _SlotMap(
                c.membership_epoch, self._index.version, owned, slots, slots >= 0, identity
            )
        if m.running_version != self._running_version:
            m.ok = m.known & self._running[np.where(m.known, m.slots, 0)]
            m.ok.setflags(write=False)
            m.n_ok = int(np.count_nonzero(m.ok))
            m.running_version = self._running_version
        return m

    # -- expiry ----------------------------------------------------------------------------------

    def expire(self, now: float) -> list[str]:
        """Drop handle sources silent (by receipt time) for `timeout_s` or more; return their
        ids. Replica-reported values that old are dropped too (handle sums take over)."""
        self._sync()
        cutoff = now - self.timeout_s
        forget_before = now - GATE_RETENTION_FACTOR * self.timeout_s
        self._handle_gate.prune(forget_before)
        self._replica_gate.prune(forget_before)
        if cutoff < self._oldest_recv:
            return []  # nothing received that long ago (slots without own data are -inf: none)
        gone = [hid for hid, h in self._handles.items() if h.last_recv <= cutoff]
        for hid in gone:
            del self._handles[hid]
        old = self._own_recv <= cutoff
        if old.any():
            self._own[old] = np.nan
            self._own_recv[old] = -np.inf
            for a in self._own_custom.values():
                a[old] = np.nan
        if gone or old.any():
            self._version += 1
        self.refresh_expiry()
        return gone

    def refresh_expiry(self) -> None:
        """`next_expiry` exactly: receipts since the last look only ever lower it (a report
        names its receipt time, and the oldest source may be the one that just reported), so a
        deployment whose routers keep reporting would otherwise look at an expiry that is not
        there once per timeout. O(handles) plus one vectorised min."""
        self._sync()
        own = self._own_recv[np.isfinite(self._own_recv)]
        self._oldest_recv = min(
            min((h.last_recv for h in self._handles.values()), default=math.inf),
            float(lowest(own)) if own.size else math.inf,
        )

    @property
    def version(self) -> int:
        """Bumped by every change to what the aggregates read (a cache key)."""
        return self._version

    def next_expiry(self) -> float:
        """The earliest time `expire` drops something (inf: nothing received)."""
        return self._oldest_recv + self.timeout_s

    # -- aggregates ----------------------------------------------------------------------------

    def handle_ids(self) -> list[str]:
        return list(self._handles)

    def handle_format(self, handle_id: str) -> Format | None:
        h = self._handles.get(handle_id)
        return None if h is None else h.fmt

    def per_replica_running(self) -> F64:
        """Running requests per slot: the replica's own report if it has one, else the sum over
        handles; 0 outside the running set."""
        self._sync()
        total = np.zeros(self._cap)
        for h in self._handles.values():
            total += h.running
        per = np.where(np.isnan(self._own), total, self._own)
        return np.where(self._running, per, 0.0)

    def per_replica_by_id(self) -> dict[str, float]:
        """Status/debug view of `per_replica_running` (Python per replica: not the hot path)."""
        per = self.per_replica_running()
        return {rid: float(per[slot]) for slot, rid in sorted(self._owner.items())}

    def total_running(self) -> float:
        return float(self.per_replica_running().sum())

    def queued(self) -> float:
        # fsum: exactly rounded, so the result does not depend on the order handles arrived in.
        return math.fsum(h.queued for h in self._handles.values())

    def total_demand(self) -> float:
        self._sync()
        version, demand = self._demand
        if version != self._version:
            demand = self.total_running() + self.queued()
            self._demand = (self._version, demand)
        return demand

    def cold_start_signal(self) -> bool:
        return any(h.queued > 0.0 for h in self._handles.values())

    def custom_names(self) -> list[str]:
        """Custom metrics some running replica has a value for."""
        self._sync()
        names = set()
        for columns in (self._own_custom, *(h.custom for h in self._handles.values())):
            for name, a in columns.items():
                if name not in names and (~np.isnan(a) & self._running).any():
                    names.add(name)
        return sorted(names)

    def custom_total(self, name: str) -> float | None:
        """Sum over running replicas of custom metric `name` (each replica's own value if it
        reported one, else the sum over handles); None when no running replica has a value."""
        summary = self.custom_summary(name)
        return None if summary is None else summary[0]

    def custom_summary(self, name: str) -> tuple[float, int] | None:
        """(sum, running replicas with a value) of custom metric `name`, as `custom_total`."""
        self._sync()
        total = np.zeros(self._cap)
        has = np.zeros(self._cap, np.bool_)
        for h in self._handles.values():
            a = h.custom.get(name)
            if a is not None:
                valid = ~np.isnan(a)
                total += np.where(valid, a, 0.0)
                has |= valid
        own = self._own_custom.get(name)
        if own is not None:
            valid = ~np.isnan(own)
            total = np.where(valid, own, total)
            has |= valid
        has &= self._running
        n = int(np.count_nonzero(has))
        return (float(total[has].sum()), n) if n else None

    def snapshot(self, now: float) -> MetricsSnapshot:
        """Expire silent sources, then aggregate."""
        expired = self.expire(now)
        per = self.per_replica_running()
        running = float(per.sum())
        queued = self.queued()
        return MetricsSnapshot(
            total_running=running,
            queued=queued,
            total_demand=running + queued,
            per_replica=per,
            running_replicas=len(self._owner),
            self_reporting=int(np.count_nonzero(self._running & ~np.isnan(self._own))),
            handles=len(self._handles),
            cold_start_signal=self.cold_start_signal(),
            expired=tuple(expired),
        )

"""Results of the metrics store: what one ingest did, the health it carried, the aggregates.

Health carried by reports leaves the store as numpy arrays over `ReplicaIndex` slots, so the
health registry can apply a wide report with vectorised newest-wins instead of a row loop.
The extraction helpers are pure functions of a report and the slots its rows map to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from services.controller.machinery.tiny import all_set, any_set
from services.controller.replica_index import NO_SLOT, ReplicaIndex
from services.controller.staleness import Verdict
from shared.wire.columnar import ColumnarHandleReport
from shared.wire.messages import HealthStatus

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
Mask = npt.NDArray[np.bool_]

ACCEPTED: Final = "accepted"
STALE: Final = Verdict.STALE.value
DUPLICATE: Final = Verdict.DUPLICATE.value
NOT_RUNNING: Final = "not_running"
"""Replica report from a known replica that is not running: health extracted, metrics not kept."""
UNKNOWN_REPLICA: Final = "unknown_replica"
"""Replica report from a replica the index does not know: dropped whole."""


@dataclass(frozen=True, slots=True, eq=False)
class HealthBatch:
    """Health rows carried by one report, for the health registry (which keeps newest-wins).
    Only rows that carry health and name a replica the index knows (running or not)."""

    slots: I64
    healthy: Mask
    checked_at: F64
    failures: I32

    def __len__(self) -> int:
        return int(self.slots.size)


@dataclass(frozen=True, slots=True)
class IngestResult:
    """What one report did. `reason` is ACCEPTED, STALE, DUPLICATE, NOT_RUNNING or
    UNKNOWN_REPLICA. `rows` replica rows were merged; `ignored` rows named a replica without a
    slot or not running. `health` is set whenever the report passed the staleness gate and
    carried health for a known replica, even if its metrics were not kept (NOT_RUNNING)."""

    accepted: bool
    reason: str
    health: HealthBatch | None = None
    rows: int = 0
    ignored: int = 0
    foreign: tuple[HealthStatus, ...] = ()
    """Health of a handle report that names no replica of this deployment: a handle-owning
    host's own entry (another deployment of the same app), or a replica that left."""


@dataclass(frozen=True, slots=True, eq=False)
class MetricsSnapshot:
    """Aggregates at one instant. `per_replica` is indexed by slot (0 outside the running set)."""

    total_running: float
    queued: float
    total_demand: float
    per_replica: F64
    running_replicas: int
    self_reporting: int
    """Running replicas whose own report (not handle sums) gives their running requests."""
    handles: int
    cold_start_signal: bool
    """Some live handle has requests queued (the controller combines it with zero replicas)."""
    expired: tuple[str, ...]


def object_health(
    index: ReplicaIndex, health: Sequence[HealthStatus]
) -> tuple[HealthBatch | None, tuple[HealthStatus, ...]]:
    """Health of object-path reports (Python per entry, like the msgpack decode before it), and
    the entries naming no replica of the index (`IngestResult.foreign`), in one pass. A replica
    listed twice yields two rows: the registry keeps the newest."""
    n = len(health)
    if n == 0:
        return None, ()
    get = index.slot
    slots = np.fromiter((get(s.replica_id) for s in health), np.int64, n)
    known = slots != NO_SLOT
    foreign: tuple[HealthStatus, ...] = ()
    if not all_set(known):
        foreign = tuple(s for s, k in zip(health, known.tolist(), strict=True) if not k)
        health = [s for s, k in zip(health, known.tolist(), strict=True) if k]
        slots = slots[known]
        n = len(health)
        if n == 0:
            return None, foreign
    batch = HealthBatch(
        slots=slots,
        healthy=np.fromiter((s.healthy for s in health), np.bool_, n),
        checked_at=np.fromiter((s.checked_at for s in health), np.float64, n),
        failures=np.fromiter((s.consecutive_failures for s in health), np.int32, n),
    )
    return batch, foreign


def columnar_foreign(c: ColumnarHandleReport, known: Mask) -> tuple[HealthStatus, ...]:
    """Health rows of unknown replicas as statuses; Python only for those rows (usually none)."""
    if all_set(known):
        return ()
    rows = np.flatnonzero(~known & c.health_valid)
    if rows.size == 0:
        return ()
    ids = c.replica_dictionary.take(pa.array(c.replica_indices[rows])).to_pylist()
    healthy, checked, failures = c.health_healthy, c.health_checked_at, c.health_failures
    return tuple(
        HealthStatus(rid, bool(healthy[r]), float(checked[r]), int(failures[r]))
        for rid, r in zip(ids, rows.tolist(), strict=True)
    )


def columnar_health(c: ColumnarHandleReport, slots: I64, known: Mask) -> HealthBatch | None:
    """Health rows of one FPC1 part; `slots`/`known` are per row. Vectorised."""
    columns = c.columns
    nulls = columns[2].null_count
    if nulls == c.num_rows:
        return None
    if nulls == 0:
        # No nulls to fill: read the buffers directly (the accessors' fill_null costs more
        # than the conversion itself on narrow reports).
        keep = known
        healthy = np.asarray(columns[2].to_numpy(zero_copy_only=False))
        checked_at = np.asarray(columns[3].to_numpy(zero_copy_only=False))
        failures = np.asarray(columns[4].to_numpy(zero_copy_only=False))
    else:
        keep = known & c.health_valid
        healthy, checked_at, failures = c.health_healthy, c.health_checked_at, c.health_failures
    if all_set(keep):
        return HealthBatch(slots, healthy, checked_at, failures)
    if not any_set(keep):
        return None
    return HealthBatch(slots[keep], healthy[keep], checked_at[keep], failures[keep])

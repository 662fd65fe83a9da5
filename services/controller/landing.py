"""How one report lands on its deployment: decoded by its kind, checked against its subject,
handed to the metrics store, the health registry or the lifecycle, and counted.

Pure like the core it serves: `land` changes the deployment and the counts and returns what the
core still has to do across deployments (health rows naming replicas of sibling deployments)
and the lifecycle's events. A bad payload raises nothing: it is counted as dropped, by reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.errors import WireError
from shared.subjects import ReportSubject, Subjects
from shared.wire.codec import decode_as
from shared.wire.columnar import (
    ColumnarHandleReport,
    decode_handle_report_columnar,
    detect_format,
)
from shared.wire.messages import HandleReport, HealthStatus, Heartbeat, Lifecycle, ReplicaReport

from .actions import CoreStats
from .deployment_state import StateEvent
from .managed import ManagedDeployment
from .metrics_types import DUPLICATE, STALE, UNKNOWN_REPLICA, HealthBatch
from .source_check import SOURCE_MISMATCH, speaks_for_another

TURNED_AWAY = frozenset({STALE, DUPLICATE, UNKNOWN_REPLICA})
"""Reasons of valid reports that changed nothing."""
_PAYLOADS: dict[str, type[ReplicaReport | Heartbeat | Lifecycle]] = {
    "replica": ReplicaReport, "heartbeat": Heartbeat, "lifecycle": Lifecycle,
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Landed:
    foreign: tuple[HealthStatus, ...] = ()
    """Health rows of a handle report naming no replica of the deployment (a host's own health
    rides on its router's reports to any deployment of its app)."""
    events: tuple[StateEvent, ...] = ()


_NOTHING = Landed()


def land(
    m: ManagedDeployment,
    where: ReportSubject,
    data: bytes,
    recv: float,
    decoded: ColumnarHandleReport | WireError | None,
    subjects: Subjects,
    stats: CoreStats,
) -> Landed:
    """One report on `where`'s deployment `m`, received at local monotonic `recv`; `decoded`:
    a columnar part decoded elsewhere, or why it is bad."""
    try:
        if where.kind == "handle":
            return Landed(foreign=_handle(m, data, recv, decoded, stats))
        report = decode_as(data, _PAYLOADS[where.kind])
        if speaks_for_another(subjects, where, report):
            stats.dropped[SOURCE_MISMATCH] += 1
        elif isinstance(report, ReplicaReport):
            res = m.metrics.ingest_replica_report(report, recv)
            _fold(m, res.health, recv, direct=True)
            _counted(stats, res.reason)
        elif isinstance(report, Heartbeat):
            m.health.observe(report.health.replica_id, report.health, recv)
            stats.ingested["heartbeat"] += 1
        else:
            stats.ingested["lifecycle_" + report.state] += 1
            events = m.state.on_lifecycle(
                report.replica_id,
                report.state,
                recv,
                rpc_subject=report.rpc_subject,
                agent_id=report.agent_id,
                http_address=report.http_address or "",
            )
            return Landed(events=tuple(events))
    except WireError as exc:
        stats.dropped[exc.reason] += 1
    return _NOTHING


def _handle(
    m: ManagedDeployment,
    data: bytes,
    recv: float,
    decoded: ColumnarHandleReport | WireError | None,
    stats: CoreStats,
) -> tuple[HealthStatus, ...]:
    if isinstance(decoded, WireError):
        raise decoded
    if decoded is not None or detect_format(data) == "columnar":
        part = decoded if decoded is not None else decode_handle_report_columnar(data)
        res = m.metrics.ingest_columnar(part, recv)
        _counted(stats, res.reason, "columnar_")
    else:
        res = m.metrics.ingest_handle_report(decode_as(data, HandleReport), recv)
        _counted(stats, res.reason, "object_")
    _fold(m, res.health, recv, direct=False)
    return res.foreign


def _counted(stats: CoreStats, reason: str, prefix: str = "") -> None:
    stats.ingested[prefix + reason] += 1
    if reason in TURNED_AWAY:
        stats.turned_away[reason] += 1


def _fold(m: ManagedDeployment, batch: HealthBatch | None, recv: float, *, direct: bool) -> None:
    if batch is not None and len(batch):
        m.health.observe_batch(
            batch.slots, batch.healthy, batch.checked_at, batch.failures, recv, direct=direct
        )

"""Does a report speak only for the source its subject names? (docs/architecture.md)

The subject is what the server's permissions bind to the sender: under the auth callout a
replica may publish only on `fp.v1.report.{kind}.{app}.{deployment}.{its id}`. The payload names
its source again (a replica id, for a lifecycle event also the deployment and rpc subject), and
it is the payload the controller acts on. So a report whose payload claims another source than
its subject is dropped (`source_mismatch`): a replica cannot speak for another deployment, nor,
when its subject carries its id, for a sibling. Reports whose subject names no replica (agents'
lifecycle events, older replicas, tools) are checked for what the subject does name.

Pure: no bus, no clock.
"""

from __future__ import annotations

from shared.subjects import ReportSubject, Subjects
from shared.wire.messages import Heartbeat, Lifecycle, ReplicaReport

SOURCE_MISMATCH = "source_mismatch"
"""Drop reason (`stats.dropped`) of a report whose payload claims another source."""


def claimed_ids(report: ReplicaReport | Heartbeat | Lifecycle) -> tuple[str, ...]:
    """Every replica id the payload speaks for."""
    if isinstance(report, Heartbeat):
        return (report.health.replica_id,)
    if isinstance(report, Lifecycle):
        return (report.replica_id,)
    if report.health is None:
        return (report.replica_id,)
    return (report.replica_id, report.health.replica_id)


def speaks_for_another(
    subjects: Subjects, where: ReportSubject, report: ReplicaReport | Heartbeat | Lifecycle
) -> bool:
    if where.replica is not None and any(rid != where.replica for rid in claimed_ids(report)):
        return True
    if isinstance(report, Lifecycle):
        if (report.app, report.deployment) != (where.app, where.deployment):
            return True
        # an rpc subject other than its replica's own there would steer requests elsewhere
        own = subjects.rpc(where.app, where.deployment, report.replica_id)
        return bool(report.rpc_subject) and report.rpc_subject != own
    return False

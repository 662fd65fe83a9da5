"""Handle reports: what a router tells the controller about one deployment, and how it is encoded.

How it works: every `metrics_interval_s` the router closes its windows and calls
`build_handle_report` with the time-weighted in-flight averages per replica, the queued average,
the carried-health snapshot and the statuses of local health providers. `encode_handle_report`
picks the format by width (replicas covered): msgpack `HandleReport` below
`columnar_min_replicas`, the Arrow columnar format (`FPC1`) from there on, split into parts that
each fit under the server's `max_payload`. The controller detects the format by its magic, so
routers on either side of the gate aggregate together.

Local health providers (`shared/localhealth.py`): a replica process that also owns handles (user
code calling another deployment) registers `fn() -> HealthStatus | None` for its app with
`register_local_health_provider`; every report of every router in the process *to a deployment of
the same app* merges those statuses into its carried health (newest `checked_at` wins), so the
host's health rides on reports that flow anyway. Only the same app: reports are partitioned by
app, so only those reach the controller member that owns the host (it applies a row naming a
replica of another deployment of the app to that deployment). A router to another app does not
call the provider, so the host's health is not stamped as carried and its own heartbeat goes out
instead; never both lost and suppressed. A provider that raises is counted, logged rate-limited
and skipped; the report still goes out.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from shared.wire.codec import encode
from shared.wire.messages import HandleReport, HealthStatus, RequestStats

logger = logging.getLogger(__name__)


def merge_health(
    carried: Iterable[HealthStatus], local: Iterable[HealthStatus]
) -> tuple[HealthStatus, ...]:
    """One status per replica, the newest `checked_at` winning (carried order kept)."""
    merged: dict[str, HealthStatus] = {}
    for status in (*carried, *local):
        held = merged.get(status.replica_id)
        if held is None or status.checked_at > held.checked_at:
            merged[status.replica_id] = status
    return tuple(merged.values())


class RequestCounters:
    """The cumulative request counters a router sends as `HandleReport.stats` (O(1) per request)."""

    __slots__ = (
        "arrived", "c_s", "c_sq", "c_sum", "done", "rejected", "service_s", "service_sq_s2",
        "timed_out", "wait_s",
    )  # fmt: skip

    def __init__(self) -> None:
        self.arrived = self.done = self.rejected = self.timed_out = self.c_sum = self.c_sq = 0
        self.service_s = self.service_sq_s2 = self.wait_s = self.c_s = 0.0

    def completed(self, wait_s: float, service_s: float, concurrency: int) -> None:
        """One request done: `concurrency` is the replica's count at its admission."""
        wait_s, service_s, c = max(0.0, wait_s), max(0.0, service_s), max(0, concurrency)
        self.done += 1
        self.wait_s += wait_s
        self.service_s += service_s
        self.service_sq_s2 += service_s * service_s
        self.c_sum += c
        self.c_sq += c * c
        self.c_s += c * service_s

    def failed(self, outcome: str) -> None:
        """A call that ended with `outcome` (a RouterMetrics label)."""
        if outcome == "backpressure":
            self.rejected += 1
        elif outcome == "deadline_exceeded":
            self.timed_out += 1

    def snapshot(self) -> RequestStats:
        return RequestStats(
            arrived=self.arrived,
            completed=self.done,
            service_s=self.service_s,
            service_sq_s2=self.service_sq_s2,
            wait_s=self.wait_s,
            rejected=self.rejected,
            timed_out=self.timed_out,
            concurrency_sum=self.c_sum,
            concurrency_sq_sum=self.c_sq,
            concurrency_service_s=self.c_s,
        )


def build_handle_report(
    *,
    handle_id: str,
    app: str,
    deployment: str,
    seq: int,
    sent_at: float,
    queued_requests: float,
    running: Mapping[str, float],
    carried_health: Iterable[HealthStatus],
    local_health: Iterable[HealthStatus] = (),
    membership_epoch: int,
    stats: RequestStats | None = None,
) -> HandleReport:
    return HandleReport(
        handle_id=handle_id,
        app=app,
        deployment=deployment,
        sent_at=sent_at,
        seq=seq,
        queued_requests=max(0.0, float(queued_requests)),
        running={rid: max(0.0, float(v)) for rid, v in running.items()},
        health=merge_health(carried_health, local_health),
        membership_epoch=membership_epoch,
        stats=stats,
    )


def report_width(report: HandleReport) -> int:
    """Replicas a report covers (rows in the columnar form)."""
    return len(report.running.keys() | {h.replica_id for h in report.health})


def encode_handle_report(
    report: HandleReport, *, columnar_min_replicas: int, max_payload: int
) -> list[bytes]:
    """Encode for publishing: one msgpack payload below the gate, else columnar parts. A narrow
    report that still does not fit (huge custom metrics) goes columnar too, which splits."""
    if report_width(report) < columnar_min_replicas:
        data = encode(report)
        if len(data) <= max_payload:
            return [data]
    # imported here: pyarrow is for wide reports, and a replica whose user code holds a handle
    # (its router in the same process) must not pay for it in every narrow one
    from shared.wire.columnar import handle_report_to_columnar

    return handle_report_to_columnar(report, max_payload)

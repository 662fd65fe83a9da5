"""Prometheus metrics of the routers in this process (docs/metrics.md), on the default registry.

Every `Router` (the proxy's, the gateway's, a `DeploymentHandle`'s) labels its samples with its
app and deployment; routers of one deployment in one process add up. A router binds its label
children once (`RouterMetrics`), so a request costs one histogram observation and nothing else
here; the queue gauge moves only for requests that wait.
"""

from __future__ import annotations

import asyncio
from typing import Final

# the classes, not the package: in a replica its __init__ (exposition, collectors) is deferred
# (services/replica/metrics.py, ~1.2 MB), and a replica holding a handle runs a router
from prometheus_client.metrics import Counter, Gauge, Histogram

from services.router.errors import (
    BackPressureError,
    DeadlineExceeded,
    ReplicaLostError,
    RequestFailed,
    ResponseLostError,
    RouterClosedError,
    RouterError,
)
from shared.errors import BusError
from shared.metrics_catalog import REQUEST_LATENCY_BUCKETS_S, LatencyByOutcome

REPLICA_CODES: Final = frozenset(
    {
        "bad_request",
        "method_not_found",
        "user_error",
        "deadline_exceeded",
        "replica_shutdown",
        "bad_response",
    }
)
"""`RequestFailed.code`s kept as outcomes; any other code is "failed" (labels stay bounded)."""
OK: Final = "ok"

REQUEST_SECONDS = Histogram(
    "fleetpulse_router_request_duration_seconds",
    "Requests through a router, from the call (queueing included) until the response was read "
    "or the call failed, by outcome",
    ["app", "deployment", "outcome"],
    buckets=REQUEST_LATENCY_BUCKETS_S,
)
QUEUED = Gauge(
    "fleetpulse_router_queued_requests",
    "Requests waiting in a router's queue for a replica slot",
    ["app", "deployment"],
)
RETRIES = Counter(
    "fleetpulse_router_retries_total",
    "Sends a replica did not admit (the router tried again): rejected (the replica was full) "
    "or unreachable (no admission in time, no responders)",
    ["app", "deployment", "reason"],
)
REPORTS = Counter(
    "fleetpulse_router_reports_total", "Handle reports published", ["app", "deployment"]
)


def outcome_of(exc: BaseException) -> str:
    """The `outcome` label of a call that raised `exc`."""
    if isinstance(exc, RequestFailed):
        return exc.code if exc.code in REPLICA_CODES else "failed"
    if isinstance(exc, BackPressureError):
        return "backpressure"
    if isinstance(exc, DeadlineExceeded):
        return "deadline_exceeded"
    if isinstance(exc, ReplicaLostError):
        return "replica_lost"
    if isinstance(exc, ResponseLostError):
        return "response_lost"
    if isinstance(exc, RouterClosedError):
        return "closed"
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    if isinstance(exc, RouterError):
        return "router_error"
    if isinstance(exc, BusError):
        return "bus_error"
    return "error"


class RouterMetrics:
    """One router's label children, bound once."""

    __slots__ = ("_latency", "queued", "rejected", "reports", "unreachable")

    def __init__(self, app: str, deployment: str) -> None:
        self._latency = LatencyByOutcome(REQUEST_SECONDS, app, deployment)
        self.queued = QUEUED.labels(app, deployment)
        self.rejected = RETRIES.labels(app, deployment, "rejected")
        self.unreachable = RETRIES.labels(app, deployment, "unreachable")
        self.reports = REPORTS.labels(app, deployment)

    def observe(self, outcome: str, seconds: float) -> None:
        self._latency.observe(outcome, seconds)

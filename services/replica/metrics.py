"""Prometheus metrics of a replica process (docs/metrics.md), on the default registry.

Served on the replica's `--metrics-port` (off by default: an agent starts many replicas on one
host, and they do not share a port). Labelled by app and deployment, so replicas sharing a
process (tests, composition) add up instead of overwriting each other.

prometheus_client comes in lean (`import_prometheus_lean`): its package `__init__` imports the
exposition (an HTTP server, a WSGI and an ASGI app, the push gateway client: http.server,
urllib.request, wsgiref, html, gzip) and the process/platform/gc collectors, which a replica needs
only when something reads its metrics. The metric classes come from `prometheus_client.metrics`
under a package whose `__init__` runs at the first use of any other name of it (`from
prometheus_client import start_http_server` in serve_metrics, `prometheus_client.REGISTRY` in user
code): the package is then exactly as if imported whole, collectors registered. ~1.2 MB less
resident per replica (scripts/bench/replica_footprint.py).
"""

from __future__ import annotations

import weakref
from typing import Final, Protocol

from shared.leanimport import import_deferred
from shared.transitions import Refused

PROMETHEUS: Final = "prometheus_client"


def import_prometheus_lean() -> bool:
    """The metric classes without prometheus_client's `__init__` until a name of the package is
    used (shared/leanimport.py): no exposition or collectors before then, 1.2 MB less resident.
    False (nothing done) when prometheus_client was imported already."""
    return import_deferred(PROMETHEUS, [f"{PROMETHEUS}.metrics"])


import_prometheus_lean()

from prometheus_client.metrics import Counter, Gauge, Histogram  # noqa: E402  # after the above

from shared.metrics_catalog import REQUEST_LATENCY_BUCKETS_S, LatencyByOutcome  # noqa: E402

OK: Final = "ok"

REQUEST_SECONDS = Histogram(
    "fleetpulse_replica_request_duration_seconds",
    "Admitted requests, from admission until the last reply was sent, by outcome "
    "(ok, or the error code sent: user_error, deadline_exceeded, replica_shutdown, ...)",
    ["app", "deployment", "outcome"],
    buckets=REQUEST_LATENCY_BUCKETS_S,
)
ADMISSIONS = Counter(
    "fleetpulse_replica_admissions_total",
    "Admission decisions, by result: accepted, rejected (at max_ongoing_requests or draining)",
    ["app", "deployment", "result"],
)
ONGOING = Gauge(
    "fleetpulse_replica_ongoing_requests",
    "Admitted requests not yet finished",
    ["app", "deployment"],
)
HTTP_REFUSED = Counter(
    "fleetpulse_replica_http_refused_total",
    "HTTP requests the replica's server refused before the app saw them, by status "
    "(400: not HTTP/1.1 it can parse, 431: a head over 64 KiB); the connection closes",
    ["status"],
)
HEALTH_CHECKS = Counter(
    "fleetpulse_replica_health_checks_total",
    "Runs of the user's health check, by result: healthy, unhealthy (raised or timed out)",
    ["app", "deployment", "result"],
)
HEALTH_MESSAGES = Counter(
    "fleetpulse_replica_health_messages_total",
    "Health statuses sent, by channel: heartbeat, frame (on a held request), report (own "
    "ReplicaReport), probe (answers to pull probes)",
    ["app", "deployment", "channel"],
)

AUTOSCALING_STATS = Counter(
    "fleetpulse_replica_autoscaling_stats_total",
    "Calls of the deployment's record_autoscaling_stats(), by outcome: ok, or why the report "
    "went without custom metrics (raised, timeout, busy, wrong_type, too_many, bad_name, "
    "not_finite)",
    ["app", "deployment", "outcome"],
)
TRANSITIONS_REFUSED = Counter(
    "fleetpulse_replica_transitions_refused_total",
    "Lifecycle steps refused as illegal in the replica's own state (the state stayed)",
    ["machine", "state", "event"],
)


class Ongoing(Protocol):
    """What the ongoing gauge reads (admission.Admission)."""

    ongoing: int


class _OngoingSum:
    """The ongoing gauge of one (app, deployment), read when scraped: the sum over its replicas
    in this process (tests, composition), so a request costs no gauge update on its way."""

    __slots__ = ("sources",)

    def __init__(self) -> None:
        self.sources: weakref.WeakSet[Ongoing] = weakref.WeakSet()

    def __call__(self) -> float:
        return float(sum(source.ongoing for source in list(self.sources)))


_ONGOING_SUMS: dict[tuple[str, str], _OngoingSum] = {}


class ReplicaMetrics:
    """One replica's label children, bound once. `admission` (its `ongoing` count) is what the
    ongoing gauge reads."""

    __slots__ = (
        "_app",
        "_deployment",
        "_latency",
        "accepted",
        "frames",
        "healthy",
        "heartbeats",
        "probes",
        "rejected",
        "reports",
        "unhealthy",
    )

    def __init__(self, app: str, deployment: str, admission: Ongoing) -> None:
        self._app, self._deployment = app, deployment
        self._latency = LatencyByOutcome(REQUEST_SECONDS, app, deployment)
        self.accepted = ADMISSIONS.labels(app, deployment, "accepted")
        self.rejected = ADMISSIONS.labels(app, deployment, "rejected")
        ongoing = _ONGOING_SUMS.get((app, deployment))
        if ongoing is None:
            ongoing = _ONGOING_SUMS[app, deployment] = _OngoingSum()
            ONGOING.labels(app, deployment).set_function(ongoing)
        ongoing.sources.add(admission)
        self.healthy = HEALTH_CHECKS.labels(app, deployment, "healthy")
        self.unhealthy = HEALTH_CHECKS.labels(app, deployment, "unhealthy")
        self.heartbeats = HEALTH_MESSAGES.labels(app, deployment, "heartbeat")
        self.frames = HEALTH_MESSAGES.labels(app, deployment, "frame")
        self.reports = HEALTH_MESSAGES.labels(app, deployment, "report")
        self.probes = HEALTH_MESSAGES.labels(app, deployment, "probe")

    def observe(self, outcome: str, seconds: float) -> None:
        self._latency.observe(outcome, seconds)

    def autoscaling_stats(self, outcome: str) -> None:
        AUTOSCALING_STATS.labels(self._app, self._deployment, outcome).inc()

    @staticmethod
    def transition_refused(r: Refused) -> None:
        TRANSITIONS_REFUSED.labels(r.machine, r.state, r.event).inc()

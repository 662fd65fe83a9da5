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

from bisect import bisect_left
from collections.abc import Iterable
from itertools import accumulate
from typing import Final, NamedTuple, Protocol

from shared.leanimport import import_deferred
from shared.transitions import Refused

PROMETHEUS: Final = "prometheus_client"


def import_prometheus_lean() -> bool:
    """The metric classes without prometheus_client's `__init__` until a name of the package is
    used (shared/leanimport.py): no exposition or collectors before then, 1.2 MB less resident.
    False (nothing done) when prometheus_client was imported already."""
    return import_deferred(PROMETHEUS, [f"{PROMETHEUS}.metrics"])


import_prometheus_lean()

# after the lean import above (E402)
from prometheus_client.metrics import Counter  # noqa: E402
from prometheus_client.metrics_core import (  # noqa: E402
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import REGISTRY, Collector  # noqa: E402
from prometheus_client.utils import floatToGoString  # noqa: E402

from shared.metrics_catalog import REQUEST_LATENCY_BUCKETS_S  # noqa: E402

OK: Final = "ok"

REQUEST_SECONDS_NAME: Final = "fleetpulse_replica_request_duration_seconds"
REQUEST_SECONDS_HELP: Final = (
    "Admitted requests, from admission until the last reply was sent, by outcome "
    "(ok, or the error code sent: user_error, deadline_exceeded, replica_shutdown, ...)"
)
ADMISSIONS_NAME: Final = "fleetpulse_replica_admissions"  # exposed with _total
ADMISSIONS_HELP: Final = (
    "Admission decisions, by result: accepted, rejected (at max_ongoing_requests or draining)"
)
ONGOING_NAME: Final = "fleetpulse_replica_ongoing_requests"
ONGOING_HELP: Final = "Admitted requests not yet finished"
_BOUNDS: Final = tuple(REQUEST_LATENCY_BUCKETS_S)
# the `le` labels as prometheus_client's Histogram writes them ("0.001", "1.0", "+Inf")
_LE: Final = (*(floatToGoString(b) for b in _BOUNDS), "+Inf")  # type: ignore[no-untyped-call]
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


class Counts(Protocol):
    """What the request metrics read of a replica's admission (admission.Admission)."""

    @property
    def ongoing(self) -> int: ...


class Totals(Protocol):
    """...and of its running totals (runtime.ReplicaStats)."""

    @property
    def admitted(self) -> int: ...

    @property
    def rejected(self) -> int: ...


class Durations:
    """One replica's request durations by outcome, as histogram bucket counts: an observation
    is a bisect and two additions, no lock (prometheus_client's Histogram takes two locks and
    walks its buckets in Python: ~0.7 us of a ~25 us request path)."""

    __slots__ = ("by_outcome",)

    def __init__(self) -> None:
        self.by_outcome: dict[str, list[float]] = {}
        """Per outcome: the count in each bucket (the last is +Inf), then the sum of seconds."""

    def observe(self, outcome: str, seconds: float) -> None:
        row = self.by_outcome.get(outcome)
        if row is None:
            row = self.by_outcome[outcome] = [0.0] * (len(_BOUNDS) + 2)
        row[bisect_left(_BOUNDS, seconds)] += 1
        row[-1] += seconds


class _Replica(NamedTuple):
    admission: Counts
    totals: Totals
    durations: Durations


class _RequestMetrics(Collector):
    """The replicas' request metrics (ongoing, admissions, durations), read when scraped from
    the numbers each replica keeps anyway, summed over the replicas of an (app, deployment) in
    this process (tests, composition). A stopped replica stays in the sums (its ongoing count
    is 0 by then), so the counters never go down."""

    def __init__(self) -> None:
        self.replicas: dict[tuple[str, str], list[_Replica]] = {}

    def add(self, app: str, deployment: str, replica: _Replica) -> None:
        self.replicas.setdefault((app, deployment), []).append(replica)

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        ongoing, admissions, durations = self._families()
        # the scrape runs on the metrics server's thread; list() copies under the GIL while
        # the loop's thread may add a replica or an outcome
        for (app, deployment), replicas in list(self.replicas.items()):
            replicas = list(replicas)
            ongoing.add_metric([app, deployment], sum(r.admission.ongoing for r in replicas))
            accepted = sum(r.totals.admitted for r in replicas)
            admissions.add_metric([app, deployment, "accepted"], accepted)
            rejected = sum(r.totals.rejected for r in replicas)
            admissions.add_metric([app, deployment, "rejected"], rejected)
            rows: dict[str, list[float]] = {}
            for r in replicas:
                for outcome, row in list(r.durations.by_outcome.items()):
                    into = rows.setdefault(outcome, [0.0] * len(row))
                    for i, value in enumerate(list(row)):
                        into[i] += value
            for outcome, row in sorted(rows.items()):
                cumulative = list(accumulate(row[:-1]))
                buckets = list(zip(_LE, cumulative, strict=True))
                durations.add_metric([app, deployment, outcome], buckets, row[-1])
        return [ongoing, admissions, durations]

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, CounterMetricFamily, HistogramMetricFamily]:
        return (
            GaugeMetricFamily(ONGOING_NAME, ONGOING_HELP, labels=["app", "deployment"]),
            CounterMetricFamily(
                ADMISSIONS_NAME, ADMISSIONS_HELP, labels=["app", "deployment", "result"]
            ),
            HistogramMetricFamily(
                REQUEST_SECONDS_NAME, REQUEST_SECONDS_HELP, labels=["app", "deployment", "outcome"]
            ),
        )


REQUESTS = _RequestMetrics()
REGISTRY.register(REQUESTS)
COLLECTORS: Final = (REQUESTS,)
"""This module's metrics that are not metric objects (tests/unit/test_metrics_catalog.py)."""


class ReplicaMetrics:
    """One replica's label children, bound once; its request metrics (`REQUESTS`) read
    `admission`'s ongoing count and the runtime's `totals` (admitted, rejected) when scraped."""

    __slots__ = (
        "_app",
        "_deployment",
        "durations",
        "frames",
        "healthy",
        "heartbeats",
        "probes",
        "reports",
        "unhealthy",
    )

    def __init__(self, app: str, deployment: str, admission: Counts, totals: Totals) -> None:
        self._app, self._deployment = app, deployment
        self.durations = Durations()
        REQUESTS.add(app, deployment, _Replica(admission, totals, self.durations))
        self.healthy = HEALTH_CHECKS.labels(app, deployment, "healthy")
        self.unhealthy = HEALTH_CHECKS.labels(app, deployment, "unhealthy")
        self.heartbeats = HEALTH_MESSAGES.labels(app, deployment, "heartbeat")
        self.frames = HEALTH_MESSAGES.labels(app, deployment, "frame")
        self.reports = HEALTH_MESSAGES.labels(app, deployment, "report")
        self.probes = HEALTH_MESSAGES.labels(app, deployment, "probe")

    def observe(self, outcome: str, seconds: float) -> None:
        self.durations.observe(outcome, seconds)

    def autoscaling_stats(self, outcome: str) -> None:
        AUTOSCALING_STATS.labels(self._app, self._deployment, outcome).inc()

    @staticmethod
    def transition_refused(r: Refused) -> None:
        TRANSITIONS_REFUSED.labels(r.machine, r.state, r.event).inc()

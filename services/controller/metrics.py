"""Prometheus metrics of the controller (docs/metrics.md), on the process-wide default registry.

The service updates them; the core only counts (CoreStats) and returns actions. Nothing here is
touched per message: ingest counts go into plain dicts and are moved here once per tick.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Final

from prometheus_client import Counter, Gauge, Histogram

from shared.kv.status import AppStatusView

from . import custom_policy
from .core import CoreStats, Event
from .health_registry import VerdictReason
from .stall_guard import StallState

LOOP_SECONDS = Histogram(
    "fleetpulse_controller_loop_seconds",
    "Duration of one control-loop tick (decide + KV writes)",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
)
INGEST_MESSAGES = Counter(
    "fleetpulse_controller_ingest_messages_total",
    "Report messages read from FP_REPORTS, by kind and wire format (before validation)",
    ["kind", "format"],
)
INGEST_BYTES = Counter(
    "fleetpulse_controller_ingest_bytes_total",
    "Report payload bytes read from FP_REPORTS, by kind and wire format",
    ["kind", "format"],
)
HEARTBEATS = Counter(
    "fleetpulse_controller_heartbeats_received_total", "Replica heartbeats read from FP_REPORTS"
)
INGESTED = Counter(
    "fleetpulse_controller_ingested_total",
    "Reports the core processed, by kind and gate outcome (e.g. columnar_accepted, heartbeat)",
    ["kind"],
)
REJECTED = Counter(
    "fleetpulse_controller_rejected_total",
    "Report messages that changed nothing, by reason: invalid (a wire reason, bad_subject, "
    "unknown_deployment) or turned away (stale, duplicate, unknown_replica)",
    ["reason"],
)
BAD_INPUT = Counter(
    "fleetpulse_controller_bad_input_total",
    "Invalid input dropped, by reason (reports, and fp_apps / fp_agents values)",
    ["reason"],
)
PROBES = Counter("fleetpulse_controller_probes_total", "Pull probes sent")
PROBE_OUTCOMES = Counter(
    "fleetpulse_controller_probe_outcomes_total", "Pull probe outcomes", ["outcome"]
)
PROBES_IN_FLIGHT = Gauge(
    "fleetpulse_controller_probes_in_flight", "Pull probes sent and not yet answered or timed out"
)
VERDICTS = Counter(
    "fleetpulse_controller_health_verdicts_total",
    "Replicas judged unhealthy (healthy -> unhealthy: replaced), by reason",
    ["reason"],
)
HEALTH_REPLICAS = Gauge(
    "fleetpulse_controller_health_replicas",
    "Live replicas without a verdict, by health freshness (stale: no fresh push, probed)",
    ["state"],
)
STALLED = Gauge(
    "fleetpulse_controller_stalled", "1 while the stall guard holds absence verdicts back"
)
DECISIONS = Counter(
    "fleetpulse_controller_decisions_total",
    "Autoscaling decisions that moved a deployment's target, by direction and policy rule",
    ["app", "deployment", "direction", "rule"],
)
REPLICAS = Gauge(
    "fleetpulse_controller_replicas",
    "Replicas of an owned deployment by state: target, running, healthy, unhealthy "
    "(as last written to fp_status)",
    ["app", "deployment", "state"],
)
DEMAND = Gauge(
    "fleetpulse_controller_demand",
    "Ongoing + queued requests of an owned deployment (as last written to fp_status)",
    ["app", "deployment"],
)
PENDING = Gauge(
    "fleetpulse_controller_ingest_pending",
    "Messages of an owned FP_REPORTS partition not yet delivered to this controller",
    ["partition"],
)
PARTITIONS = Gauge(
    "fleetpulse_controller_partitions_owned", "FP_REPORTS partitions this member owns"
)
EVENTS = Counter("fleetpulse_controller_events_total", "Controller events by kind", ["kind"])
TRANSITIONS_REFUSED = Counter(
    "fleetpulse_controller_transitions_refused_total",
    "Lifecycle events refused as illegal in the replica's state (the state stayed)",
    ["machine", "state", "event"],
)
ACTION_ERRORS = Counter(
    "fleetpulse_controller_action_errors_total",
    "Actions that failed (a KV write or delete), by action",
    ["action"],
)
CUSTOM_POLICY_CALLS = Counter(
    "fleetpulse_controller_custom_policy_calls_total",
    "Ticks of a deployment with a custom autoscaling policy, by outcome: ok, clipped (into"
    " [min, max]), and the fallbacks to the default policy: raised, bad_value, not_loaded,"
    " timeout, crashed, unavailable, quarantined",
    ["app", "deployment", "outcome"],
)
CUSTOM_POLICY_SLOW = Counter(
    "fleetpulse_controller_custom_policy_slow_total",
    "Custom policy calls slower than 10 ms (they delay the member's control tick)",
    ["app", "deployment"],
)
CUSTOM_POLICY_SECONDS = Histogram(
    "fleetpulse_controller_custom_policy_seconds",
    "Duration of one custom autoscaling policy call",
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 1.0),
)
CUSTOM_POLICY_QUARANTINES = Counter(
    "fleetpulse_controller_custom_policy_quarantines_total",
    "Custom policies quarantined (not called for a while) after timing out or crashing their"
    " worker process several times in a row",
    ["app", "deployment"],
)
CUSTOM_POLICY_RESTARTS = Counter(
    "fleetpulse_controller_custom_policy_worker_restarts_total",
    "Restarts of the member's custom policy worker process, by reason: timeout, crashed,"
    " import_timeout, start_timeout, start_failed",
    ["reason"],
)
CUSTOM_POLICY_WAIT = Histogram(
    "fleetpulse_controller_custom_policy_wait_seconds",
    "How long one control tick waited for its custom policies' answers from the worker process",
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 1.0, 2.5),
)

REPLICA_STATES: Final = ("target", "running", "healthy", "unhealthy")

_KIND_FORMAT: Final = {
    "handle_columnar": ("handle", "columnar"),
    "handle_msgpack": ("handle", "msgpack"),
    "replica": ("replica", "msgpack"),
    "heartbeat": ("heartbeat", "msgpack"),
    "lifecycle": ("lifecycle", "msgpack"),
}
"""`stats.ingest_kind` -> the (kind, format) labels; anything else (a junk subject) is "other"."""
_VERDICT_REASONS: Final = frozenset(r.label for r in VerdictReason)


class Exporter:
    """Moves what one controller service saw into the metrics above.

    The service counts messages straight into `ingest_n`/`ingest_b` (plain dict increments on
    the hot path); `tick` moves those and the core's cumulative counters into Prometheus once per
    control tick, over label sets that do not grow with the fleet. Per-deployment gauges follow
    the statuses the service writes (the core already limits those: on change, else every few
    seconds), and are removed when an app is deleted or its partition handed over, so two
    members never both export one deployment.
    """

    def __init__(self) -> None:
        self.ingest_n: defaultdict[str, int] = defaultdict(int)
        self.ingest_b: defaultdict[str, int] = defaultdict(int)
        self._exported: dict[tuple[str, str], int] = {}
        self._gauged: dict[str, set[str]] = {}
        self._children: dict[tuple[str, str], tuple[Gauge, ...]] = {}
        """(app, deployment) -> its replica-count gauges and demand gauge: `labels()` looks a
        child up by hashing its label values, five per status write (1% of a busy member)."""

    def tick(
        self, stats: CoreStats, stall: StallState | None, pending: Mapping[int, int | None]
    ) -> None:
        for family, counts, metrics in (
            ("dropped", stats.dropped, (BAD_INPUT, REJECTED)),
            ("turned_away", stats.turned_away, (REJECTED,)),
            ("ingested", stats.ingested, (INGESTED,)),
        ):
            for label, value in counts.items():
                last = self._exported.get((family, label), 0)
                if value > last:
                    for metric in metrics:
                        metric.labels(label).inc(value - last)
                    self._exported[(family, label)] = value
        self._ingest()
        self._custom_policies()
        HEALTH_REPLICAS.labels("stale").set(stats.stale)
        HEALTH_REPLICAS.labels("fresh").set(stats.known - stats.stale)
        STALLED.set(1 if stall is not None and stall.stalled else 0)
        PARTITIONS.set(len(pending))
        for p, n in pending.items():
            PENDING.labels(str(p)).set(n or 0)

    def _ingest(self) -> None:
        counts, sizes = self.ingest_n, self.ingest_b
        if not counts:
            return
        self.ingest_n, self.ingest_b = defaultdict(int), defaultdict(int)
        for raw, n in counts.items():
            kind, fmt = _KIND_FORMAT.get(raw, ("other", "msgpack"))
            INGEST_MESSAGES.labels(kind, fmt).inc(n)
            INGEST_BYTES.labels(kind, fmt).inc(sizes[raw])
            if kind == "heartbeat":
                HEARTBEATS.inc(n)

    @staticmethod
    def _custom_policies() -> None:
        t = custom_policy.TELEMETRY.drain()
        for (app, deployment, outcome), n in t.calls.items():
            CUSTOM_POLICY_CALLS.labels(app, deployment, outcome).inc(n)
        for (app, deployment), n in t.slow.items():
            CUSTOM_POLICY_SLOW.labels(app, deployment).inc(n)
        for seconds in t.durations:
            CUSTOM_POLICY_SECONDS.observe(seconds)
        for (app, deployment), n in t.quarantines.items():
            CUSTOM_POLICY_QUARANTINES.labels(app, deployment).inc(n)
        for reason, n in t.restarts.items():
            CUSTOM_POLICY_RESTARTS.labels(reason).inc(n)
        for seconds in t.batches:
            CUSTOM_POLICY_WAIT.observe(seconds)

    @staticmethod
    def event(a: Event) -> None:
        EVENTS.labels(a.kind).inc()
        if a.refused is not None:
            TRANSITIONS_REFUSED.labels(a.refused.machine, a.refused.state, a.refused.event).inc()
        if a.kind == "decision" and a.direction:
            DECISIONS.labels(a.app, a.deployment, a.direction, a.rule).inc()
        elif a.kind == "replica_unhealthy":
            # the detail is a VerdictReason label, or "agent {id} lost": a label stays bounded
            reason = a.detail if a.detail in _VERDICT_REASONS else "agent_lost"
            VERDICTS.labels(reason).inc()

    def status(self, view: AppStatusView) -> None:
        app = view.app
        names = set(view.deployments)
        for gone in self._gauged.get(app, set()) - names:
            self._remove(app, gone)
        self._gauged[app] = names
        for name, d in view.deployments.items():
            gauges = self._children.get((app, name))
            if gauges is None:
                gauges = self._children[(app, name)] = (
                    *(REPLICAS.labels(app, name, state) for state in REPLICA_STATES),
                    DEMAND.labels(app, name),
                )
            target, running, healthy, unhealthy, demand = gauges
            target.set(d.target_replicas)
            running.set(d.running_replicas)
            healthy.set(d.healthy_replicas)
            unhealthy.set(d.unhealthy_replicas)
            demand.set(d.demand)

    def forget_app(self, app: str) -> None:
        for name in self._gauged.pop(app, set()):
            self._remove(app, name)

    def forget_partition(self, partition: int, owner: Callable[[str], int]) -> None:
        with contextlib.suppress(KeyError):
            PENDING.remove(str(partition))
        for app in [a for a in self._gauged if owner(a) == partition]:
            self.forget_app(app)

    def _remove(self, app: str, deployment: str) -> None:
        self._children.pop((app, deployment), None)
        _remove(app, deployment)


def _remove(app: str, deployment: str) -> None:
    with contextlib.suppress(KeyError):
        DEMAND.remove(app, deployment)
    for state in REPLICA_STATES:
        with contextlib.suppress(KeyError):
            REPLICAS.remove(app, deployment, state)

"""Prometheus metrics of the node agent (docs/metrics.md), on the default registry.

The per-agent gauges carry the agent id, so agents sharing a process (tests, `fleetpulse up`)
do not overwrite each other.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

RUNNING = Gauge(
    "fleetpulse_agent_replicas_running",
    "Replica processes of this agent not yet exited (starting, serving or draining)",
    ["agent"],
)
CAPACITY = Gauge(
    "fleetpulse_agent_capacity", "Replica processes this agent runs at most", ["agent"]
)
STARTS = Counter("fleetpulse_agent_replica_starts_total", "Replica processes started")
SPARE_STARTS = Counter(
    "fleetpulse_agent_replica_spare_starts_total",
    "Replica processes started in a spare (its imports done ahead, spare.py); the rest of "
    "fleetpulse_agent_replica_starts_total were cold starts",
)
START_FAILURES = Counter(
    "fleetpulse_agent_replica_start_failures_total", "Replica processes that could not be spawned"
)
STOPS = Counter("fleetpulse_agent_replica_stops_total", "Replicas sent SIGTERM (drain)")
KILLS = Counter("fleetpulse_agent_replica_kills_total", "Replicas sent SIGKILL after the deadline")
EXITS = Counter("fleetpulse_agent_replica_exits_total", "Replica process exits by code", ["code"])
TRANSITIONS_REFUSED = Counter(
    "fleetpulse_agent_transitions_refused_total",
    "Replica process events refused as illegal in the child's phase (the phase stayed)",
    ["machine", "state", "event"],
)
BAD_TARGETS = Counter(
    "fleetpulse_agent_bad_targets_total", "fp_targets values dropped as invalid", ["reason"]
)

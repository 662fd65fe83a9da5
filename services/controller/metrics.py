"""Prometheus metrics of the controller (documented in docs/operations.md)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

LOOP_SECONDS = Histogram(
    "fleetpulse_controller_loop_seconds",
    "Duration of one control-loop tick (decide + KV writes)",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
)
INGEST_BYTES = Counter("fleetpulse_controller_ingest_bytes_total", "Report bytes ingested")
BAD_INPUT = Counter(
    "fleetpulse_controller_bad_input_total", "Messages dropped as invalid, by reason", ["reason"]
)
PROBES = Counter("fleetpulse_controller_probes_total", "Pull probes sent")
PROBE_OUTCOMES = Counter(
    "fleetpulse_controller_probe_outcomes_total", "Pull probe outcomes", ["outcome"]
)
EVENTS = Counter("fleetpulse_controller_events_total", "Controller events by kind", ["kind"])
INGESTED = Counter(
    "fleetpulse_controller_ingested_total", "Reports ingested, by kind and outcome", ["kind"]
)

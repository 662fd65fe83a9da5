"""Prometheus metrics of the auth callout (docs/metrics.md), on the default registry."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

DECISIONS = Counter(
    "fleetpulse_auth_decisions_total",
    "Connections the auth callout answered, by result (granted, refused) and role or reason",
    ["result", "why"],
)
BAD_REQUESTS = Counter(
    "fleetpulse_auth_bad_requests_total",
    "Authorization requests dropped as invalid (not answered), by reason",
    ["reason"],
)
SECONDS = Histogram(
    "fleetpulse_auth_request_seconds",
    "Time from an authorization request's arrival to its answer",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)

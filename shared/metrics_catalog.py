"""The Prometheus metric families each fleetpulse service exposes, and the `--metrics-port` flag.

`METRIC_NAMES` lists families as they appear in the text exposition (`# TYPE` lines): counters
with their `_total` suffix, histograms by their base name (`_bucket`, `_sum` and `_count` follow).
docs/metrics.md describes each one; tests/unit/test_metrics_catalog.py checks that every name here
is registered by that service's metrics module, and that nothing a module registers is missing.

Where they are served: every service but the proxy on `--metrics-port` (default
`$FLEETPULSE_METRICS_PORT`, else 0: off), the proxy on `/metrics` of its HTTP port. A process
serves the whole default registry, so a process that calls deployments (the proxy, the gateway, a
replica using a `DeploymentHandle`) shows the router families too.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from shared import settings

if TYPE_CHECKING:  # types only: a replica imports it lean (replica/metrics.py: 1.2 MB less)
    from prometheus_client import Histogram

log = logging.getLogger(__name__)

REQUEST_LATENCY_BUCKETS_S: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)  # fmt: skip
"""Request latency buckets of the replica, router and proxy: up to the proxy's hold bound and
beyond, so a request that waited through a cold start lands in the tail, not off the scale."""


class LatencyByOutcome:
    """One deployment's children of an (app, deployment, outcome) histogram, made on first use:
    `labels()` costs a lock and a dict lookup, too much for every request."""

    __slots__ = ("_app", "_children", "_deployment", "_histogram")

    def __init__(self, histogram: Histogram, app: str, deployment: str) -> None:
        self._histogram, self._app, self._deployment = histogram, app, deployment
        self._children: dict[str, Histogram] = {}

    def observe(self, outcome: str, seconds: float) -> None:
        child = self._children.get(outcome)
        if child is None:
            child = self._children[outcome] = self._histogram.labels(
                self._app, self._deployment, outcome
            )
        child.observe(seconds)


ENV_METRICS_PORT: Final = str(settings.METRICS_PORT.env)

METRIC_NAMES: Final[dict[str, tuple[str, ...]]] = {
    "controller": (
        "fleetpulse_controller_loop_seconds",
        "fleetpulse_controller_ingest_messages_total",
        "fleetpulse_controller_ingest_bytes_total",
        "fleetpulse_controller_heartbeats_received_total",
        "fleetpulse_controller_ingested_total",
        "fleetpulse_controller_rejected_total",
        "fleetpulse_controller_bad_input_total",
        "fleetpulse_controller_probes_total",
        "fleetpulse_controller_probe_outcomes_total",
        "fleetpulse_controller_probes_in_flight",
        "fleetpulse_controller_health_verdicts_total",
        "fleetpulse_controller_health_replicas",
        "fleetpulse_controller_stalled",
        "fleetpulse_controller_decisions_total",
        "fleetpulse_controller_replicas",
        "fleetpulse_controller_demand",
        "fleetpulse_controller_ingest_pending",
        "fleetpulse_controller_partitions_owned",
        "fleetpulse_controller_events_total",
        "fleetpulse_controller_transitions_refused_total",
        "fleetpulse_controller_action_errors_total",
        "fleetpulse_controller_custom_policy_calls_total",
        "fleetpulse_controller_custom_policy_slow_total",
        "fleetpulse_controller_custom_policy_seconds",
        "fleetpulse_controller_custom_policy_quarantines_total",
        "fleetpulse_controller_custom_policy_worker_restarts_total",
        "fleetpulse_controller_custom_policy_wait_seconds",
    ),
    "agent": (
        "fleetpulse_agent_replicas_running",
        "fleetpulse_agent_capacity",
        "fleetpulse_agent_replica_starts_total",
        "fleetpulse_agent_replica_spare_starts_total",
        "fleetpulse_agent_replica_start_failures_total",
        "fleetpulse_agent_replica_stops_total",
        "fleetpulse_agent_replica_kills_total",
        "fleetpulse_agent_transitions_refused_total",
        "fleetpulse_agent_replica_exits_total",
        "fleetpulse_agent_bad_targets_total",
    ),
    "proxy": (
        "fleetpulse_proxy_request_duration_seconds",
        "fleetpulse_proxy_held_requests",
        "fleetpulse_proxy_held_outcomes_total",
        "fleetpulse_proxy_registry_apps",
        "fleetpulse_proxy_app_registered",
        "fleetpulse_proxy_registry_changes_total",
        "fleetpulse_proxy_stream_errors_total",
        "fleetpulse_proxy_route_publish_errors_total",
        "fleetpulse_proxy_front_changes_total",
        "fleetpulse_proxy_front_errors_total",
        "fleetpulse_proxy_front_servers",
        "fleetpulse_proxy_front_responses_total",
        "fleetpulse_proxy_front_queued_requests",
        "fleetpulse_proxy_front_response_time_seconds",
    ),
    "router": (
        "fleetpulse_router_request_duration_seconds",
        "fleetpulse_router_queued_requests",
        "fleetpulse_router_retries_total",
        "fleetpulse_router_reports_total",
    ),
    "replica": (
        "fleetpulse_replica_request_duration_seconds",
        "fleetpulse_replica_admissions_total",
        "fleetpulse_replica_ongoing_requests",
        "fleetpulse_replica_http_refused_total",
        "fleetpulse_replica_health_checks_total",
        "fleetpulse_replica_health_messages_total",
        "fleetpulse_replica_autoscaling_stats_total",
        "fleetpulse_replica_transitions_refused_total",
    ),
    "recorder": (
        "fleetpulse_recorder_messages_total",
        "fleetpulse_recorder_payload_bytes_total",
        "fleetpulse_recorder_written_bytes_total",
        "fleetpulse_recorder_files_total",
        "fleetpulse_recorder_write_errors_total",
        "fleetpulse_recorder_pending_rows",
    ),
    "auth": (
        "fleetpulse_auth_decisions_total",
        "fleetpulse_auth_bad_requests_total",
        "fleetpulse_auth_request_seconds",
    ),
}


ENV_METRICS_HOST: Final = str(settings.METRICS_HOST.env)


def add_metrics_port_argument(p: argparse.ArgumentParser) -> None:
    """`--metrics-port` (shared/settings.py METRICS_PORT): default None, the config's builder
    resolves it (`metrics_port(args, env)`)."""
    settings.METRICS_PORT.add_flag(p)


def metrics_port(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    """--metrics-port, else $FLEETPULSE_METRICS_PORT, else 0 (off); read when the config is
    built. A bad value is a ConfigError naming the flag or the variable."""
    port: int = settings.METRICS_PORT.resolve(args.metrics_port, os.environ if env is None else env)
    return port


def serve_metrics(port: int, service: str, env: Mapping[str, str] | None = None) -> None:
    """Serve the default registry on `port` (0: do nothing) at $FLEETPULSE_METRICS_HOST
    (default 127.0.0.1), from a daemon thread."""
    if not port:
        return
    from prometheus_client import start_http_server

    host = settings.METRICS_HOST.resolve(None, os.environ if env is None else env)
    start_http_server(port, addr=host)
    log.info("%s: Prometheus metrics on %s:%d/metrics", service, host, port)

"""The proxy's Prometheus metrics, on their own registry (served on `/metrics` by the proxy).

A registry per `ProxyServer` keeps several proxies in one process (tests, `fleetpulse up`) from
colliding in the process-wide default registry. `/metrics` shows the default registry as well:
the proxy's routers (services/router/metrics.py) and the process collectors live there.
"""

from __future__ import annotations

import contextlib
from typing import Final

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from services.proxy.haproxy_stats import FrontStats
from services.proxy.registry import RouteTable
from shared.metrics_catalog import REQUEST_LATENCY_BUCKETS_S

NO_APP: Final = ""
"""The `app` label of requests that matched no application."""


class ProxyMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.latency = Histogram(
            "fleetpulse_proxy_request_duration_seconds",
            "HTTP requests through the proxy, until the last byte of the response",
            ["app", "code"],
            buckets=REQUEST_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.held = Gauge(
            "fleetpulse_proxy_held_requests",
            "Requests held while their app wakes from zero",
            ["app"],
            registry=self.registry,
        )
        self.held_outcomes = Counter(
            "fleetpulse_proxy_held_outcomes_total",
            "Held requests by outcome: admitted, full (refused), timeout, deregistered, failed",
            ["app", "outcome"],
            registry=self.registry,
        )
        self.apps = Gauge(
            "fleetpulse_proxy_registry_apps",
            "Applications the proxy knows, by whether they are registered (serviceable)",
            ["registered"],
            registry=self.registry,
        )
        self.app_registered = Gauge(
            "fleetpulse_proxy_app_registered",
            "1 when the application is registered, 0 when it is known but not serviceable",
            ["app"],
            registry=self.registry,
        )
        self.registry_changes = Counter(
            "fleetpulse_proxy_registry_changes_total",
            "Applications that became registered or deregistered",
            ["app", "to"],
            registry=self.registry,
        )
        self.stream_errors = Counter(
            "fleetpulse_proxy_stream_errors_total",
            "Streamed responses cut short after the head was sent (the connection is closed)",
            ["app"],
            registry=self.registry,
        )
        self.publish_errors = Counter(
            "fleetpulse_proxy_route_publish_errors_total",
            "Failed writes of the registry to KV fp_routes",
            registry=self.registry,
        )

        self.front_changes = Counter(
            "fleetpulse_proxy_front_changes_total",
            "Changes applied to the HAProxy front door: runtime (a command over the admin "
            "socket, no reload) or reload (a new configuration)",
            ["kind"],
            registry=self.registry,
        )
        self.front_errors = Counter(
            "fleetpulse_proxy_front_errors_total",
            "Front door failures: runtime (a command failed; a reload follows), apply (a change "
            "could not be applied; retried), exited (HAProxy died; restarted)",
            ["kind"],
            registry=self.registry,
        )
        self.front_servers = Gauge(
            "fleetpulse_proxy_front_servers",
            "Replicas HAProxy sends an app's requests to directly",
            ["app"],
            registry=self.registry,
        )

        self.front_stats = FrontStats()
        """What HAProxy saw of the requests it sent straight to replicas (the front door fills it)."""
        self.registry.register(self.front_stats)

    def observe(self, app: str, code: int | str, seconds: float) -> None:
        self.latency.labels(app, str(code)).observe(seconds)

    def set_registry(self, old: RouteTable, new: RouteTable) -> None:
        registered = new.registered
        self.apps.labels("true").set(registered)
        self.apps.labels("false").set(len(new.routes) - registered)
        for app in old.routes.keys() - new.routes.keys():
            with contextlib.suppress(KeyError):  # never set if it came and went in one update
                self.app_registered.remove(app)
        for app, route in new.routes.items():
            self.app_registered.labels(app).set(1 if route.registered else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry) + generate_latest(REGISTRY)

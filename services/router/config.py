"""Router and gateway configuration: frozen dataclasses built once from flags and environment.

`RouterConfig()` holds the defaults a `DeploymentHandle` uses; `RouterConfig.from_env()` applies the
`FLEETPULSE_*` environment variables (read once, here, never on the request path). The gateway's
`GatewayConfig.from_args(args)` layers command-line flags over the environment over the defaults.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Final

from shared import settings
from shared.errors import ConfigError
from shared.metrics_catalog import add_metrics_port_argument, metrics_port
from shared.subjects import DEFAULT_NAMESPACE, validate_name

ENV_COLUMNAR_MIN_REPLICAS: Final = str(settings.COLUMNAR_MIN_REPLICAS.env)
ENV_METRICS_INTERVAL_S: Final = settings.ROUTER_METRICS_INTERVAL.env
ENV_NAMESPACE: Final = settings.NAMESPACE.env

GATEWAY_SERVICE_NAME: Final = "fleetpulse-router"
GATEWAY_SERVICE_VERSION: Final = "0.1.0"
DEFAULT_GATEWAY_QUEUE_GROUP: Final = settings.GATEWAY_QUEUE_GROUP.default
DEFAULT_GATEWAY_DEADLINE_S: Final = settings.GATEWAY_DEADLINE.default
DEFAULT_DRAIN_TIMEOUT_S: Final[float] = settings.DRAIN_TIMEOUT.default


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """Knobs of one in-process router (shared by every handle of a deployment)."""

    admission_timeout_s: float = settings.ROUTER_ADMISSION_TIMEOUT.default
    """No admission within this long: the request was never admitted; retry elsewhere."""
    max_queued_requests: int = settings.ROUTER_MAX_QUEUED.default
    """Requests waiting for a replica at this handle; one more raises BackPressureError."""
    frame_pump_delay_s: float = 0.2
    """A stream with declared health frames gets a pump only if still pending after this long."""
    liveness_interval_s: float = 1.0
    """Silence on an admitted request for this long sends a probe to the replica."""
    probe_timeout_s: float = 0.5
    metrics_interval_s: float = settings.ROUTER_METRICS_INTERVAL.default
    """Handle report cadence until the deployment's members carry its own `metrics_interval_s`
    (then that governs; see Router.report_interval_s)."""
    columnar_min_replicas: int = settings.COLUMNAR_MIN_REPLICAS.default
    """Reports covering at least this many replicas go columnar (Arrow), narrower ones msgpack."""
    backoff_initial_s: float = 0.010
    backoff_max_s: float = 0.500
    queue_poll_max_s: float = 0.5
    """A queued request re-checks at least this often even without a capacity change."""
    cold_start_report_min_interval_s: float = 1.0
    """Immediate (cold start) reports are sent at most this often."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_s") and not (
                isinstance(value, int | float) and math.isfinite(value) and value > 0
            ):
                raise ConfigError(f"must be a positive number, not {value!r}", field=f.name)
        settings.ROUTER_MAX_QUEUED.check(self.max_queued_requests)
        settings.COLUMNAR_MIN_REPLICAS.check(self.columnar_min_replicas)
        if self.backoff_max_s < self.backoff_initial_s:
            raise ConfigError("must be >= backoff_initial_s", field="backoff_max_s")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> RouterConfig:
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for s in (settings.COLUMNAR_MIN_REPLICAS, settings.ROUTER_METRICS_INTERVAL):
            if env.get(str(s.env)):
                values[s.name] = s.resolve(None, env)
        values.update(overrides)
        return cls(**values)


@functools.cache
def default_router_config() -> RouterConfig:
    """The config of a handle created without one: defaults plus the environment, read once
    per process (the first handle reads it; later changes to os.environ are not seen)."""
    return RouterConfig.from_env()


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    nats_url: str
    namespace: str = DEFAULT_NAMESPACE
    queue_group: str = DEFAULT_GATEWAY_QUEUE_GROUP
    deadline_s: float = DEFAULT_GATEWAY_DEADLINE_S
    """Deadline of a gateway request unless its `Fp-Deadline-S` header says otherwise."""
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    """On SIGTERM, how long in-flight requests may take to finish."""
    router: RouterConfig = field(default_factory=RouterConfig)
    metrics_port: int = settings.METRICS_PORT.default
    """Serve Prometheus /metrics here (0: off)."""

    def __post_init__(self) -> None:
        validate_name(self.namespace, "namespace")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"not a port number: {self.metrics_port}", field="metrics_port")
        if not self.queue_group or any(c in self.queue_group for c in " >*"):
            raise ConfigError(f"invalid queue group {self.queue_group!r}", field="queue_group")
        for name in ("deadline_s", "drain_timeout_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"must be a positive number, not {value!r}", field=name)

    @classmethod
    def from_args(
        cls, args: argparse.Namespace, env: Mapping[str, str] | None = None
    ) -> GatewayConfig:
        env = os.environ if env is None else env
        router = RouterConfig.from_env(env)
        flags = (
            (settings.ROUTER_ADMISSION_TIMEOUT, args.admission_timeout),
            (settings.ROUTER_MAX_QUEUED, args.max_queued),
            (settings.ROUTER_METRICS_INTERVAL, args.metrics_interval),
            (settings.COLUMNAR_MIN_REPLICAS, args.columnar_min_replicas),
        )
        router = replace(router, **{s.name: s.resolve(v, {}) for s, v in flags if v is not None})
        return cls(
            nats_url=args.nats,
            namespace=settings.NAMESPACE.resolve(args.namespace, env),
            queue_group=settings.GATEWAY_QUEUE_GROUP.resolve(args.queue_group, env),
            deadline_s=settings.GATEWAY_DEADLINE.resolve(args.deadline, env),
            drain_timeout_s=settings.DRAIN_TIMEOUT.resolve(args.drain_timeout, env),
            router=router,
            metrics_port=metrics_port(args, env),
        )


def add_gateway_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of `fleetpulse router` (the caller adds `--nats`)."""
    settings.NAMESPACE.add_flag(p)
    settings.GATEWAY_QUEUE_GROUP.add_flag(p)
    settings.GATEWAY_DEADLINE.add_flag(p)
    settings.ROUTER_ADMISSION_TIMEOUT.add_flag(p)
    settings.ROUTER_MAX_QUEUED.add_flag(p)
    settings.ROUTER_METRICS_INTERVAL.add_flag(p)
    settings.COLUMNAR_MIN_REPLICAS.add_flag(p)
    settings.DRAIN_TIMEOUT.add_flag(p)
    add_metrics_port_argument(p)

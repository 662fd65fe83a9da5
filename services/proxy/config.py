"""ProxyConfig: the HTTP ingress's one frozen config, built once from flags, env and defaults."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Final

from services.proxy.holding import DEFAULT_MAX_HELD_PER_APP, DEFAULT_MAX_WAIT_S
from services.router.config import RouterConfig
from shared import settings
from shared.errors import ConfigError
from shared.subjects import DEFAULT_NAMESPACE, validate_name

DEFAULT_HOST: Final = settings.PROXY_HOST.default
DEFAULT_PORT: Final = settings.PROXY_PORT.default
DEFAULT_RETRY_AFTER_S: Final[int] = settings.PROXY_RETRY_AFTER.default
DEFAULT_DRAIN_TIMEOUT_S: Final[float] = settings.DRAIN_TIMEOUT.default
DEFAULT_FRONT: Final[str] = settings.PROXY_FRONT.default
INTERNAL_HOST: Final = "127.0.0.1"
"""Where the Python proxy listens behind HAProxy (any free port)."""
DEFAULT_BACKLOG: Final = 2048
"""Listen backlog: a burst of new connections to a cold app must not overflow the accept queue."""
MAX_HEADER_OVERHEAD_BYTES: Final = 64 * 1024
"""Room kept under the bus's max_payload for the request's metadata and headers."""


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    nats_url: str
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    """0: any free port (the bound one is logged and in `ProxyServer.url`)."""
    namespace: str = DEFAULT_NAMESPACE
    front: str = DEFAULT_FRONT
    """"haproxy": HAProxy listens on host:port and sends requests straight to replicas that
    serve HTTP, the Python proxy behind it on a loopback port; "python": the Python proxy alone."""
    max_held_per_app: int = DEFAULT_MAX_HELD_PER_APP
    """Requests one app may hold while it wakes from zero; one more gets 503 at once."""
    max_wait_s: float = DEFAULT_MAX_WAIT_S
    """How long a request may wait for a replica to admit it; then 503 with Retry-After."""
    retry_after_s: int = DEFAULT_RETRY_AFTER_S
    """The Retry-After value of every 503."""
    request_timeout_s: float | None = None
    """The deadline of a request (its `Fp-Deadline-S` header overrides); None: none."""
    publish_routes: bool = True
    """Write the registry to KV fp_routes."""
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    backlog: int = DEFAULT_BACKLOG
    router: RouterConfig = field(default_factory=RouterConfig)
    """The proxy's routers (their queue is sized to at least `max_held_per_app`: see
    `router_config`)."""

    def __post_init__(self) -> None:
        validate_name(self.namespace, "namespace")
        if not 0 <= self.port <= 65535:
            raise ConfigError("must be in 0..65535", field="port")
        settings.PROXY_FRONT.check(self.front)
        settings.PROXY_MAX_HELD.check(self.max_held_per_app)
        settings.PROXY_RETRY_AFTER.check(self.retry_after_s)
        if self.backlog < 1:
            raise ConfigError("must be >= 1", field="backlog")
        for name in ("max_wait_s", "drain_timeout_s", "request_timeout_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ConfigError(f"must be a positive number, not {value!r}", field=name)

    @property
    def router_config(self) -> RouterConfig:
        """`router`, with a queue that never refuses what the hold bound admits: a router's
        queue holds every waiting request, held or not."""
        if self.router.max_queued_requests >= self.max_held_per_app:
            return self.router
        return replace(self.router, max_queued_requests=self.max_held_per_app)

    @classmethod
    def from_args(
        cls, args: argparse.Namespace, env: Mapping[str, str] | None = None
    ) -> ProxyConfig:
        env = os.environ if env is None else env
        router = RouterConfig.from_env(env)
        if args.metrics_interval is not None:
            router = replace(router, metrics_interval_s=args.metrics_interval)
        return cls(
            nats_url=args.nats,
            host=settings.PROXY_HOST.resolve(args.host, env),
            port=settings.PROXY_PORT.resolve(args.port, env),
            namespace=settings.NAMESPACE.resolve(args.namespace, env),
            front=settings.PROXY_FRONT.resolve(args.front, env),
            max_held_per_app=settings.PROXY_MAX_HELD.resolve(args.max_held, env),
            max_wait_s=settings.PROXY_MAX_WAIT.resolve(args.max_wait, env),
            retry_after_s=settings.PROXY_RETRY_AFTER.resolve(args.retry_after, env),
            request_timeout_s=settings.PROXY_REQUEST_TIMEOUT.resolve(args.request_timeout, env),
            publish_routes=not settings.PROXY_NO_PUBLISH_ROUTES.resolve(
                args.no_publish_routes, env
            ),
            drain_timeout_s=settings.DRAIN_TIMEOUT.resolve(args.drain_timeout, env),
            router=router,
        )


def add_proxy_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of `fleetpulse proxy` (the caller adds `--nats`)."""
    settings.PROXY_HOST.add_flag(p)
    settings.PROXY_PORT.add_flag(p)
    settings.NAMESPACE.add_flag(p)
    settings.PROXY_FRONT.add_flag(p)
    settings.PROXY_MAX_HELD.add_flag(p)
    settings.PROXY_MAX_WAIT.add_flag(p)
    settings.PROXY_RETRY_AFTER.add_flag(p)
    settings.PROXY_REQUEST_TIMEOUT.add_flag(p)
    settings.ROUTER_METRICS_INTERVAL.add_flag(p)
    settings.PROXY_NO_PUBLISH_ROUTES.add_flag(p)
    settings.DRAIN_TIMEOUT.add_flag(p)

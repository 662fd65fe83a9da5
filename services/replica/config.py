"""ReplicaConfig: one frozen config, built once from flags (and env) in main()."""

from __future__ import annotations

import argparse
import json
import os
import uuid
from dataclasses import dataclass, field
from typing import Any

from services.metrics_catalog import add_metrics_port_argument
from shared.errors import ConfigError
from shared.subjects import DEFAULT_NAMESPACE, validate_name


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    app: str
    deployment: str
    import_path: str
    replica_id: str = field(default_factory=lambda: f"r-{uuid.uuid4().hex[:12]}")
    init_args: tuple[Any, ...] = ()
    init_kwargs: dict[str, Any] = field(default_factory=dict)
    max_ongoing_requests: int = 5
    health_check_period_s: float = 10.0
    health_check_timeout_s: float = 30.0
    graceful_shutdown_timeout_s: float = 20.0
    push_metrics: bool = False
    metrics_interval_s: float = 10.0
    agent_id: str = ""
    version: str = ""
    namespace: str = DEFAULT_NAMESPACE
    nats_url: str = "nats://127.0.0.1:4222"
    metrics_port: int = 0

    def __post_init__(self) -> None:
        validate_name(self.app, "app")
        validate_name(self.deployment, "deployment")
        validate_name(self.replica_id, "replica_id")
        for name in ("health_check_period_s", "health_check_timeout_s", "metrics_interval_s"):
            if getattr(self, name) <= 0:
                raise ConfigError("must be > 0", field=name)
        if self.graceful_shutdown_timeout_s < 0:
            raise ConfigError("must be >= 0", field="graceful_shutdown_timeout_s")
        if self.max_ongoing_requests < 1:
            raise ConfigError("must be at least 1", field="max_ongoing_requests")


def add_replica_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--app", required=True, help="application name")
    p.add_argument("--deployment", required=True, help="deployment name")
    p.add_argument(
        "--import-path",
        required=True,
        help="user code as 'package.module:Attribute' (class or function)",
    )
    p.add_argument("--replica-id", default=None, help="replica id (default: generated)")
    p.add_argument("--init-args", default="[]", help="JSON list of positional init args")
    p.add_argument("--init-kwargs", default="{}", help="JSON object of keyword init args")
    p.add_argument("--max-ongoing-requests", type=int, default=5)
    p.add_argument("--health-check-period-s", type=float, default=10.0)
    p.add_argument("--health-check-timeout-s", type=float, default=30.0)
    p.add_argument("--graceful-shutdown-timeout-s", type=float, default=20.0)
    p.add_argument(
        "--push-metrics",
        action="store_true",
        help="publish own ReplicaReports (then health rides them; default: routers report)",
    )
    p.add_argument("--metrics-interval-s", type=float, default=10.0)
    p.add_argument("--agent-id", default=os.environ.get("FLEETPULSE_AGENT_ID", ""))
    p.add_argument("--version", dest="code_version", default="", help="code version label")
    p.add_argument("--namespace", default=os.environ.get("FLEETPULSE_NAMESPACE", DEFAULT_NAMESPACE))
    add_metrics_port_argument(p)


def _json(value: str, flag: str, kind: type) -> Any:
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not valid JSON: {exc}", field=flag) from None
    if not isinstance(parsed, kind):
        raise ConfigError(f"must be a JSON {kind.__name__}", field=flag)
    return parsed


def config_from_args(args: argparse.Namespace) -> ReplicaConfig:
    extra: dict[str, Any] = {}
    if args.replica_id:
        extra["replica_id"] = args.replica_id
    return ReplicaConfig(
        app=args.app,
        deployment=args.deployment,
        import_path=args.import_path,
        init_args=tuple(_json(args.init_args, "--init-args", list)),
        init_kwargs=_json(args.init_kwargs, "--init-kwargs", dict),
        max_ongoing_requests=args.max_ongoing_requests,
        health_check_period_s=args.health_check_period_s,
        health_check_timeout_s=args.health_check_timeout_s,
        graceful_shutdown_timeout_s=args.graceful_shutdown_timeout_s,
        push_metrics=args.push_metrics,
        metrics_interval_s=args.metrics_interval_s,
        agent_id=args.agent_id,
        version=args.code_version,
        namespace=args.namespace,
        nats_url=args.nats,
        metrics_port=args.metrics_port,
        **extra,
    )

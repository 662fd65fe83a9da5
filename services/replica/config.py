"""ReplicaConfig: one frozen config, built once from flags (and env) in main()."""

from __future__ import annotations

import argparse
import os
import uuid
from dataclasses import dataclass, field
from typing import Any

from shared import replicaspec, settings
from shared.metrics_catalog import add_metrics_port_argument, metrics_port
from shared.replicaspec import ReplicaSpec
from shared.subjects import DEFAULT_NAMESPACE, validate_name


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    """Who this replica is and where it connects, and `spec`: what it runs and how (its
    settings are declared once, in shared.replicaspec, flags included)."""

    app: str
    deployment: str
    spec: ReplicaSpec
    replica_id: str = field(default_factory=lambda: f"r-{uuid.uuid4().hex[:12]}")
    agent_id: str = ""
    version: str = ""
    namespace: str = DEFAULT_NAMESPACE
    nats_url: str = "nats://127.0.0.1:4222"
    metrics_port: int = settings.METRICS_PORT.default

    def __post_init__(self) -> None:
        validate_name(self.app, "app")
        validate_name(self.deployment, "deployment")
        validate_name(self.replica_id, "replica_id")

    @staticmethod
    def of(app: str, deployment: str, **values: Any) -> ReplicaConfig:
        """Keyword form: the spec's settings and the identity fields side by side."""
        spec = ReplicaSpec(**{k: values.pop(k) for k in list(values) if k in replicaspec.BY_NAME})
        return ReplicaConfig(app, deployment, spec, **values)


def add_replica_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--app", required=True, help="application name")
    p.add_argument("--deployment", required=True, help="deployment name")
    p.add_argument("--replica-id", default=None, help="replica id (default: generated)")
    replicaspec.add_arguments(p)
    settings.AGENT_ID.add_flag(p)
    p.add_argument("--version", dest="code_version", default="", help="code version label")
    settings.NAMESPACE.add_flag(p)
    add_metrics_port_argument(p)


def config_from_args(args: argparse.Namespace) -> ReplicaConfig:
    extra: dict[str, Any] = {}
    if args.replica_id:
        extra["replica_id"] = args.replica_id
    return ReplicaConfig(
        app=args.app,
        deployment=args.deployment,
        spec=ReplicaSpec.from_args(args),
        agent_id=settings.AGENT_ID.resolve(args.agent_id, os.environ) or "",
        version=args.code_version,
        namespace=settings.NAMESPACE.resolve(args.namespace, os.environ),
        nats_url=args.nats,
        metrics_port=metrics_port(args),
        **extra,
    )

"""KV `fp_status`, key `{app}`: the controller's view of an application, for the proxy and
`fleetpulse status`. Its size grows with the number of deployments of the app, not replicas.
Writer: the owning controller (revision-checked, `owner_epoch`). Readers: the proxy, the CLI.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from shared.kv import envelope as e


@dataclass(frozen=True, slots=True)
class DeploymentStatusView:
    status: str
    message: str
    target_replicas: int
    running_replicas: int
    demand: float
    healthy_replicas: int
    unhealthy_replicas: int
    last_decision: str

    @staticmethod
    def from_doc(doc: dict[str, Any]) -> DeploymentStatusView:
        return DeploymentStatusView(
            status=e.string(doc, "status"),
            message=e.string(doc, "message", ""),
            target_replicas=e.count(doc, "target_replicas"),
            running_replicas=e.count(doc, "running_replicas"),
            demand=e.number(doc, "demand", 0.0),
            healthy_replicas=e.count(doc, "healthy_replicas", 0),
            unhealthy_replicas=e.count(doc, "unhealthy_replicas", 0),
            last_decision=e.string(doc, "last_decision", ""),
        )


@dataclass(frozen=True, slots=True)
class AppStatusView:
    KIND: ClassVar[str] = "app_status"
    app: str
    status: str
    route_prefix: str | None
    ingress: str | None
    updated_at: float
    owner_epoch: int
    deployments: Mapping[str, DeploymentStatusView]
    partition: int | None = None
    """The FP_REPORTS partition the writer held the app under, at `owner_epoch`: the status is
    looked after while that partition's lease (fp_leases) holds the same epoch and names a live
    member (fp_controllers). None: written by a controller that predates the field (it rewrote
    every status every few seconds instead, so its `updated_at` was its liveness)."""

    def encode(self) -> bytes:
        return e.encode(self)

    @staticmethod
    def decode(data: bytes) -> AppStatusView:
        return e.decode(data, AppStatusView)

    def to_doc(self) -> dict[str, Any]:
        return {
            "app": self.app,
            "status": self.status,
            "route_prefix": self.route_prefix,
            "ingress": self.ingress,
            "updated_at": self.updated_at,
            "owner_epoch": self.owner_epoch,
            "deployments": {k: asdict(v) for k, v in sorted(self.deployments.items())},
            **({} if self.partition is None else {"partition": self.partition}),
        }

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> AppStatusView:
        deployments = e.mapping(doc, "deployments")
        return cls(
            app=e.name(doc, "app"),
            status=e.string(doc, "status"),
            route_prefix=e.optional_string(doc, "route_prefix"),
            ingress=e.optional_string(doc, "ingress"),
            updated_at=e.number(doc, "updated_at"),
            owner_epoch=e.count(doc, "owner_epoch", 0),
            deployments={
                name: e.nested(f"app_status.deployments.{name}", raw, DeploymentStatusView.from_doc)
                for name, raw in deployments.items()
            },
            partition=None if doc.get("partition") is None else e.count(doc, "partition"),
        )

"""KV `fp_routes`, key `{app}`: whether the proxy serves an app, and why, so other ingress
instances and callers discover apps without running the serviceability rule themselves.

Writer: the proxy (the same bytes for the same route: no timestamps, so proxies that agree write
nothing new). Readers: other proxies, `fleetpulse status`, outside callers. Its size grows with
the app's deployments, not replicas. The domain object, with the rule, is
services/proxy/registry.py `Route`; this is its document.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from shared.errors import WireError
from shared.kv import envelope as e
from shared.wire import reasons

SERVICEABILITY: Final = ("serving", "idle", "starting", "down", "unknown")
"""A deployment's verdict (services/proxy/serviceability.py); serving and idle are serviceable."""


@dataclass(frozen=True, slots=True)
class DeploymentRouteDoc:
    status: str
    """The controller's status; "" when it has not reported this deployment."""
    running_replicas: int
    serviceability: str
    """One of SERVICEABILITY."""
    reason: str

    @property
    def serviceable(self) -> bool:
        return self.serviceability in ("serving", "idle")

    def to_doc(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "running_replicas": self.running_replicas,
            "serviceable": self.serviceable,
            "serviceability": self.serviceability,
            "reason": self.reason,
        }

    @staticmethod
    def from_doc(doc: dict[str, Any]) -> DeploymentRouteDoc:
        verdict = e.string(doc, "serviceability")
        if verdict not in SERVICEABILITY:
            raise WireError(reasons.BAD_VALUE, f"{doc['kind']}.serviceability: {verdict!r}")
        # `serviceable` is derived from `serviceability`: written for readers, not read back
        return DeploymentRouteDoc(
            status=e.string(doc, "status"),
            running_replicas=e.count(doc, "running_replicas"),
            serviceability=verdict,
            reason=e.string(doc, "reason"),
        )


@dataclass(frozen=True, slots=True)
class RouteDoc:
    KIND: ClassVar[str] = "route"
    app: str
    route_prefix: str | None
    """Null: not served over HTTP."""
    ingress: str | None
    registered: bool
    """The proxy sends requests for it (a registered app at zero replicas is woken, not 404)."""
    down: bool
    """Not registered because a deployment crashed (UNHEALTHY or DEPLOY_FAILED at zero)."""
    reason: str
    deployments: Mapping[str, DeploymentRouteDoc]

    def to_doc(self) -> dict[str, Any]:
        return {
            "app": self.app,
            "route_prefix": self.route_prefix,
            "ingress": self.ingress,
            "registered": self.registered,
            "down": self.down,
            "reason": self.reason,
            "deployments": {k: v.to_doc() for k, v in sorted(self.deployments.items())},
        }

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> RouteDoc:
        deployments = e.mapping(doc, "deployments")
        return cls(
            app=e.name(doc, "app"),
            route_prefix=e.optional_string(doc, "route_prefix"),
            ingress=e.optional_string(doc, "ingress"),
            registered=e.boolean(doc, "registered"),
            down=e.boolean(doc, "down"),
            reason=e.string(doc, "reason"),
            deployments={
                name: e.nested(f"route.deployments.{name}", raw, DeploymentRouteDoc.from_doc)
                for name, raw in deployments.items()
            },
        )

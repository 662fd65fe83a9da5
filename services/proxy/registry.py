"""The registry of reachable apps: routes from what the controller reports, and path matching.

How it works: `build_routes(statuses, apps)` is a pure function of the values in KV fp_status
(the controller's `AppStatusView` per app) and KV fp_apps (the deployed `AppConfig` per app). For
each app it applies the serviceability rule (serviceability.py) to every deployment and says
whether the app is registered and why. The app's deployments, route prefix and ingress come from
the deployed config when there is one (it is the newest word), else from the status:

- an app in fp_apps that no controller has reported yet is known but not registered (a request
  gets 503 "waiting for a controller", never 404);
- an app being deleted is not registered;
- a deployment without a status yet is not serviceable (it counts as UNKNOWN at zero);
- without an ingress deployment (and more than one deployment to choose from) there is nothing
  to send requests to, so the app is not registered.

`RouteTable` matches a request path to an app by route prefix, longest prefix first, on whole
path segments (`/shop` serves `/shop` and `/shop/cart`, not `/shopping`); `/` serves everything
no longer prefix claims. Apps whose route_prefix is null are not served over HTTP. Two apps with
the same prefix (which `fleetpulse deploy` refuses) resolve to the first by name.

A `Route` is also the value the proxy publishes in KV fp_routes (key = app), so that other
ingress instances and callers can discover apps without running the rule themselves; its
document is shared.kv.routes `RouteDoc` (`to_json` / `from_json` convert).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from services.proxy.serviceability import (
    Serviceability,
    app_serviceability,
    deployment_serviceability,
)
from shared.appconfig import AppConfig
from shared.kv import buckets, envelope
from shared.kv.routes import DeploymentRouteDoc, RouteDoc
from shared.kv.status import AppStatusView, DeploymentStatusView

KV_ROUTES: Final = buckets.ROUTES.name
ROUTE_KIND: Final = RouteDoc.KIND
DELETING: Final = "DELETING"
NO_STATUS: Final = "no status from a controller yet"


@dataclass(frozen=True, slots=True)
class DeploymentRoute:
    status: str
    """The controller's status; "" when it has not reported this deployment."""
    running_replicas: int
    serviceability: Serviceability
    reason: str

    @property
    def serviceable(self) -> bool:
        return self.serviceability.serviceable


@dataclass(frozen=True, slots=True)
class Route:
    app: str
    route_prefix: str | None
    ingress: str | None
    registered: bool
    down: bool
    """Not registered because a deployment crashed (UNHEALTHY or DEPLOY_FAILED at zero)."""
    reason: str
    deployments: Mapping[str, DeploymentRoute]

    def to_doc(self) -> dict[str, Any]:
        return self.document().to_doc()

    def document(self) -> RouteDoc:
        return RouteDoc(
            app=self.app,
            route_prefix=self.route_prefix,
            ingress=self.ingress,
            registered=self.registered,
            down=self.down,
            reason=self.reason,
            deployments={
                name: DeploymentRouteDoc(
                    d.status, d.running_replicas, d.serviceability.value, d.reason
                )
                for name, d in self.deployments.items()
            },
        )

    def to_json(self) -> bytes:
        """The fp_routes value: the same bytes for the same route (no timestamps), so proxies
        that agree write nothing new."""
        return envelope.encode(self.document())

    @staticmethod
    def from_json(data: bytes) -> Route:
        """Decode an fp_routes value (WireError when it is not one)."""
        return Route.from_document(envelope.decode(data, RouteDoc))

    @staticmethod
    def from_document(doc: RouteDoc) -> Route:
        return Route(
            app=doc.app,
            route_prefix=doc.route_prefix,
            ingress=doc.ingress,
            registered=doc.registered,
            down=doc.down,
            reason=doc.reason,
            deployments={
                name: DeploymentRoute(
                    d.status, d.running_replicas, Serviceability(d.serviceability), d.reason
                )
                for name, d in doc.deployments.items()
            },
        )


# -- the rule over every app ----------------------------------------------------------------------


def deployment_route(view: DeploymentStatusView | None) -> DeploymentRoute:
    if view is None:
        return DeploymentRoute("", 0, Serviceability.UNKNOWN, NO_STATUS)
    running = max(0, view.running_replicas)
    s = deployment_serviceability(running, view.status)
    return DeploymentRoute(view.status, running, s, _deployment_reason(s, view))


def _deployment_reason(s: Serviceability, view: DeploymentStatusView) -> str:
    if s is Serviceability.SERVING:
        return f"{view.running_replicas} replica(s) running"
    if s is Serviceability.IDLE:
        return {
            "HEALTHY": "scaled to zero; a request wakes it",
            "UPSCALING": "waking up from zero",
        }.get(view.status, "settling at zero")
    why = f": {view.message}" if view.message else ""
    if s is Serviceability.UNKNOWN:
        return f"unknown status {view.status!r} with no replica running{why}"
    return f"{view.status} with no replica running{why}"


def route_for(app: str, status: AppStatusView | None, config: AppConfig | None) -> Route:
    """The route of one app known to fp_status, fp_apps or both."""
    views: Mapping[str, DeploymentStatusView] = status.deployments if status else {}
    prefix: str | None
    ingress: str | None
    if config is not None:
        names = [d.name for d in config.deployments]
        prefix, ingress = config.route_prefix, config.ingress or names[0]
    else:
        names = sorted(views)
        prefix = status.route_prefix if status else None
        ingress = status.ingress if status else None
        if ingress is None and len(names) == 1:
            ingress = names[0]
    deployments = {name: deployment_route(views.get(name)) for name in names}

    def route(registered: bool, down: bool, reason: str) -> Route:
        return Route(app, prefix, ingress, registered, down, reason, deployments)

    if status is None:
        return route(False, False, "waiting for a controller to report the app")
    if status.status == DELETING:
        return route(False, False, "the app is being deleted")
    if ingress is None or ingress not in deployments:
        return route(False, False, "no ingress deployment to send requests to")
    verdict = app_serviceability({n: d.serviceability for n, d in deployments.items()})
    if verdict.registered:
        return route(True, False, _registered_reason(deployments))
    reason = "; ".join(f"{n}: {deployments[n].reason}" for n in verdict.blocking)
    return route(False, verdict.down, reason or "no deployments")


def _registered_reason(deployments: Mapping[str, DeploymentRoute]) -> str:
    idle = sorted(n for n, d in deployments.items() if d.serviceability is Serviceability.IDLE)
    if not idle:
        return "every deployment has running replicas"
    return f"serviceable; at zero and woken by requests: {', '.join(idle)}"


def build_routes(
    statuses: Mapping[str, AppStatusView], apps: Mapping[str, AppConfig]
) -> dict[str, Route]:
    """One route per app known to either bucket."""
    return {
        name: route_for(name, statuses.get(name), apps.get(name))
        for name in sorted(set(statuses) | set(apps))
    }


class RouteTable:
    """Routes by app, and the longest-prefix match of a request path (O(path depth))."""

    __slots__ = ("by_prefix", "routes")

    def __init__(self, routes: Mapping[str, Route]) -> None:
        self.routes = dict(routes)
        self.by_prefix: dict[str, Route] = {}
        for name in sorted(self.routes):
            route = self.routes[name]
            if route.route_prefix is not None:
                self.by_prefix.setdefault(_normalize(route.route_prefix), route)

    def match(self, path: str) -> Route | None:
        candidate = _normalize(path)
        while True:
            route = self.by_prefix.get(candidate)
            if route is not None:
                return route
            if candidate == "/":
                return None
            candidate = candidate.rsplit("/", 1)[0] or "/"

    @property
    def registered(self) -> int:
        return sum(1 for r in self.routes.values() if r.registered)


def _normalize(path: str) -> str:
    if not path.startswith("/"):
        path = "/" + path
    return path.rstrip("/") or "/"

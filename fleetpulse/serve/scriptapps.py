"""What a `serve.run` script builds, writes and reads: its applications in KV, Ray's status shape.

Building (`app_config`): the bound application is checked by the same code and with the same
messages as an app file's `import_path` app (shared/serveconfig.py), after the deployments a
replica cannot import by name are shipped by value (fleetpulse/serve/byvalue.py); messages name
deployments, not the app file serve.run never wrote. Writing (`write_app`) follows
`fleetpulse deploy`: one revision-checked key in fp_apps per app, a route_prefix another app holds
refused, the size checked. Reading gives Ray Serve's `ServeStatus` from fp_status and fp_apps,
and whether a proxy routes an app from fp_routes. All KV calls are coroutines for the driver's
loop (fleetpulse/serve/run.py).
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared.appconfig import AppConfig
from shared.appgraph import BuiltApp
from shared.appmodel import Application, Deployment, GraphError, build

from . import byvalue

if TYPE_CHECKING:
    from shared.bus import Bus

PLACEHOLDER = "fleetpulse.serve.run:application"
_APP_PATH = re.compile(r"applications\[0\]\.import_path\[([^\]]+)\]")


class RayServeException(RuntimeError):
    """A serve call failed against the system (Ray Serve's exception of that name)."""


# -- status in Ray Serve's shape --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeploymentStatusOverview:
    status: str
    """UPDATING, HEALTHY, UNHEALTHY, DEPLOY_FAILED, UPSCALING or DOWNSCALING."""
    status_trigger: str
    replica_states: Mapping[str, int]
    message: str = ""


@dataclass(frozen=True, slots=True)
class ApplicationStatusOverview:
    status: str
    """DEPLOYING, RUNNING, UNHEALTHY, DEPLOY_FAILED or DELETING."""
    message: str
    last_deployed_time_s: float
    deployments: Mapping[str, DeploymentStatusOverview]


@dataclass(frozen=True, slots=True)
class ServeStatus:
    proxies: Mapping[str, str] = field(default_factory=dict)
    applications: Mapping[str, ApplicationStatusOverview] = field(default_factory=dict)
    target_capacity: float | None = None


# -- building -------------------------------------------------------------------------------------


class Shipped:
    """Stands in the graph walk for a class or function shipped by value: its import path is
    `fleetpulse.serve.byvalue:<name>`; any other attribute (reconfigure, ...) is the target's."""

    def __init__(self, target: Any, name: str) -> None:
        self.__module__ = byvalue.__name__
        self.__qualname__ = name
        self._target = target

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._target, attr)


def ship_graph(root: Application, directory: Path) -> tuple[Application, bool]:
    """The graph with every deployment a replica cannot import by name shipped by value (same
    node identity: a node bound twice is still one deployment)."""
    memo: dict[int, Application] = {}
    shipped = False

    def node(n: Application) -> Application:
        nonlocal shipped
        if id(n) in memo:
            return memo[id(n)]
        d = n.deployment
        if byvalue.needs_by_value(d.func_or_class):
            d = Deployment(
                Shipped(d.func_or_class, byvalue.ship(d.func_or_class, directory)),
                d.name,
                d.options_given,
            )
            shipped = True
        new = Application(
            d, tuple(value(a) for a in n.args), {k: value(v) for k, v in n.kwargs.items()}
        )
        memo[id(n)] = new
        return new

    def value(v: Any) -> Any:
        if isinstance(v, Application):
            return node(v)
        if isinstance(v, list | tuple):
            return type(v)(value(x) for x in v)
        if isinstance(v, dict):
            return {k: value(x) for k, x in v.items()}
        return v

    return node(root), shipped


def app_config(
    target: Application,
    name: str,
    route_prefix: str | None,
    logging_config: Any,
    directory: Path,
) -> tuple[AppConfig, str]:
    """The checked AppConfig of the bound application and its ingress deployment's name."""
    from shared.errors import UsageError
    from shared.subjects import validate_name

    try:
        validate_name(name, "application name")
    except UsageError as exc:
        raise ValueError(f"serve.run: {exc}") from None

    import yaml  # here: a replica imports this package and never runs a script (no yaml there)

    from shared.policyapi import policy_problem
    from shared.serveconfig import check_config

    graph, shipped = ship_graph(target, directory)
    try:
        built: BuiltApp = build(graph)
    except GraphError as exc:  # the message says which deployment and why
        raise ValueError(f"serve.run: {exc}") from None
    app: dict[str, Any] = {"name": name, "route_prefix": route_prefix, "import_path": PLACEHOLDER}
    if shipped:
        app["runtime_env"] = {"env_vars": {byvalue.ENV_DIR: str(directory)}}
    if logging_config is not None:
        app["logging_config"] = as_dict(logging_config)
    text = yaml.safe_dump({"applications": [app]}, sort_keys=False)
    checked = check_config(text, check_policy=policy_problem, build=lambda _code: built)
    for w in checked.warnings:
        warnings.warn(f"serve.run: {plain(w.path, w.message)}", stacklevel=3)
    if checked.problems:
        raise ValueError(
            f"serve.run: application {name!r} cannot be deployed: "
            + "; ".join(plain(p.path, p.message) for p in checked.problems)
        )
    (config,) = checked.apps
    return config, built.ingress


def plain(path: str, message: str) -> str:
    """A problem in the words of code, not of the app file serve.run wrote for the checker."""
    m = _APP_PATH.match(path)
    if m is not None:  # applications[0].import_path[Model].max_ongoing_requests
        key = path[m.end() :].lstrip(".")
        return f"deployment {m[1]!r}: {key + ': ' if key else ''}{message}"
    where = path.replace("applications[0].", "").replace("applications[0]", "")
    return f"{where}: {message}" if where else message


def describe(app: AppConfig) -> str:
    names = ", ".join(d.name for d in app.deployments)
    route = f"route {app.route_prefix}" if app.route_prefix is not None else "no HTTP route"
    return f"{names}; {route}"


# -- KV ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Written:
    """What a write changed: whether the value did, whether a deployment's version did (new
    replicas: a rollout), and the app's status revision before the write."""

    changed: bool
    rollout: bool
    status_revision: int | None


def _rollout(old: bytes | None, new: AppConfig) -> bool:
    try:
        before = None if old is None else AppConfig.from_json(old)
    except Exception:
        return True
    if before is None:
        return True
    versions = {d.name: before.version_of(d) for d in before.deployments}
    return any(versions.get(d.name) != new.version_of(d) for d in new.deployments)


async def write_app(bus: Bus, app: AppConfig) -> Written:
    """Write the app to fp_apps as `fleetpulse deploy` does; (changed, the revision of its
    status before the write)."""
    from shared.errors import KVConflict, UsageError
    from shared.kv import envelope
    from shared.subjects import KV_APPS, KV_STATUS

    kv = await bus.kv(KV_APPS)
    current = {e.key: e for e in await kv.snapshot([">"])}
    for other, entry in current.items():
        if other == app.name or app.route_prefix is None:
            continue
        try:
            prefix = AppConfig.from_json(entry.value).route_prefix
        except Exception:
            continue  # the controller ignores a bad value too; it holds no route
        if prefix == app.route_prefix:
            raise ValueError(
                f"serve.run: route_prefix {app.route_prefix!r} is already used by the "
                f"application {other!r}; pass another route_prefix, or serve.delete("
                f"{other!r}) first"
            )
    try:
        value = app.to_json()
    except UsageError as exc:
        raise ValueError(f"serve.run: application {app.name!r}: {exc}") from None
    if len(value) > envelope.MAX_DOCUMENT_BYTES:
        raise ValueError(
            f"serve.run: application {app.name!r}: its config is {len(value)} bytes, more than "
            f"{envelope.MAX_DOCUMENT_BYTES}; pass large constructor values by file or URL"
        )
    status_kv = await bus.kv(KV_STATUS)
    before = await status_kv.get(app.name)
    old = current.get(app.name)
    status_revision = None if before is None else before.revision
    if old is not None and old.value == value:
        return Written(False, False, status_revision)
    rollout = _rollout(None if old is None else old.value, app)
    try:
        if old is None:
            await kv.create(app.name, value)
        else:
            await kv.update(app.name, value, old.revision)
    except KVConflict:
        raise RayServeException(
            f"application {app.name!r} was changed by someone else meanwhile; run again"
        ) from None
    return Written(True, rollout, status_revision)


async def read_status(bus: Bus) -> ServeStatus:
    from shared.kv.status import AppStatusView
    from shared.kvfollow import existing_kv
    from shared.subjects import KV_APPS, KV_STATUS

    apps_kv, status_kv = await existing_kv(bus, KV_APPS), await existing_kv(bus, KV_STATUS)
    apps = {} if apps_kv is None else {e.key: e for e in await apps_kv.snapshot([">"])}
    statuses: dict[str, AppStatusView] = {}
    if status_kv is not None:
        for e in await status_kv.snapshot([">"]):
            with contextlib.suppress(Exception):
                statuses[e.key] = AppStatusView.decode(e.value)
    out: dict[str, ApplicationStatusOverview] = {}
    for name in sorted(set(apps) | set(statuses)):
        view = statuses.get(name)
        if view is None:
            out[name] = ApplicationStatusOverview("DEPLOYING", "", 0.0, {})
            continue
        deployments = {
            dname: DeploymentStatusOverview(
                d.status,
                d.last_decision,
                {
                    "RUNNING": d.running_replicas,
                    "STARTING": max(0, d.target_replicas - d.running_replicas),
                },
                d.message,
            )
            for dname, d in view.deployments.items()
        }
        message = "; ".join(f"{n}: {d.message}" for n, d in deployments.items() if d.message)
        status = view.status if name in apps else "DELETING"
        out[name] = ApplicationStatusOverview(status, message, view.updated_at, deployments)
    return ServeStatus(applications=out)


async def status_entry(bus: Bus, name: str) -> tuple[int, Any] | None:
    from shared.kv.status import AppStatusView
    from shared.subjects import KV_STATUS

    entry = await (await bus.kv(KV_STATUS)).get(name)
    if entry is None:
        return None
    try:
        return entry.revision, AppStatusView.decode(entry.value)
    except Exception:
        return None


async def read_app(bus: Bus, name: str) -> AppConfig | None:
    from shared.kvfollow import existing_kv
    from shared.subjects import KV_APPS

    kv = await existing_kv(bus, KV_APPS)
    entry = None if kv is None else await kv.get(name)
    return None if entry is None else AppConfig.from_json(entry.value)


async def delete_app(bus: Bus, name: str) -> bool:
    from shared.kvfollow import existing_kv
    from shared.subjects import KV_APPS

    kv = await existing_kv(bus, KV_APPS)
    entry = None if kv is None else await kv.get(name)
    if kv is None or entry is None:
        return False
    await kv.delete(name)
    return True


async def routed(bus: Bus, name: str, prefix: str) -> bool | None:
    """Whether fp_routes says a proxy sends `prefix` to the app; None: no routes published."""
    from shared.kv import buckets, envelope
    from shared.kv.routes import RouteDoc
    from shared.kvfollow import existing_kv

    kv = await existing_kv(bus, buckets.ROUTES.name)
    if kv is None:
        return None
    entry = await kv.get(name)
    if entry is None:
        return False
    try:
        doc = envelope.decode(entry.value, RouteDoc)
    except Exception:
        return False
    return doc.registered and doc.route_prefix == prefix


# -- small helpers --------------------------------------------------------------------------------


def as_dict(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    for dump in ("model_dump", "dict"):
        if callable(getattr(value, dump, None)):
            out: dict[str, Any] = getattr(value, dump)()
            return out
    return dict(vars(value))

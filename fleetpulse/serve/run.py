"""`serve.run(app)` and the driver-side calls Ray Serve scripts make, against a local system.

    from fleetpulse import serve
    import requests

    @serve.deployment
    class Hello:
        async def __call__(self, request) -> str:
            return "hello " + (await request.json())["name"]

    handle = serve.run(Hello.bind())                       # starts a local system, deploys
    print(requests.post("http://127.0.0.1:8000/", json={"name": "x"}).text)
    print(handle.remote(...).result())

How it works: the first call that needs a system finds one. With $FLEETPULSE_NATS_URL set it
connects to that system (credentials from $FLEETPULSE_NATS_*, as every fleetpulse client);
otherwise it starts a local one (fleetpulse/serve/localsystem.py: nats-server, controller, agent,
proxy as child processes, HTTP on 127.0.0.1:8000 as in Ray, or where `serve.start(http_options=)`
or $FLEETPULSE_PROXY_HOST/$FLEETPULSE_PROXY_PORT say) that stops when the script ends, however it
ends. A background thread runs an event loop with one NATS connection; handles live on it and
synchronous code waits on their results (`handle.remote(x).result()`).

`serve.run` builds the application as `fleetpulse deploy` builds one defined in code (the same
checks and messages: shared/serveconfig.py), except that deployments a replica could not import
(defined in the script's `__main__` or in a function) are shipped by value
(fleetpulse/serve/byvalue.py); the script is never imported again. It writes the app to KV
fp_apps (revision-checked; a route_prefix another app holds is refused, as deploy refuses it),
waits until the controller reports it RUNNING (DEPLOY_FAILED raises with the controller's
message and the failing replica's log), and on a local system until the proxy routes it, then
returns a handle to the ingress deployment. A later `serve.run` with the same name redeploys that
app (a rollout); another name adds an app.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import os
import re
import sys
import threading
import time
import warnings
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from shared.appconfig import AppConfig
from shared.appgraph import BuiltApp
from shared.appmodel import Application, Deployment, build

from . import byvalue
from . import context as _context
from .handle import DeploymentHandle

if TYPE_CHECKING:
    from shared.bus import Bus

    from .localsystem import LocalSystem

log = logging.getLogger("fleetpulse.serve")

DEFAULT_APP_NAME = "default"
DEFAULT_HTTP_HOST = "127.0.0.1"
DEFAULT_HTTP_PORT = 8000
NATS_URL_ENV = "FLEETPULSE_NATS_URL"
"""Names an existing system to use instead of starting a local one (shared/cliargs.py's)."""
DEPLOY_TIMEOUT_S = 600.0
"""serve.run gives up waiting for RUNNING after this long (Ray waits for ever)."""
PROGRESS_EVERY_S = 10.0
LOG_TAIL_LINES = 25
ROUTE_WAIT_S = 30.0
UNCHANGED_SETTLE_S = 2.0
"""After a redeploy, how long a RUNNING status not yet rewritten is taken as this version's."""
_PLACEHOLDER = "fleetpulse.serve.run:application"
_APP_PATH = re.compile(r"applications\[0\]\.import_path\[([^\]]+)\]")

T = TypeVar("T")


class RayServeException(RuntimeError):
    """A serve call failed against the system (Ray Serve's exception of that name)."""


class DeployFailed(RayServeException):
    """The application could not be deployed; the message says which deployment and why."""


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


# -- the driver: one system, one connection, one loop per process ------------------------------


class _Driver:
    def __init__(self, nats_url: str, system: LocalSystem | None, http_url: str | None) -> None:
        self.nats_url = nats_url
        self.system = system
        self.http_url = http_url
        self.deployed: set[str] = set()
        self.handles: list[DeploymentHandle] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="fleetpulse-serve", daemon=True
        )
        self.thread.start()
        self.bus: Bus | None = None

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    def connect(self) -> None:
        from shared.natsbus import NatsBus

        async def go() -> Bus:
            return await NatsBus.connect(self.nats_url, name="fleetpulse-serve-run")

        self.bus = self.call(go(), 30)

    def handle(self, app: str, deployment: str) -> DeploymentHandle:
        bus = self.bus
        assert bus is not None

        async def make() -> DeploymentHandle:
            return DeploymentHandle._connect(app, deployment, bus, self.loop)

        h = self.call(make(), 30)
        self.handles.append(h)
        return h

    def close(self) -> None:
        async def go() -> None:
            for h in self.handles:
                with contextlib.suppress(Exception):
                    await h._inner.close()
            if self.bus is not None:
                with contextlib.suppress(Exception):
                    await self.bus.close()

        try:
            if self.thread.is_alive():
                with contextlib.suppress(Exception):
                    self.call(go(), 10)
                self.loop.call_soon_threadsafe(self.loop.stop)
                self.thread.join(5)
        finally:
            if self.system is not None:
                _say("stopping the local system ...")
                self.system.stop()


_lock = threading.RLock()
_driver: _Driver | None = None
_http_options: dict[str, Any] = {}
_state_dir: Path | None = None


def _get_driver(*, start: bool = True) -> _Driver | None:
    global _driver
    with _lock:
        if _driver is not None:
            return _driver
        url = os.environ.get(NATS_URL_ENV)
        if not url and not start:
            return None
        if url:
            driver = _Driver(url, None, None)
            _say(f"using the system at {url} (${NATS_URL_ENV})")
        else:
            driver = _start_local()
        try:
            driver.connect()
        except BaseException:
            driver.close()
            raise
        _driver = driver
        atexit.register(_at_exit)
        return driver


def _start_local() -> _Driver:
    from .localsystem import LocalSystem

    host = str(_http_options.get("host") or os.environ.get("FLEETPULSE_PROXY_HOST") or "")
    host = host or DEFAULT_HTTP_HOST
    port = _http_options.get("port")
    if port is None:
        port = int(os.environ.get("FLEETPULSE_PROXY_PORT") or DEFAULT_HTTP_PORT)
    port = int(port) or _free_port(host)
    script_dir = sys.path[0] if sys.path and sys.path[0] else os.getcwd()
    system = LocalSystem(
        host,
        port,
        state_dir=_local_state_dir(),
        workdir=os.getcwd(),
        pythonpath=os.path.abspath(script_dir),
    )
    _say("starting a local system (nats-server, controller, agent, proxy) ...")
    t0 = time.monotonic()
    info = system.start(_say)
    _say(
        f"local system up in {time.monotonic() - t0:.1f} s: HTTP on {info.http_url}, "
        f"NATS {info.nats_url}, logs in {system.log_dir}"
    )
    return _Driver(info.nats_url, system, info.http_url)


def _free_port(host: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def _at_exit() -> None:
    global _driver
    with _lock:
        driver, _driver = _driver, None
    if driver is not None:
        driver.close()


def _say(message: str) -> None:
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("(fleetpulse serve) %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    log.info(message)


# -- the public calls ----------------------------------------------------------------------------


def start(
    proxy_location: Any = None,
    http_options: Any = None,
    grpc_options: Any = None,
    logging_config: Any = None,
    tracing_config: Any = None,
    controller_options: Any = None,
    **kwargs: Any,
) -> None:
    """Ray Serve's `serve.start`: here, where the local system's HTTP proxy listens
    (`http_options={"host": ..., "port": ...}`), then start it. Applies to a system this process
    starts; a running one keeps its address (as in Ray)."""
    if http_options is None or isinstance(http_options, Mapping):
        options = dict(http_options or {})
    else:  # Ray's HTTPOptions: only where it listens applies here
        options = {
            k: getattr(http_options, k) for k in ("host", "port") if hasattr(http_options, k)
        }
    for key in sorted(set(options) - {"host", "port"}):
        _ignored(f"http_options[{key!r}]")
    for name, value in (
        ("proxy_location", proxy_location),
        ("grpc_options", grpc_options),
        ("logging_config", logging_config),
        ("tracing_config", tracing_config),
        ("controller_options", controller_options),
        *kwargs.items(),
    ):
        if value is not None:
            _ignored(name)
    with _lock:
        if _driver is not None:
            if options:
                _say("serve.start: the system is running already; http_options not applied")
            return
        _http_options.update({k: options[k] for k in ("host", "port") if k in options})
    _get_driver()


def run(
    target: Application,
    blocking: bool = False,
    name: str = DEFAULT_APP_NAME,
    route_prefix: str | None = "/",
    logging_config: Any = None,
    _local_testing_mode: bool = False,
    external_scaler_enabled: bool = False,
    controller_options: Any = None,
    *,
    _timeout_s: float = DEPLOY_TIMEOUT_S,
) -> DeploymentHandle:
    """Deploy `target` (a bound application) as `name`, wait until it runs, return a handle to
    its ingress deployment; with `blocking=True`, then wait for Ctrl-C."""
    if isinstance(target, Deployment):
        raise TypeError(
            f"serve.run() takes an application: pass {target.name}.bind(...), not the deployment"
        )
    if not isinstance(target, Application):
        raise TypeError(
            f"serve.run() takes an application (Deployment.bind(...)), not {type(target).__name__}"
        )
    if _local_testing_mode:
        _ignored("_local_testing_mode (the app runs in replica processes)")
    if external_scaler_enabled:
        _ignored("external_scaler_enabled")
    if controller_options is not None:
        _ignored("controller_options")
    # checked before any system starts: a mistake in the app costs no start-up
    config, ingress = _app_config(target, name, route_prefix, logging_config, _byvalue_dir())
    driver = _get_driver()
    assert driver is not None and driver.bus is not None
    t0 = time.monotonic()
    _say(f"deploying application {name!r} ({_describe(config)}) ...")
    changed, status_rev = driver.call(_write_app(driver.bus, config), 30)
    driver.deployed.add(name)
    _wait_running(driver, config, changed, status_rev, t0 + _timeout_s)
    if config.route_prefix is not None:
        _wait_routed(driver, name, config.route_prefix, t0 + _timeout_s)
    where = (
        f" at {driver.http_url}{config.route_prefix}"
        if driver.http_url and config.route_prefix
        else ""
    )
    _say(f"application {name!r} is RUNNING{where} ({time.monotonic() - t0:.1f} s)")
    handle = driver.handle(name, ingress)
    if blocking:
        _wait_for_interrupt()
    return handle


def status() -> ServeStatus:
    """The applications and their deployments, as the controller reports them (empty when no
    system is running and none is named by $FLEETPULSE_NATS_URL)."""
    driver = _get_driver(start=False)
    if driver is None:
        return ServeStatus()
    assert driver.bus is not None
    return driver.call(_read_status(driver.bus), 30)


def delete(name: str, _blocking: bool = True) -> None:
    """Delete an application; with `_blocking`, wait until the controller has stopped it."""
    driver = _get_driver(start=False)
    if driver is None:
        return
    assert driver.bus is not None
    deleted = driver.call(_delete_app(driver.bus, name), 30)
    driver.deployed.discard(name)
    if not deleted:
        _say(f"serve.delete: there is no application {name!r}")
        return
    if _blocking:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if name not in driver.call(_read_status(driver.bus), 30).applications:
                return
            time.sleep(0.1)
        _say(f"serve.delete: {name!r} is still stopping (its replicas drain)")


def shutdown() -> None:
    """Stop serving: a local system is stopped (every app with it); on a system named by
    $FLEETPULSE_NATS_URL the applications this process deployed are deleted."""
    global _driver
    with _lock:
        driver = _driver
        if driver is None:
            return
        if driver.system is None:
            for name in sorted(driver.deployed):
                delete(name)
        _driver = None
    driver.close()
    global _state_dir
    if driver.system is not None:
        _state_dir = None  # removed with the system; a later serve.run starts afresh
    with contextlib.suppress(Exception):
        atexit.unregister(_at_exit)


def get_app_handle(name: str) -> DeploymentHandle:
    """A handle to the ingress deployment of application `name`."""
    driver = _get_driver(start=False)
    if driver is None:
        raise RayServeException("no system is running: serve.run() an application first")
    assert driver.bus is not None
    app = driver.call(_read_app(driver.bus, name), 30)
    if app is None or app.ingress is None:
        raise RayServeException(f"Application '{name}' does not exist.")
    return driver.handle(name, app.ingress)


def get_deployment_handle(
    deployment_name: str,
    app_name: str | None = None,
    _check_exists: bool = True,
    _record_telemetry: bool = True,
) -> DeploymentHandle:
    """A handle to a deployment: inside a replica, of its own app unless `app_name` says
    otherwise; in a script, `app_name` is required (as in Ray)."""
    if _context._host is not None:
        return _context.get_deployment_handle(deployment_name, app_name)
    if app_name is None:
        raise RayServeException(
            "Please specify an application name when getting a deployment handle outside of "
            "a Serve application."
        )
    driver = _get_driver(start=False)
    if driver is None:
        raise RayServeException("no system is running: serve.run() an application first")
    assert driver.bus is not None
    if _check_exists:
        app = driver.call(_read_app(driver.bus, app_name), 30)
        if app is None:
            raise RayServeException(f"Application '{app_name}' does not exist.")
        if deployment_name not in {d.name for d in app.deployments}:
            raise RayServeException(
                f"Deployment '{deployment_name}' does not exist in application '{app_name}'."
            )
    return driver.handle(app_name, deployment_name)


# -- building -------------------------------------------------------------------------------------


class _Shipped:
    """Stands in the graph walk for a class or function shipped by value: its import path is
    `fleetpulse.serve.byvalue:<name>`; any other attribute (reconfigure, ...) is the target's."""

    def __init__(self, target: Any, name: str) -> None:
        self.__module__ = byvalue.__name__
        self.__qualname__ = name
        self._target = target

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._target, attr)


def _ship_graph(root: Application, directory: Path) -> tuple[Application, bool]:
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
                _Shipped(d.func_or_class, byvalue.ship(d.func_or_class, directory)),
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


def _byvalue_dir() -> Path:
    """Where shipped deployments go: the local system's state directory (removed with it), or,
    for a system named by $FLEETPULSE_NATS_URL, a directory that outlives this process (its
    replicas may restart later)."""
    with _lock:
        local = (
            _driver.system is not None if _driver is not None else not os.environ.get(NATS_URL_ENV)
        )
    if local:
        return _local_state_dir() / "byvalue"
    import tempfile

    return Path(tempfile.gettempdir()) / f"fleetpulse-serve-byvalue-{os.getuid()}"


def _local_state_dir() -> Path:
    """The local system's state directory, made on first use (before the system starts, so
    the app is built and checked first); removed at exit whether or not a system started."""
    global _state_dir
    with _lock:
        if _state_dir is None:
            import shutil
            import tempfile

            _state_dir = Path(tempfile.mkdtemp(prefix="fleetpulse-serve-"))
            atexit.register(shutil.rmtree, _state_dir, ignore_errors=True)
        return _state_dir


def _app_config(
    target: Application,
    name: str,
    route_prefix: str | None,
    logging_config: Any,
    directory: Path,
) -> tuple[AppConfig, str]:
    """The checked AppConfig of the bound application and its ingress deployment's name."""
    import yaml  # here, not at the top: a replica imports this package and never runs a script

    from shared.policyapi import policy_problem
    from shared.serveconfig import check_config

    graph, shipped = _ship_graph(target, directory)
    built: BuiltApp = build(graph)  # GraphError: the message says which deployment and why
    app: dict[str, Any] = {"name": name, "route_prefix": route_prefix, "import_path": _PLACEHOLDER}
    if shipped:
        app["runtime_env"] = {"env_vars": {byvalue.ENV_DIR: str(directory)}}
    if logging_config is not None:
        app["logging_config"] = _as_dict(logging_config)
    text = yaml.safe_dump({"applications": [app]}, sort_keys=False)
    checked = check_config(text, check_policy=policy_problem, build=lambda _code: built)
    for w in checked.warnings:
        warnings.warn(f"serve.run: {_plain(w.path, w.message)}", stacklevel=3)
    if checked.problems:
        raise ValueError(
            f"serve.run: application {name!r} cannot be deployed: "
            + "; ".join(_plain(p.path, p.message) for p in checked.problems)
        )
    (config,) = checked.apps
    return config, built.ingress


def _plain(path: str, message: str) -> str:
    """A problem in the words of code, not of the app file serve.run wrote for the checker."""
    where = _APP_PATH.sub(lambda m: f"deployment {m[1]!r}", path)
    where = where.replace("applications[0].", "").replace("applications[0]", "")
    return f"{where}: {message}" if where else message


def _describe(app: AppConfig) -> str:
    names = ", ".join(d.name for d in app.deployments)
    route = f"route {app.route_prefix}" if app.route_prefix is not None else "no HTTP route"
    return f"{names}; {route}"


# -- KV ----------------------------------------------------------------------------------------


async def _write_app(bus: Bus, app: AppConfig) -> tuple[bool, int | None]:
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
    if old is not None and old.value == value:
        return False, None if before is None else before.revision
    try:
        if old is None:
            await kv.create(app.name, value)
        else:
            await kv.update(app.name, value, old.revision)
    except KVConflict:
        raise RayServeException(
            f"application {app.name!r} was changed by someone else meanwhile; run again"
        ) from None
    return True, None if before is None else before.revision


async def _read_status(bus: Bus) -> ServeStatus:
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


async def _status_entry(bus: Bus, name: str) -> tuple[int, Any] | None:
    from shared.kv.status import AppStatusView
    from shared.subjects import KV_STATUS

    entry = await (await bus.kv(KV_STATUS)).get(name)
    if entry is None:
        return None
    try:
        return entry.revision, AppStatusView.decode(entry.value)
    except Exception:
        return None


async def _read_app(bus: Bus, name: str) -> AppConfig | None:
    from shared.kvfollow import existing_kv
    from shared.subjects import KV_APPS

    kv = await existing_kv(bus, KV_APPS)
    entry = None if kv is None else await kv.get(name)
    return None if entry is None else AppConfig.from_json(entry.value)


async def _delete_app(bus: Bus, name: str) -> bool:
    from shared.kvfollow import existing_kv
    from shared.subjects import KV_APPS

    kv = await existing_kv(bus, KV_APPS)
    entry = None if kv is None else await kv.get(name)
    if kv is None or entry is None:
        return False
    await kv.delete(name)
    return True


# -- waiting --------------------------------------------------------------------------------------


def _wait_running(
    driver: _Driver, app: AppConfig, changed: bool, status_rev: int | None, deadline: float
) -> None:
    """Until the controller reports this version of `app` RUNNING; DeployFailed on
    DEPLOY_FAILED, TimeoutError past `deadline`, both with what the controller says."""
    assert driver.bus is not None
    wanted = {d.name for d in app.deployments}
    written = time.monotonic()
    said = written
    view: Any = None
    while True:
        _check_system(driver)
        found = driver.call(_status_entry(driver.bus, app.name), 30)
        if found is not None:
            revision, view = found
            fresh = (
                not changed
                or status_rev is None
                or revision > status_rev
                or time.monotonic() - written > UNCHANGED_SETTLE_S
            )
            if fresh and set(view.deployments) == wanted:
                if view.status == "RUNNING":
                    return
                if view.status == "DEPLOY_FAILED":
                    raise DeployFailed(
                        f"Deploying application {app.name!r} failed: {_progress(view)}"
                        + _replica_log_tail(driver, app.name, view)
                    )
        now = time.monotonic()
        if now > deadline:
            raise TimeoutError(
                f"application {app.name!r} is not RUNNING after {now - written + 0.0:.0f} s: "
                + (_progress(view) if view is not None else "the controller reported nothing")
                + _replica_log_tail(driver, app.name, view)
            )
        if now - said > PROGRESS_EVERY_S:
            said = now
            _say(
                f"waiting for {app.name!r}: "
                + (_progress(view) if view is not None else "not reported yet")
            )
        time.sleep(0.1)


def _check_system(driver: _Driver) -> None:
    problem = None if driver.system is None else driver.system.problem()
    if problem is not None:
        raise RayServeException(f"the local system cannot serve: {problem}")


def _progress(view: Any) -> str:
    parts = []
    for name, d in sorted(view.deployments.items()):
        text = f"{name} {d.status} {d.running_replicas}/{d.target_replicas} running"
        parts.append(f"{text} ({d.message})" if d.message else text)
    return f"{view.status}; " + ", ".join(parts)


def _replica_log_tail(driver: _Driver, app: str, view: Any) -> str:
    """The end of the newest replica log of a failing deployment, on a local system: where a
    constructor's traceback is."""
    if driver.system is None or view is None:
        return ""
    failing = [
        n
        for n, d in view.deployments.items()
        if d.status in ("DEPLOY_FAILED", "UNHEALTHY", "UPDATING")
    ]
    logs = [
        p
        for n in failing
        for p in (driver.system.log_dir / "replicas").glob(f"{app}.{n}.*")
        if p.stat().st_size
    ]
    if not logs:
        return ""
    newest = max(logs, key=lambda p: p.stat().st_mtime)
    lines = newest.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
    return f"\n--- the end of {newest} ---\n" + "\n".join(lines)


def _wait_routed(driver: _Driver, name: str, prefix: str, deadline: float) -> None:
    """Until a proxy routes the app (its fp_routes entry says registered, at this prefix): a
    request sent right after serve.run returns must not find the route missing. Skipped on a
    system whose proxies publish no routes."""
    assert driver.bus is not None
    end = min(deadline, time.monotonic() + ROUTE_WAIT_S)
    while time.monotonic() < end:
        _check_system(driver)
        routed = driver.call(_routed(driver.bus, name, prefix), 30)
        if routed is None or routed:
            return
        time.sleep(0.05)
    _say(f"no proxy routes {name!r} ({prefix}) yet")


async def _routed(bus: Bus, name: str, prefix: str) -> bool | None:
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


def _wait_for_interrupt() -> None:
    try:
        while True:
            time.sleep(10)
    except KeyboardInterrupt:
        _say("got KeyboardInterrupt, exiting ...")
        raise


# -- small helpers ------------------------------------------------------------------------------


def _as_dict(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    for dump in ("model_dump", "dict"):
        if callable(getattr(value, dump, None)):
            out: dict[str, Any] = getattr(value, dump)()
            return out
    return dict(vars(value))


def _ignored(what: str) -> None:
    warnings.warn(f"serve: {what} is ignored by fleetpulse", stacklevel=3)

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
waits until the controller reports this version RUNNING (DEPLOY_FAILED raises with the
controller's message and the failing replica's log) and a proxy routes it (fp_routes), then
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
import sys
import threading
import time
import warnings
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from shared.appconfig import AppConfig
from shared.appmodel import Application, Deployment

from . import context as _context
from . import scriptapps as _apps
from .handle import DeploymentHandle
from .scriptapps import RayServeException as RayServeException
from .scriptapps import ServeStatus as ServeStatus

if TYPE_CHECKING:
    from shared.bus import Bus

    from .localsystem import LocalSystem

log = logging.getLogger("fleetpulse.serve")

DEFAULT_APP_NAME = "default"
NATS_URL_ENV = "FLEETPULSE_NATS_URL"
"""Names an existing system to use instead of starting a local one (shared/cliargs.py's)."""
DEPLOY_TIMEOUT_S = 600.0
"""serve.run gives up waiting for RUNNING after this long (Ray waits for ever)."""
PROGRESS_EVERY_S = 10.0
LOG_TAIL_LINES = 25
ROUTE_WAIT_S = 30.0
UNCHANGED_SETTLE_S = 2.0
"""After a redeploy that changed no version, how long an unrewritten status is taken as this
one's."""
ROLLOUT_SEEN_S = 15.0
"""After a redeploy that changed a version, how long to wait to see the rollout in the status
before the status is taken as this version's anyway."""
T = TypeVar("T")


class DeployFailed(RayServeException):
    """The application could not be deployed; the message says which deployment and why."""


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
    from shared import settings

    from .localsystem import LocalSystem

    # serve.start's http_options, else the proxy's own settings ($FLEETPULSE_PROXY_HOST/_PORT,
    # whose defaults are Ray's 127.0.0.1:8000); checked as the proxy checks them
    for key, row in (("host", settings.PROXY_HOST), ("port", settings.PROXY_PORT)):
        given = _http_options.get(key)
        problem = None if given is None else row.problem(given)
        if problem is not None:
            raise ValueError(f"serve.start: http_options[{key!r}] {problem}, not {given!r}")
    host = str(settings.PROXY_HOST.resolve(_http_options.get("host"), os.environ))
    port = int(settings.PROXY_PORT.resolve(_http_options.get("port"), os.environ))
    port = port or _free_port(host)
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
        if options.get("port") is not None:
            options["port"] = int(options["port"])
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
    config, ingress = _apps.app_config(target, name, route_prefix, logging_config, _byvalue_dir())
    driver = _get_driver()
    assert driver is not None and driver.bus is not None
    t0 = time.monotonic()
    _say(f"deploying application {name!r} ({_apps.describe(config)}) ...")
    written = driver.call(_apps.write_app(driver.bus, config), 30)
    driver.deployed.add(name)
    _wait_running(driver, config, written, t0 + _timeout_s)
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
    return driver.call(_apps.read_status(driver.bus), 30)


def delete(name: str, _blocking: bool = True) -> None:
    """Delete an application; with `_blocking`, wait until the controller has stopped it."""
    driver = _get_driver(start=False)
    if driver is None:
        return
    assert driver.bus is not None
    deleted = driver.call(_apps.delete_app(driver.bus, name), 30)
    driver.deployed.discard(name)
    if not deleted:
        _say(f"serve.delete: there is no application {name!r}")
        return
    if _blocking:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if name not in driver.call(_apps.read_status(driver.bus), 30).applications:
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
    app = driver.call(_apps.read_app(driver.bus, name), 30)
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
        app = driver.call(_apps.read_app(driver.bus, app_name), 30)
        if app is None:
            raise RayServeException(f"Application '{app_name}' does not exist.")
        if deployment_name not in {d.name for d in app.deployments}:
            raise RayServeException(
                f"Deployment '{deployment_name}' does not exist in application '{app_name}'."
            )
    return driver.handle(app_name, deployment_name)


# -- building -------------------------------------------------------------------------------------


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


# -- waiting --------------------------------------------------------------------------------------


def _wait_running(driver: _Driver, app: AppConfig, written: _apps.Written, deadline: float) -> None:
    """Until the controller reports this version of `app` RUNNING; DeployFailed on
    DEPLOY_FAILED, TimeoutError past `deadline`, both with what the controller says.

    A status read right after the write may still describe the previous version: when the write
    changed a deployment's version, this version's status is the one after the controller was
    seen rolling it out (DEPLOYING: a replica takes a second or more to start, so a poll sees
    it); when it changed no version, the first status rewritten after the write (or, when the
    change moved nothing the status shows, the status after a short settle)."""
    assert driver.bus is not None
    wanted = {d.name for d in app.deployments}
    start = time.monotonic()
    said = start
    view: Any = None
    current = written.status_revision is None or not written.changed
    while True:
        _check_system(driver)
        found = driver.call(_apps.status_entry(driver.bus, app.name), 30)
        if found is not None:
            revision, view = found
            newer = written.status_revision is None or revision > written.status_revision
            waited = time.monotonic() - start
            if newer and written.rollout:
                rolling = any(d.status == "UPDATING" for d in view.deployments.values())
                current = current or view.status == "DEPLOYING" or rolling
            elif not written.rollout:
                current = current or newer or waited > UNCHANGED_SETTLE_S
            current = current or waited > ROLLOUT_SEEN_S
            if current and set(view.deployments) == wanted:
                if view.status == "RUNNING" and _sized(app, view):
                    return
                if view.status == "DEPLOY_FAILED":
                    raise DeployFailed(
                        f"Deploying application {app.name!r} failed: {_progress(view)}"
                        + _replica_log_tail(driver, app.name, view)
                    )
        now = time.monotonic()
        if now > deadline:
            raise TimeoutError(
                f"application {app.name!r} is not RUNNING after {now - start:.0f} s: "
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


def _sized(app: AppConfig, view: Any) -> bool:
    """A deployment with a fixed num_replicas runs that many (Ray's serve.run waits for a
    config's upscale or downscale; the controller calls the app RUNNING meanwhile, as Ray does
    for an autoscaler's). Autoscaling deployments are not waited for."""
    for d in app.deployments:
        v = view.deployments[d.name]
        fixed = d.autoscaling is None and d.num_replicas is not None
        if fixed and not v.target_replicas == v.running_replicas == d.num_replicas:
            return False
    return True


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
        routed = driver.call(_apps.routed(driver.bus, name, prefix), 30)
        if routed is None or routed:
            return
        time.sleep(0.05)
    _say(f"no proxy routes {name!r} ({prefix}) yet")


def _wait_for_interrupt() -> None:
    try:
        while True:
            time.sleep(10)
    except KeyboardInterrupt:
        _say("got KeyboardInterrupt, exiting ...")
        raise


# -- small helpers ------------------------------------------------------------------------------


def _ignored(what: str) -> None:
    warnings.warn(f"serve: {what} is ignored by fleetpulse", stacklevel=3)

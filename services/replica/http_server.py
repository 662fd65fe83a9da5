"""The replica's own HTTP server: any ASGI app, on the replica's event loop, with uvicorn embedded.

How it works (docs/dataplane.md, "HTTP served by the replica"):
- Only a replica of an app's ingress deployment serves HTTP (shared/replicahttp.py says which).
  `ReplicaHttpServer.start()` binds a socket of its own on `host` at port 0 (a free port), runs
  `uvicorn.Server` on it as a task of the running loop (its connections are the replica's own
  HTTP/1.1 protocol, services/replica/http11.py; no access log, uvicorn's logging left alone,
  lifespan on so an app's startup runs before the replica says it is ready; WebSocket upgrades
  go to uvicorn's websockets-sansio protocol)
  and returns "host:port" with the advertised host: the replica announces it on "ready" and the
  controller copies it into the replica's member value, where the proxy's HAProxy reads it.
- `AdmissionGate` wraps the app: every HTTP request (and WebSocket) is admitted and counted by
  the runtime exactly as a request over NATS is (`max_ongoing_requests`, the ongoing gauge, the
  time-weighted running count its reports carry, the latency histogram), so autoscaling sees
  HTTP load. A request over the limit gets 503 with Retry-After at once (HAProxy's server
  maxconn = max_ongoing_requests normally keeps it from coming).
- `drain()`: the listening socket closes (new connections are refused), idle keep-alive
  connections close, a connection with a request in flight closes after its response; requests
  still running when the grace timeout (the replica's graceful_shutdown_timeout_s) runs out are
  cancelled; then the app's lifespan shutdown runs. It returns when the server is done.
uvicorn's own signal handling is off: the replica's (shared/signals.py) decides when to drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import socket
import sys
from collections.abc import Awaitable, Callable, Generator, MutableMapping
from typing import Any, Final, Literal, Protocol

from shared.clock import SYSTEM_CLOCK, Clock
from shared.wire.address import format_http_address

# `import uvicorn` without its reloader's file watcher: uvicorn's package imports its CLI
# (uvicorn.main) and with it the reload supervisors, which take watchfiles (and the anyio parts it
# uses) when installed, else a stat-polling reloader. An embedded server never reloads, so
# watchfiles is hidden for this one import (uvicorn takes the fallback; user code can still
# import it afterwards): ~1.5 MB less resident per replica (scripts/bench/replica_footprint.py).
_WATCHER = "watchfiles"
_hidden = _WATCHER not in sys.modules
if _hidden:
    sys.modules[_WATCHER] = None  # type: ignore[assignment]  # an import of it raises ImportError
try:
    import uvicorn
finally:
    if _hidden:
        del sys.modules[_WATCHER]

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

RETRY_AFTER_S: Final = 1
"""Retry-After of the 503 a full replica answers: a slot frees as soon as a request ends."""
KEEP_ALIVE_S: Final = 75.0
"""How long an idle keep-alive connection stays open: longer than a load balancer keeps idle
connections to its servers, so the replica is never the side that closes one under it."""
TICK_S: Final = 1.0
"""The server's housekeeping interval (the Date header); a drain does not wait for it."""
OK: Final = "ok"
USER_ERROR: Final = "user_error"
CANCELLED: Final = "cancelled"
WS_TRY_AGAIN_LATER: Final = 1013
_OVERLOADED = json.dumps(
    {"error": "overloaded", "message": "the replica runs max_ongoing_requests already",
     "retryable": True}
).encode()  # fmt: skip
_SHUTDOWN = json.dumps(
    {"error": "replica_shutdown", "message": "replica stopped before the request finished",
     "retryable": True}
).encode()  # fmt: skip


class Counter(Protocol):
    """What the gate needs of the runtime (ReplicaRuntime): the one admission of the replica."""

    def admit_http(self) -> bool: ...

    def release_http(self, started: float, outcome: str, scope: Scope) -> None: ...


class AdmissionGate:
    """ASGI middleware: admit each HTTP request or WebSocket under the replica's limit, count
    it while it runs, answer 503 (Retry-After) or close 1013 when the replica is full."""

    __slots__ = ("_app", "_clock", "_counter", "_cycle_type", "_serve_http")

    def __init__(self, app: ASGIApp, counter: Counter, *, clock: Clock = SYSTEM_CLOCK) -> None:
        # imported with the server, as ReplicaHttpServer imports http11
        from services.replica.http_cycle import RequestCycle

        self._app = app
        # the replica's app (asgi.ReplicaAsgi) is called at its HTTP entry, one dispatch fewer
        self._serve_http: ASGIApp | None = getattr(app, "serve_http", None)
        self._counter = counter
        self._clock = clock
        self._cycle_type = RequestCycle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind != "http" and kind != "websocket":  # lifespan: straight to the app
            await self._app(scope, receive, send)
            return
        if not self._counter.admit_http():
            await (_overloaded(send) if kind == "http" else _ws_refused(receive, send))
            return
        started = self._clock.monotonic()
        outcome = OK
        # the response's status, to count a 5xx as a user error: read from the replica's own
        # HTTP connection (http11.RequestCycle) when that is the server, else seen on the way
        cycle = getattr(send, "__self__", None)
        watched = None if isinstance(cycle, self._cycle_type) else _StatusWatch(send)
        try:
            if kind == "http" and self._serve_http is not None:
                await self._serve_http(scope, receive, send if watched is None else watched)
            else:
                await self._app(
                    scope, receive, send if watched is None or kind != "http" else watched
                )
            status = cycle.status if watched is None else watched.status  # type: ignore[union-attr]
            if status >= 500:
                outcome = USER_ERROR
        except asyncio.CancelledError:
            outcome = CANCELLED
            status = cycle.status if watched is None else watched.status  # type: ignore[union-attr]
            if status == 0:  # the drain ran out of time (or the client left): say so, retryable
                with contextlib.suppress(Exception):
                    await _shutting_down(send)
            raise
        except Exception:
            outcome = USER_ERROR
            raise
        finally:
            self._counter.release_http(started, outcome, scope)


class _StatusWatch:
    """A `send` that remembers the response's status (any server other than http11's)."""

    __slots__ = ("_send", "status")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.status = 0

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        await self._send(message)


async def _overloaded(send: Send) -> None:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(_OVERLOADED)).encode()),
        (b"retry-after", str(RETRY_AFTER_S).encode()),
        (b"fp-error", b"overloaded"),
        (b"fp-retryable", b"true"),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": _OVERLOADED})


async def _shutting_down(send: Send) -> None:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(_SHUTDOWN)).encode()),
        (b"fp-error", b"replica_shutdown"),
        (b"fp-retryable", b"true"),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": _SHUTDOWN})


async def _ws_refused(receive: Receive, send: Send) -> None:
    # accepted, then closed with 1013: a close before the accept reaches the client as a 403
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.close", "code": WS_TRY_AGAIN_LATER, "reason": "overloaded"})


class HttpStartError(Exception):
    """The server did not start: the port could not be bound or the app's lifespan failed."""


class _Embedded(uvicorn.Server):
    """uvicorn.Server as a guest of the replica's loop: no signal handlers of its own, a start
    it reports, a stop that needs no polling tick."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.up = asyncio.Event()
        self.exit = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # the replica's handlers stay: it drains the server itself

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().startup(sockets=sockets)
        except SystemExit:  # uvicorn exits the process when the lifespan startup fails
            raise HttpStartError("the app's lifespan startup failed") from None
        self.up.set()

    async def main_loop(self) -> None:
        counter = 0
        loop = asyncio.get_running_loop()
        while not await self.on_tick(counter):
            counter += 10  # on_tick renews the Date header when counter % 10 == 0
            now = loop.time()
            for conn in list(self.server_state.connections):
                sweep = getattr(conn, "sweep_idle", None)  # WebSockets have their own pings
                if sweep is not None:
                    sweep(now)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TICK_S):
                    await self.exit.wait()


class LazyWebSocketProtocol(asyncio.Protocol):
    """uvicorn's websockets-sansio protocol (the maintained implementation: "auto" picks the
    legacy one), imported at a connection's first WebSocket upgrade. The websockets package is
    ~3 MB resident, carried by every replica that serves HTTP although most never see a
    WebSocket; the first upgrade pays its import (~30 ms) instead."""

    def __new__(cls, **kwargs: Any) -> Any:
        from uvicorn.protocols.websockets.websockets_sansio_impl import (
            WebSocketsSansIOProtocol,
        )

        return WebSocketsSansIOProtocol(**kwargs)


class ReplicaHttpServer:
    """One replica's HTTP server; `start()` once, `drain()` once (safe to call again)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        host: str = "127.0.0.1",
        advertise: str | None = None,
        port: int = 0,
        graceful_timeout_s: float = 20.0,
        lifespan: Literal["auto", "on", "off"] = "on",
    ) -> None:
        # imported when a server is built, as uvicorn imports its own protocol at start: at
        # this module's import it left an idle replica 0.9 MB more resident (replica_footprint:
        # 40.0 against 39.1-39.2 MB, the heap laid out otherwise before the idle trim)
        from services.replica.http11 import HttpConnection

        self.host = host
        self.advertise = advertise or host
        self._port = port
        self.config = uvicorn.Config(
            app,
            host=host,
            port=port,
            http=HttpConnection,  # httptools; head and body leave in one send
            ws=LazyWebSocketProtocol,  # websockets-sansio, imported at the first upgrade
            loop="none",  # the replica's loop (uvloop where installed), already running
            lifespan=lifespan,
            access_log=False,
            log_config=None,  # the replica's logging stays as it is set up
            server_header=False,
            timeout_keep_alive=int(KEEP_ALIVE_S),
            timeout_graceful_shutdown=math.ceil(max(0.0, graceful_timeout_s)),
        )
        self._server = _Embedded(self.config)
        self._task: asyncio.Task[None] | None = None
        self.port: int | None = None
        self.address: str | None = None

    async def start(self) -> str:
        """Bind, start serving, return the announced "host:port". Raises HttpStartError."""
        if self._task is not None:
            raise RuntimeError("the HTTP server was started already")
        sock = _bind(self.host, self._port, self.config.backlog)
        self.port = sock.getsockname()[1]
        self.address = format_http_address(self.advertise, self.port)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="http_server")
        up = asyncio.create_task(self._server.up.wait())
        try:
            await asyncio.wait({up, self._task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            up.cancel()
        if not self._server.up.is_set():
            exc = self._task.exception() if self._task.done() else None
            sock.close()
            if isinstance(exc, HttpStartError):
                raise exc
            raise HttpStartError(f"the HTTP server stopped before it started: {exc!r}")
        log.info("serving HTTP on %s (bound %s:%d)", self.address, self.host, self.port)
        return self.address

    @property
    def connections(self) -> int:
        """Open client connections (tests, metrics)."""
        return len(self._server.server_state.connections)

    async def drain(self) -> None:
        """No new connections; in-flight requests finish within the grace timeout; the app's
        lifespan shutdown runs; returns when the server is done."""
        if self._task is None:
            return
        self._server.should_exit = True
        self._server.exit.set()
        try:
            await asyncio.shield(self._task)
        except Exception:
            log.exception("the HTTP server failed while draining")


def _bind(host: str, port: int, backlog: int) -> socket.socket:
    """A listening socket on `host` (a name, IPv4 or IPv6 address); port 0: a free one."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, proto, _, where = infos[0]
        # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say TCP (with
        # Nagle on, a response written as head then body waits for the client's delayed ACK)
        sock = socket.socket(family, socket.SOCK_STREAM, proto or socket.IPPROTO_TCP)
    except OSError as exc:
        raise HttpStartError(f"cannot bind {host}:{port}: {exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(where)
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise HttpStartError(f"cannot bind {host}:{port}: {exc}") from None
    return sock

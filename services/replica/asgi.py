"""The replica's ASGI app: what user code sees of an HTTP request, whichever carrier brought it.

`build_asgi_app(user, route_prefix=...)` returns one `ReplicaAsgi` per user object (built once,
then the same object: the replica's HTTP server and the NATS carrier share it, and with it the
app's lifespan):

- a class decorated with `@serve.ingress(app)` serves that FastAPI/Starlette/ASGI app; the
  routes defined as methods in the class body run bound to the replica's instance
  (fleetpulse/serve/ingress.py), the route prefix is the scope's `root_path` (so `/docs` and
  `url_for` work under it) and the app's lifespan runs once, before the replica is ready;
- any other deployment is served by `CallApp`: its `__call__` gets a Starlette `Request` (or
  nothing when it takes no parameter, as Ray Serve does) and what it returns becomes the response
  (bytes, str, JSON values, `serve.Response`, any Starlette/FastAPI `Response`, a sync or async
  generator streamed item by item).

How a request goes through `ReplicaAsgi.__call__`:
1. `lifespan` scopes (from a server run with lifespan on) start/stop the app's lifespan once;
   the replica also calls `startup()`/`shutdown()` itself, whichever comes first wins.
2. For `http` and `websocket`: `root_path` set from the route prefix when the server left it
   empty, the lifespan state copied into `scope["state"]`, the instance bound for class routes.
3. `http` only: a client that disconnects before the response is complete cancels the handler
   (Ray Serve's semantics: the handler sees `asyncio.CancelledError`). On the replica's own
   HTTP/1.1 connection (http_cycle.py) the connection hears the disconnect and cancels the
   task itself, and the app gets the connection's `receive` and `send` as they are. On any
   other server, once a request has run for 1 s (`WATCH_AFTER_S`), a `_Watch` reads the
   server's `receive` one message ahead (never more than one part of a body the handler has
   not read: the rest stays in the server's flow control) to hear it. The scope says ASGI 2.4,
   so Starlette's streamed responses rely on this too instead of a task group of their own per
   response. A handler that raises gets a 500 (JSON
   `{"error": "user_error", "message": "<type>: <text>"}`, as the proxy answers), its traceback
   in a log line at most once per interval per exception type; if the response had started the
   error goes on up, so the server breaks the connection instead of sending a short body.
4. `websocket`: sends wait at most `ws_send_timeout_s` for the peer to take the data (uvicorn's
   write buffer is bounded: a send waits while it is full); then the app gets a
   `WebSocketSendTimeout` and the connection is closed, with close code 1008 when the close
   frame still fits in the server's buffer. A stuck peer holds neither a task nor memory.

`serve_carried(app, HttpRequest, emit=..., collect=...)` runs a NATS-carried request through the
same app (translation in asgi_carrier.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import enum
import inspect
import json
import logging
import sys
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from pathlib import PurePath
from typing import TYPE_CHECKING, Any, Final

from starlette.requests import Request as StarletteRequest
from starlette.responses import Response as StarletteResponse
from starlette.responses import StreamingResponse

from fleetpulse.serve.api import Response as ServeResponse
from fleetpulse.serve.ingress import (
    INGRESS_ATTR,
    LATE_BUILDER,
    bind_class_routes,
    enter_servable,
    leave_servable,
)
from fleetpulse.serve.multiplex import (
    model_id_from_headers,
    reset_request_model_id,
    set_request_model_id,
)
from shared.clock import SYSTEM_CLOCK, Clock
from shared.wire.messages import HttpRequest

from .asgi_carrier import AsgiProtocolError, ResponseFrames, scope_of
from .usercode import MethodNotFound, UserDeployment, invoke, is_stream, thread_iter

if TYPE_CHECKING:
    from services.replica.http_cycle import RequestCycle

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DISCONNECT: Final = {"type": "http.disconnect"}
WS_SEND_TIMEOUT_S: Final = 30.0
WS_STUCK_CLOSE_CODE: Final = 1008  # policy violation: the peer does not read what it is sent
ERROR_LOG_INTERVAL_S: Final = 5.0
WATCH_AFTER_S: Final = 1.0
"""A request still running after this long gets its own disconnect watch (see _Watch): sooner
costs a task for every request of a busy replica (measured: 16 concurrent in-process requests
went from 10,500 to 4,500 per second with a 5 ms threshold), and a request quicker than this
ends before a cancellation would save much."""
OK: Final = "ok"
USER_ERROR: Final = "user_error"
DISCONNECTED: Final = "client_disconnected"


class WebSocketSendTimeout(Exception):
    """The WebSocket peer did not take a message within the send timeout; the connection is
    closed with code 1008."""


class _ErrorLog:
    """At most one line (with the traceback) per exception type per interval; counts the rest."""

    def __init__(self, clock: Clock, interval_s: float) -> None:
        self._clock = clock
        self._interval = interval_s
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self.count = 0

    def error(self, where: str, exc: BaseException) -> None:
        self.count += 1
        kind = type(exc).__name__
        now = self._clock.monotonic()
        last = self._last.get(kind)
        if last is not None and now - last < self._interval:
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return
        self._last[kind] = now
        more = self._suppressed.pop(kind, 0)
        suffix = f" ({more} more since the last line)" if more else ""
        log.error("%s raised %s: %s%s", where, kind, exc, suffix, exc_info=exc)


def error_body(exc: BaseException) -> bytes:
    return json.dumps({"error": USER_ERROR, "message": f"{type(exc).__name__}: {exc}"}).encode()


async def _send_500(send: Send, exc: BaseException) -> None:
    body = error_body(exc)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"fp-error", USER_ERROR.encode()),
    ]
    await send({"type": "http.response.start", "status": 500, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


# -- what __call__ returns -> a Starlette response --------------------------------------------


def stream_item_bytes(item: Any) -> bytes:
    """One item of a streamed body: bytes as they are, str as UTF-8, else a line of JSON."""
    if isinstance(item, bytes | bytearray | memoryview):
        return bytes(item)
    if isinstance(item, str):
        return item.encode()
    return json.dumps(item, default=jsonable).encode() + b"\n"


async def _stream_bytes(items: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    async for item in items:
        yield stream_item_bytes(item)


def to_response(value: Any) -> StarletteResponse:
    """What a `__call__` returned, as a Starlette response."""
    if isinstance(value, StarletteResponse):
        return value
    if isinstance(value, ServeResponse):
        body = value.body.encode() if isinstance(value.body, str) else bytes(value.body)
        return StarletteResponse(body, value.status, headers=dict(value.headers))
    if inspect.isgenerator(value):  # a sync generator object: driven in the thread pool
        value = thread_iter(value)
    if is_stream(value):
        return StreamingResponse(_stream_bytes(value), media_type="application/octet-stream")
    if isinstance(value, _BYTES_LIKE):
        return StarletteResponse(bytes(value), media_type="application/octet-stream")
    if isinstance(value, str):
        return StarletteResponse(value.encode(), media_type="text/plain; charset=utf-8")
    return StarletteResponse(
        json.dumps(value, default=jsonable).encode(), media_type="application/json"
    )


_OCTETS: Final = b"application/octet-stream"
_TEXT: Final = b"text/plain; charset=utf-8"
_JSON: Final = b"application/json"


_BYTES_LIKE = (bytes, bytearray, memoryview)  # a tuple: isinstance checks it faster than a union


def plain_response(value: Any) -> tuple[int, list[tuple[bytes, bytes]], bytes] | None:
    """Status, headers and body of a whole (not streamed, not Starlette) result, what
    `to_response` would send, without building a Response object per request; None for the
    others."""
    if isinstance(value, _BYTES_LIKE):
        status, ctype, body, extra = 200, _OCTETS, bytes(value), None
    elif isinstance(value, str):
        status, ctype, body, extra = 200, _TEXT, value.encode(), None
    elif isinstance(value, ServeResponse):
        raw = value.body
        status, ctype, extra = value.status, None, value.headers
        body = raw.encode() if isinstance(raw, str) else bytes(raw)
    elif isinstance(value, StarletteResponse) or inspect.isgenerator(value) or is_stream(value):
        return None
    else:
        status, ctype, body, extra = 200, _JSON, json.dumps(value, default=jsonable).encode(), None
    # as Starlette's Response: no Content-Length on a status that has no body (1xx, 204, 304)
    sized = not (status < 200 or status == 204 or status == 304)
    headers = [(b"content-length", str(len(body)).encode())] if sized else []
    if ctype is not None:
        headers.append((b"content-type", ctype))
    if extra:
        given = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()]
        headers = [h for h in headers if h[0] != b"content-length"] + given
        if sized and not any(k == b"content-length" for k, _ in given):
            headers.append((b"content-length", str(len(body)).encode()))
    return status, headers, body


def jsonable(value: Any) -> Any:
    """What `json.dumps` cannot write, as Ray Serve writes it (FastAPI's encoder): a mapping
    (Starlette's `query_params`, headers) as an object, a set or tuple as an array, a pydantic
    model by `model_dump`, a dataclass by its fields, a numpy value by `tolist`, an enum by its
    value, dates in ISO 8601, UUIDs, paths and decimals as strings."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    for method, kwargs in (("model_dump", {"mode": "json"}), ("tolist", {})):
        fn = getattr(value, method, None)
        if callable(fn) and not isinstance(value, type):
            return fn(**kwargs)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID | PurePath):
        return str(value)
    # decimal is not imported for this test (~0.3 MB resident in a replica): where nothing
    # imported it, no value is a Decimal
    decimal = sys.modules.get("decimal")
    if decimal is not None and isinstance(value, decimal.Decimal):
        return str(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def takes_request(fn: Callable[..., Any]) -> bool:
    """False for a handler without parameters (Ray Serve calls those with none)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: give it the request
        return True
    return any(
        p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params
    )


class CallApp:
    """ASGI app of a deployment without `@serve.ingress`: its `__call__` answers HTTP."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn
        self._with_request = takes_request(fn)
        self._coroutine = inspect.iscoroutinefunction(fn)  # decided once, not per request

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            # WebSockets need @serve.ingress with a FastAPI/Starlette app (as in Ray Serve):
            # closing before accept makes the server answer the upgrade with 403
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1003})
            return
        args = (await starlette_request(scope, receive),) if self._with_request else ()
        if self._coroutine:
            result = await self._fn(*args)
        else:
            result = await invoke(self._fn, args, {})
        if isinstance(result, StarletteResponse):  # what a Ray app returns most: as it is
            await result(scope, receive, send)
            return
        plain = plain_response(result)
        if plain is None:
            await to_response(result)(scope, receive, send)
            return
        status, headers, body = plain
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


async def starlette_request(scope: Scope, receive: Receive) -> StarletteRequest:
    """A Starlette `Request` whose body is already read when it came whole in the first message
    (a unary request: `await request.body()` then costs no async-generator round through
    `stream()`); a body still arriving is replayed to the request's `receive` as it came."""
    first = await receive()
    if first["type"] == "http.request" and not first.get("more_body", False):
        request = StarletteRequest(scope, receive)
        request._body = first.get("body", b"")  # what Request.body() caches after reading
        return request
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return first
        return await receive()

    return StarletteRequest(scope, replay)


# -- one request's view of the server ---------------------------------------------------------


class _Watch:
    """The request's view of the server. Reads pass straight through while the handler is quick;
    one that runs longer than `after_s` gets a reader of its own (`pump`), one message
    ahead, so a disconnect is seen while the handler runs and cancels `task` (a task per request
    would cost more than the rest of the request path: most requests end before the sweep)."""

    __slots__ = ("_has_item", "_has_space", "_in_receive", "_items", "_pump", "_receive",
                 "_send", "_task", "_want_pump", "complete", "disconnected", "since",
                 "started")  # fmt: skip

    def __init__(self, receive: Receive, send: Send, task: asyncio.Task[Any]) -> None:
        self._receive = receive
        self._send = send
        self._task = task
        self._items: deque[Message] = deque()
        self._has_item: asyncio.Event | None = None
        self._has_space: asyncio.Event | None = None
        self._pump: asyncio.Task[None] | None = None
        self.since = 0.0
        """When the request started (the loop's clock), for the sweep that arms the pump."""
        self._in_receive = False
        self._want_pump = False
        self.started = False
        self.complete = False
        self.disconnected = False

    def start_pump(self) -> None:
        if self.complete or self.disconnected or self._pump is not None:
            return
        if self._in_receive:  # the handler is reading itself: the pump starts when it is done
            self._want_pump = True
            return
        self._has_item = asyncio.Event()
        self._has_space = asyncio.Event()
        self._has_space.set()
        self._pump = asyncio.get_running_loop().create_task(self._run_pump())

    async def close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump

    async def _run_pump(self) -> None:
        has_item, has_space = self._has_item, self._has_space
        assert has_item is not None and has_space is not None
        while True:
            await has_space.wait()
            message = await self._receive()
            if message.get("type") == "http.disconnect":
                self.disconnected = True
                has_item.set()
                if not self.complete:
                    self._task.cancel()
                return
            self._items.append(message)
            if message.get("more_body", False):
                has_space.clear()  # more body: wait until the handler takes this part
            has_item.set()

    async def receive(self) -> Message:
        if self._pump is None:
            self._in_receive = True
            try:
                message = await self._receive()
            finally:
                self._in_receive = False
            if message.get("type") == "http.disconnect":
                self.disconnected = True
            elif self._want_pump:
                self._want_pump = False
                self.start_pump()
            return message
        has_item, has_space = self._has_item, self._has_space
        assert has_item is not None and has_space is not None
        while True:
            if self._items:
                message = self._items.popleft()
                if not self._items:
                    has_item.clear()
                has_space.set()
                return message
            if self.disconnected:
                return dict(DISCONNECT)
            await has_item.wait()

    async def send(self, message: Message) -> None:
        kind = message.get("type")
        if kind == "http.response.start":
            self.started = True
        elif kind == "http.response.body" and not message.get("more_body", False):
            self.complete = True  # a disconnect from now on does not cancel (background tasks)
        await self._send(message)


class _WsSend:
    """A WebSocket `send` that gives up on a peer that does not read (see the top)."""

    __slots__ = ("_send", "_timeout")

    def __init__(self, send: Send, timeout_s: float) -> None:
        self._send = send
        self._timeout = timeout_s

    async def __call__(self, message: Message) -> None:
        try:
            async with asyncio.timeout(self._timeout):
                await self._send(message)
        except TimeoutError:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await self._send({"type": "websocket.close", "code": WS_STUCK_CLOSE_CODE,
                                      "reason": "peer does not read"})  # fmt: skip
            raise WebSocketSendTimeout(
                f"the WebSocket peer took no data for {self._timeout:g} s; closed with "
                f"{WS_STUCK_CLOSE_CODE}"
            ) from None


# -- the replica's app ------------------------------------------------------------------------


class ReplicaAsgi:
    """The ASGI app a replica serves (see the top); one per user object."""

    def __init__(
        self,
        app: ASGIApp,
        instance: Any,
        *,
        route_prefix: str | None,
        has_lifespan: bool,
        clock: Clock = SYSTEM_CLOCK,
        ws_send_timeout_s: float = WS_SEND_TIMEOUT_S,
        watch_after_s: float = WATCH_AFTER_S,
    ) -> None:
        self.app = app
        self.watch_after_s = watch_after_s
        self.instance = instance
        self._root_prefix = ""
        self.route_prefix = route_prefix
        self.has_lifespan = has_lifespan
        self.is_ingress = has_lifespan
        """An `@serve.ingress` app (the others are a `__call__` served by CallApp)."""
        self.ws_send_timeout_s = ws_send_timeout_s
        self.errors = _ErrorLog(clock, ERROR_LOG_INTERVAL_S)
        self.disconnects = 0
        self.state: dict[str, Any] = {}
        # imported with the replica's app, not at this module's import (the NATS carrier's
        # replicas serve no HTTP of their own)
        from services.replica.http_cycle import RequestCycle

        self._cycle_type = RequestCycle
        self._running: dict[_Watch, None] = {}
        """Requests without a disconnect watch yet, oldest first (dicts keep order)."""
        self._sweeper: asyncio.Task[None] | None = None
        self._lifespan: _Lifespan | None = None
        self._lifespan_lock = asyncio.Lock()

    @property
    def route_prefix(self) -> str | None:
        return self._route_prefix

    @route_prefix.setter
    def route_prefix(self, prefix: str | None) -> None:
        self._route_prefix = prefix
        # the scope's root_path for requests under it ("" for none or "/"), worked out once
        self._root_prefix = "" if prefix in (None, "", "/") else str(prefix).rstrip("/")

    # lifespan ------------------------------------------------------------------------------

    async def startup(self) -> None:
        """Run the app's lifespan startup once (raises when the app reports it failed)."""
        async with self._lifespan_lock:
            if not self.has_lifespan or self._lifespan is not None:
                return
            self._lifespan = _Lifespan(self.app, self.state)
            await self._lifespan.startup()

    async def shutdown(self) -> None:
        """The app's lifespan shutdown (once), and the disconnect sweep stopped."""
        sweeper = self._sweeper
        if sweeper is not None:
            sweeper.cancel()
            await asyncio.gather(sweeper, return_exceptions=True)
        async with self._lifespan_lock:
            if self._lifespan is not None:
                lifespan, self._lifespan = self._lifespan, None
                await lifespan.shutdown()

    async def _serve_lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # requests ------------------------------------------------------------------------------

    def _prepare(self, scope: Scope) -> Scope:
        prefix = self._root_prefix
        if prefix and not scope.get("root_path"):
            path = str(scope.get("path", ""))
            if path == prefix or path.startswith(prefix + "/"):
                scope["root_path"] = prefix
        if self.state:
            state = scope.get("state")
            scope["state"] = {**self.state, **state} if state else dict(self.state)
        return scope

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._serve_lifespan(receive, send)
        elif kind == "http":
            await self.serve_http(scope, receive, send)
        else:
            if kind == "websocket":
                send = _WsSend(send, self.ws_send_timeout_s)
            token = enter_servable(self.instance)
            try:
                await self.app(self._prepare(scope), receive, send)
            finally:
                leave_servable(token)

    async def serve_http(
        self, scope: Scope, receive: Receive, send: Send, *, carried: bool = False
    ) -> str:
        """One HTTP request; returns its outcome ("ok", "user_error", "client_disconnected").
        `carried`: the NATS carrier, which has no client to lose (no disconnect watch) and
        answers an error before the response started with its own `user_error` reply."""
        task = asyncio.current_task()
        assert task is not None
        # the replica's own HTTP/1.1 connection hears a disconnect itself and cancels the task
        # when asked: its receive and send go to the app as they are (no watch, no sweep)
        cycle = getattr(send, "__self__", None)
        w: _Watch | RequestCycle
        if not carried and isinstance(cycle, self._cycle_type):
            w = cycle
            cycle.cancel_on_disconnect(task)
        else:
            w = _Watch(receive, send, task)
            if not carried:
                self._watch(w, task.get_loop())
        # class-based routes of an @serve.ingress app get the instance as `self` (a CallApp's
        # `__call__` is bound already)
        token = enter_servable(self.instance) if self.is_ingress else None
        # the serve_multiplexed_model_id header names the request's model (multiplexing); over
        # the NATS carrier without it, the model the router's Request named stays in place
        model = model_id_from_headers(scope.get("headers") or ())
        model_token = set_request_model_id(model) if model is not None else None
        # ASGI 2.4: Starlette's StreamingResponse and FileResponse then send without a task
        # group listening for the disconnect (under 2.3 each takes one, and loading anyio's
        # asyncio backend for it costs a replica 1.4 MB resident for good); `w` hears it instead
        scope["asgi"] = {"version": "3.0", "spec_version": "2.4"}
        try:
            await self.app(self._prepare(scope), w.receive, w.send)
            if w.disconnected and not w.complete:  # the app saw the disconnect itself
                self.disconnects += 1
                return DISCONNECTED
            return OK
        except asyncio.CancelledError:
            if w.disconnected and task.cancelling() == 1:  # ours alone, not the server's
                task.uncancel()
                self.disconnects += 1
                return DISCONNECTED
            raise
        except Exception as exc:
            self.errors.error(f"{type(self.instance).__name__} (HTTP)", exc)
            if not w.started:
                if carried:
                    raise
                await _send_500(send, exc)
            elif not w.complete:
                raise  # a started response cannot change its status: the server cuts it short
            return USER_ERROR
        finally:
            if token is not None:
                leave_servable(token)
            if model_token is not None:
                reset_request_model_id(model_token)
            if isinstance(w, _Watch):
                self._running.pop(w, None)
                await w.close()

    def _watch(self, w: _Watch, loop: asyncio.AbstractEventLoop) -> None:
        """Register a running request with the sweep (one timer task for all of them, alive
        while requests run: a timer per request cost more than the rest of the ASGI path)."""
        w.since = loop.time()
        self._running[w] = None
        if self._sweeper is None:
            self._sweeper = loop.create_task(self._sweep(loop), name="asgi-disconnect-sweep")

    async def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            while self._running:
                await asyncio.sleep(self.watch_after_s / 4)
                due = loop.time() - self.watch_after_s
                for w in [w for w in self._running if w.since <= due]:
                    del self._running[w]
                    w.start_pump()
        finally:
            self._sweeper = None


class _Lifespan:
    """Drives an app's lifespan protocol from the replica (uvicorn's, in a few lines)."""

    def __init__(self, app: ASGIApp, state: dict[str, Any]) -> None:
        self._app = app
        self._state = state
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        self._outbox: asyncio.Queue[Message] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._supported = True

    async def _run(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"},
                 "state": self._state}  # fmt: skip
        try:
            await self._app(scope, self._inbox.get, self._outbox.put)
        except BaseException as exc:  # an app without lifespan support raises on the scope
            await self._outbox.put({"type": "_ended", "error": exc})
            if isinstance(exc, asyncio.CancelledError):
                raise
        else:
            await self._outbox.put({"type": "_ended", "error": None})

    async def startup(self) -> None:
        self._task = asyncio.create_task(self._run(), name="asgi-lifespan")
        await self._inbox.put({"type": "lifespan.startup"})
        reply = await self._outbox.get()
        if reply["type"] == "lifespan.startup.failed":
            raise RuntimeError(f"the app's lifespan startup failed: {reply.get('message', '')}")
        if reply["type"] == "_ended":  # no lifespan support: nothing to run
            self._supported = False
            if reply["error"] is not None:
                log.debug("the app does not run a lifespan: %r", reply["error"])

    async def shutdown(self) -> None:
        if self._task is None:
            return
        if self._supported and not self._task.done():
            await self._inbox.put({"type": "lifespan.shutdown"})
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(30.0):
                    reply = await self._outbox.get()
                    if reply["type"] == "lifespan.shutdown.failed":
                        log.warning("the app's lifespan shutdown failed: %s", reply.get("message"))
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def _ingress_app(instance: Any, marked: Any) -> Any:
    if marked is None:  # late-bound: the instance builds it
        return getattr(instance, LATE_BUILDER)()
    if inspect.isfunction(marked):  # a builder, run in the replica (Ray's semantics)
        return marked()
    return marked


def build_asgi_app(
    user: UserDeployment | Any,
    *,
    route_prefix: str | None = None,
    clock: Clock = SYSTEM_CLOCK,
    ws_send_timeout_s: float = WS_SEND_TIMEOUT_S,
    watch_after_s: float = WATCH_AFTER_S,
) -> ReplicaAsgi:
    """The replica's ASGI app for `user` (a UserDeployment, or a user instance/function). Built
    once per UserDeployment: a later call returns the same app (with `route_prefix` set when
    given), so the HTTP server and the NATS carrier share the app and its lifespan."""
    if isinstance(user, UserDeployment):
        cached = getattr(user, "_asgi", None)
        if isinstance(cached, ReplicaAsgi):
            if route_prefix is not None:
                cached.route_prefix = route_prefix
            return cached
        instance = user.instance
    else:
        instance = user
    cls: type = type(instance)
    if not inspect.isfunction(instance) and hasattr(cls, INGRESS_ATTR):
        app = _ingress_app(instance, getattr(cls, INGRESS_ATTR))
        # routes included after the decorator ran are bound now (idempotent for the rest)
        with contextlib.suppress(ImportError):
            from fastapi import APIRouter, FastAPI

            if isinstance(app, FastAPI | APIRouter):
                bind_class_routes(app, cls)
        built = ReplicaAsgi(app, instance, route_prefix=route_prefix, has_lifespan=True,
                            clock=clock, ws_send_timeout_s=ws_send_timeout_s,
                            watch_after_s=watch_after_s)  # fmt: skip
    else:
        try:
            fn = user.resolve("__call__") if isinstance(user, UserDeployment) else instance
        except MethodNotFound as exc:  # served by handle only (Ray's Doubler): HTTP gets a 500
            fn = _no_call(str(exc))
        built = ReplicaAsgi(CallApp(fn), instance, route_prefix=route_prefix, has_lifespan=False,
                            clock=clock, ws_send_timeout_s=ws_send_timeout_s,
                            watch_after_s=watch_after_s)  # fmt: skip
    if isinstance(user, UserDeployment):
        user._asgi = built
    return built


def _no_call(reason: str) -> Callable[[], Any]:
    """A deployment without `__call__` starts (Ray's do: handles call its methods); an HTTP
    request to it fails then, not the replica's start."""

    def no_call() -> Any:
        raise MethodNotFound(reason)

    return no_call


async def serve_carried(
    app: ReplicaAsgi, req: HttpRequest, *, emit: Callable[[bytes], Awaitable[None]], collect: bool
) -> int:
    """Run a NATS-carried request through the app; `emit` sends one chunk payload. Returns how
    many chunks went out. Raises ScopeError for a request that is no HTTP request, the user's
    exception when it raised before the response started (the runtime answers `user_error`),
    or when a started response broke off (the stream ends in an error, never short)."""
    scope = scope_of(req, route_prefix=app.route_prefix)
    frames = ResponseFrames(collect)
    done = asyncio.Event()
    sent = 0
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": req.body, "more_body": False}
        await done.wait()  # the carrier has no client to lose: "disconnect" once answered
        return dict(DISCONNECT)

    async def send(message: Message) -> None:
        nonlocal sent
        for data in frames.feed(message):
            await emit(data)
            sent += 1
        if frames.complete:
            done.set()

    try:
        await app.serve_http(scope, receive, send, carried=True)
    finally:
        done.set()
    if not frames.complete:
        raise AsgiProtocolError("the app returned without completing its response")
    return sent

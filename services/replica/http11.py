"""The replica's HTTP/1.1 connection: httptools parses, one ASGI cycle per request, a unary
response's head and body in one send, nothing per request that a connection can keep.

How it works: uvicorn's `Server` still owns the listening socket, the app's lifespan, WebSocket
upgrades (its protocol takes the transport over) and the shutdown; `HttpConnection` replaces
its httptools protocol (the `http=` class of `uvicorn.Config`) because per request that protocol
cost 77 us of CPU against 30 us for the bare parse-and-write on this machine, and 0.06 ms of
sequential p50 behind HAProxy (docs/architecture.md, "The replica's HTTP/1.1 connection"):

- A connection reads with httptools. `on_headers_complete` builds the ASGI scope and a
  `RequestCycle`; the app's task starts after `feed_data` returns, so a request that came in one
  read is whole when the app first calls `receive` (no wait, no event per request). A request
  that arrives while one is in flight (pipelining) waits in order, reading paused.
- `receive` hands over the body read so far (a future only when the app waits for more, reading
  resumed then and paused above `HIGH_WATER` unread); after the response or a disconnect it says
  `http.disconnect` (waiting until then if the body is all read, as the ASGI spec asks).
- `send` keeps the response head until the first body message of the same loop turn and writes
  both in one `transport.write` (else the head leaves at the turn's end): a unary response is one
  send, which a kill cannot split (HAProxy retries an empty response, never a truncated 200). Without Content-Length the body is chunked (HTTP/1.1);
  HEAD, 204 and 304 get no body. A full transport (pause_writing) makes `send` wait.
- Keep-alive costs no timer per request: the server's tick (`sweep_idle`) closes connections idle
  longer than the keep-alive timeout. `shutdown` (a drain) closes an idle connection at once and
  a busy one after its response.
Errors: a request httptools cannot parse gets 400 and the connection closes; an app that raises
before responding gets 500 (after responding: the connection closes); either is logged.
"""

from __future__ import annotations

import asyncio
import logging
import re
import urllib.parse
from collections import deque
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, Final

import httptools
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from services.replica.metrics import HTTP_REFUSED
from shared.bus import RateLimiter

log = logging.getLogger(__name__)

HIGH_WATER: Final = 64 * 1024
"""Unread request body above which reading pauses until the app receives."""
MAX_HEAD_BYTES: Final = 64 * 1024
"""A request head (request line and headers) larger than this gets 431 and the connection closes."""
REFUSAL_LOG_INTERVAL_S: Final = 10.0
_refusal_log = RateLimiter(REFUSAL_LOG_INTERVAL_S)
_NAME_BAD = re.compile(b'[\x00-\x1f\x7f()<>@,;:\\[\\]={} \t\\\\"]')
_VALUE_BAD = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]")  # no CR or LF: no header injection
_NO_BODY_STATUS: Final = frozenset({204, 304})


def _status_line(code: int) -> bytes:
    try:
        phrase = HTTPStatus(code).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %s\r\n" % (code, phrase)


STATUS_LINE: Final = {code: _status_line(code) for code in range(100, 600)}


class HttpConnection(asyncio.Protocol):
    """One client connection (HAProxy's, or any HTTP/1.1 client's) to the replica."""

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        if not config.loaded:
            config.load()
        self.config = config
        app = config.loaded_app
        # uvicorn wraps the app in its proxy-headers middleware (proxy_headers, on by default);
        # the connection does that middleware's work itself, with the same trusted hosts: the
        # peer's trust is decided once per connection, not per request (as much as the rest of
        # the middleware's per-request cost in the replica's profile)
        self._trusted: Any = None
        if isinstance(app, ProxyHeadersMiddleware):
            self._trusted = app.trusted_hosts
            app = app.app
        self.app = app
        self.loop = _loop or asyncio.get_event_loop()
        self.server_state = server_state
        self.app_state = app_state
        self.keep_alive_s: float = config.timeout_keep_alive
        self._asgi = {"version": config.asgi_version, "spec_version": "2.3"}
        self._root: str = config.root_path
        self._ws = config.ws_protocol_class is not None
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.server: tuple[str, int] | None = None
        self.client: tuple[str, int] | None = None
        self.cycle: RequestCycle | None = None  # the request whose response is being written
        self._waiting: deque[RequestCycle] = deque()  # parsed, not started (pipelined)
        self._parsing: RequestCycle | None = None  # the request the parser is reading
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_bytes = 0
        self._expect_continue = False
        self._read_paused = False
        self.write_paused = False
        self._writable: asyncio.Future[None] | None = None
        self.idle_since: float | None = None  # loop time the connection went idle

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server_state.connections.add(self)
        self.server = _address(transport.get_extra_info("sockname"))
        self.client = _address(transport.get_extra_info("peername"))
        if self._trusted is not None and (
            self.client is None or self.client[0] not in self._trusted
        ):
            self._trusted = None  # an untrusted peer's X-Forwarded-* headers are not read
        self.idle_since = self.loop.time()

    def data_received(self, data: bytes) -> None:
        self.idle_since = None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._upgrade_to_websocket():
                return
        except httptools.HttpParserError as exc:
            if self._head_bytes > MAX_HEAD_BYTES:  # on_header raised (the parser wraps it)
                self._refuse(431, "Request header fields too large")
            else:
                self._refuse(400, f"Invalid HTTP request: {exc}")
            return
        if self.cycle is None and self._waiting:
            self._start_next()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server_state.connections.discard(self)
        for cycle in (self.cycle, *self._waiting):
            if cycle is not None:
                cycle.disconnect()
        self._waiting.clear()
        self._resume_writers()

    def eof_received(self) -> bool | None:
        return None  # close our side too (the default); a response in flight sees a disconnect

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._resume_writers()

    # -- httptools callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._head_bytes = 0
        self._expect_continue = False

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value)
        if self._head_bytes > MAX_HEAD_BYTES:
            raise _HeadTooLarge
        # llhttp keeps trailing whitespace, which RFC 9110 5.5 excludes from a field value
        name, value = name.lower(), value.rstrip(b" \t")
        if name == b"expect" and value.lower() == b"100-continue":
            self._expect_continue = True
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self.parser
        if self._ws and parser.should_upgrade() and self._websocket_requested():
            return  # data_received hands the connection to the WebSocket protocol
        url = httptools.parse_url(self._url)
        raw_path: bytes = url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        root = self._root
        version = parser.get_http_version()
        client, scheme = self.client, "http"
        if self._trusted is not None:
            client, scheme = self._forwarded(client)
        scope = {
            "type": "http",
            "asgi": self._asgi,
            "http_version": version,
            "server": self.server,
            "client": client,
            "scheme": scheme,
            "method": parser.get_method().decode("ascii"),
            "root_path": root,
            "path": root + path,
            "raw_path": root.encode("ascii") + raw_path if root else raw_path,
            "query_string": url.query or b"",
            "headers": self._headers,
            "state": self.app_state.copy(),
        }
        keep_alive = version != "1.0" and parser.should_keep_alive()
        cycle = RequestCycle(self, scope, keep_alive, self._expect_continue)
        self._parsing = cycle
        self._waiting.append(cycle)
        if self.cycle is not None or len(self._waiting) > 1:
            self._pause_reading()  # pipelined: one response at a time, in order

    def on_body(self, body: bytes) -> None:
        cycle = self._parsing
        if cycle is not None:
            cycle.body_received(body)

    def on_message_complete(self) -> None:
        cycle = self._parsing
        if cycle is not None:
            self._parsing = None
            cycle.body_complete()

    def _forwarded(self, client: tuple[str, int] | None) -> tuple[tuple[str, int] | None, str]:
        """The client and scheme a trusted proxy's X-Forwarded-For and -Proto name, as uvicorn's
        ProxyHeadersMiddleware reads them."""
        proto: bytes | None = None
        forwarded_for = []
        for name, value in self._headers:
            if name == b"x-forwarded-proto":
                proto = value  # the last one counts
            elif name == b"x-forwarded-for":
                forwarded_for.append(value)
        scheme = "http"
        if proto is not None:
            given = proto.decode("latin1").strip()
            if given in ("http", "https", "ws", "wss"):
                scheme = given
        if forwarded_for:
            host, port = self._trusted.get_trusted_client_address(
                b", ".join(forwarded_for).decode("latin1")
            )
            if host:
                client = (host, port)
        return client, scheme

    # -- the connection's side of a cycle ------------------------------------------------------

    def _start_next(self) -> None:
        cycle = self.cycle = self._waiting.popleft()
        task = self.loop.create_task(cycle.run(self.app))
        tasks = self.server_state.tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def response_complete(self, cycle: RequestCycle) -> None:
        """The response's last byte is written: the next request may start."""
        if cycle is not self.cycle:
            return
        self.cycle = None
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        if not cycle.keep_alive:
            self.transport.close()
            return
        if self._waiting and self._waiting[0] is not self._parsing:
            self._start_next()
        else:
            self._resume_reading()
            if not self._waiting:
                self.idle_since = self.loop.time()

    def want_body(self) -> None:
        self._resume_reading()

    def too_much_body(self) -> None:
        self._pause_reading()

    async def writable(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = self.loop.create_future()
        await self._writable

    def _resume_writers(self) -> None:
        waiter, self._writable = self._writable, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _pause_reading(self) -> None:
        if not self._read_paused:
            self._read_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._read_paused:
            self._read_paused = False
            self.transport.resume_reading()

    # -- the server's side ---------------------------------------------------------------------

    def shutdown(self) -> None:
        """A drain: close now when idle, else after the response in flight."""
        if self.cycle is None and not self._waiting:
            self.transport.close()
            return
        for cycle in (self.cycle, *self._waiting):
            if cycle is not None:
                cycle.keep_alive = False

    def sweep_idle(self, now: float) -> None:
        """Close the connection if it has been idle longer than the keep-alive timeout."""
        since = self.idle_since
        if since is not None and now - since > self.keep_alive_s:
            self.transport.close()

    # -- refusals and upgrades -----------------------------------------------------------------

    def _refuse(self, status: int, message: str) -> None:
        HTTP_REFUSED.labels(str(status)).inc()
        if _refusal_log.allow():
            log.warning("HTTP %d to %s: %s (logged at most every %.0f s)",
                        status, _peer(self.client), message, REFUSAL_LOG_INTERVAL_S)  # fmt: skip
        if self.cycle is not None:  # a response is being written: an answer would garble it
            self.transport.close()
            return
        body = message.encode("ascii", "replace")
        head = [STATUS_LINE[status], _default_head(self.server_state)]
        head.append(
            b"content-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n" % len(body)
        )
        self.transport.write(b"".join((*head, b"connection: close\r\n\r\n", body)))
        self.transport.close()

    def _websocket_requested(self) -> bool:
        if self.config.ws_protocol_class is None:
            return False
        connection: list[bytes] = []
        upgrade = None
        for name, value in self._headers:
            if name == b"connection":
                connection = [t.strip().lower() for t in value.split(b",")]
            elif name == b"upgrade":
                upgrade = value.lower()
        return upgrade == b"websocket" and b"upgrade" in connection

    def _upgrade_to_websocket(self) -> bool:
        """Hand the connection to uvicorn's WebSocket protocol, with the request head replayed.
        False: not a WebSocket upgrade (the request is served as plain HTTP)."""
        if not self._websocket_requested():
            return False
        self.server_state.connections.discard(self)
        method = self.parser.get_method()
        head = [method, b" ", self._url, b" HTTP/1.1\r\n"]
        for name, value in self._headers:
            head += [name, b": ", value, b"\r\n"]
        head.append(b"\r\n")
        ws = self.config.ws_protocol_class(
            config=self.config, server_state=self.server_state, app_state=self.app_state
        )
        ws.connection_made(self.transport)
        self.transport.set_protocol(ws)
        ws.data_received(b"".join(head))
        return True


class RequestCycle:
    """One request and its response: the ASGI `receive` and `send` the app gets."""

    __slots__ = (
        "_body",
        "_bodyless",
        "_chunked",
        "_complete",
        "_conn",
        "_continue",
        "_drained",
        "_head",
        "_left",
        "_more_body",
        "_started",
        "_waiter",
        "disconnected",
        "keep_alive",
        "scope",
        "status",
    )

    def __init__(
        self, conn: HttpConnection, scope: dict[str, Any], keep_alive: bool, expect_continue: bool
    ) -> None:
        self._conn = conn
        self.scope = scope
        self.keep_alive = keep_alive
        self._continue = expect_continue  # "100 Continue" owed when the app first receives
        self._body = b""
        self._more_body = True
        self._drained = False  # the whole body was handed to the app
        self._waiter: asyncio.Future[None] | None = None
        self.disconnected = False
        self.status = 0  # the response's, once started
        self._started = False
        self._complete = False
        self._head: bytes | None = None  # a started response's head, written with its first body
        self._chunked = False
        self._bodyless = False  # HEAD, 204, 304: whatever body the app sends is not written
        self._left = 0  # Content-Length still to write

    # -- from the connection -------------------------------------------------------------------

    def body_received(self, body: bytes) -> None:
        self._body = self._body + body if self._body else body
        if len(self._body) > HIGH_WATER:
            self._conn.too_much_body()
        self._wake()

    def body_complete(self) -> None:
        self._more_body = False
        self._wake()

    def disconnect(self) -> None:
        self.disconnected = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    # -- ASGI ------------------------------------------------------------------------------------

    async def run(self, app: Callable[..., Any]) -> None:
        try:
            result = await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError) or not isinstance(exc, Exception):
                self._abandon()
                raise
            log.error("Exception in ASGI application", exc_info=exc)
            if not self._started:
                await self._internal_error()
            else:
                self._abandon()
        else:
            if result is not None:
                log.error("ASGI callable should return None, but returned %r", result)
                self._abandon()
            elif not self._started and not self.disconnected:
                log.error("ASGI callable returned without starting a response")
                await self._internal_error()
            elif not self._complete and not self.disconnected:
                log.error("ASGI callable returned without completing its response")
                self._abandon()

    async def receive(self) -> dict[str, Any]:
        conn = self._conn
        if self._continue and not conn.transport.is_closing():
            self._continue = False
            conn.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if not self.disconnected and not self._complete:
            if self._more_body and not self._body:
                conn.want_body()
                await self._wait()
            elif not self._more_body and not self._body and self._drained:
                await self._wait()  # the body is read: the next message is the disconnect
        if self.disconnected or self._complete:
            return {"type": "http.disconnect"}
        body, self._body = self._body, b""
        if self._more_body:
            conn.want_body()
        else:
            self._drained = True
        return {"type": "http.request", "body": body, "more_body": self._more_body}

    async def _wait(self) -> None:
        waiter = self._waiter = self._conn.loop.create_future()
        await waiter

    async def send(self, message: dict[str, Any]) -> None:
        conn = self._conn
        if conn.write_paused and not self.disconnected:
            await conn.writable()
        if self.disconnected:
            return
        kind = message["type"]
        if not self._started:
            if kind != "http.response.start":
                raise RuntimeError(f"expected ASGI message 'http.response.start', got {kind!r}")
            self._start(message)
            return
        if self._complete:
            raise RuntimeError(f"unexpected ASGI message {kind!r} after the response completed")
        if kind != "http.response.body":
            raise RuntimeError(f"expected ASGI message 'http.response.body', got {kind!r}")
        body: bytes = message.get("body", b"")
        more = message.get("more_body", False)
        if self._bodyless:
            data = b""
        elif self._chunked:
            data = b"%x\r\n%s\r\n" % (len(body), body) if body else b""
            if not more:
                data += b"0\r\n\r\n"
        else:
            if len(body) > self._left:
                raise RuntimeError("response content longer than Content-Length")
            self._left -= len(body)
            data = body
        head, self._head = self._head, None
        if head is not None:
            data = head + data if data else head
        if data:
            conn.transport.write(data)
        if not more:
            if self._left:
                raise RuntimeError("response content shorter than Content-Length")
            self._complete = True
            self._wake()
            conn.response_complete(self)

    def _start(self, message: dict[str, Any]) -> None:
        """Build the head (kept for the first body message); started only once it is valid, so
        an app's bad header still gets its 500."""
        status: int = message["status"]
        head = [STATUS_LINE[status], _default_head(self._conn.server_state)]
        length: int | None = None
        chunked = False
        close = False
        for name, value in message.get("headers", ()):
            if _NAME_BAD.search(name):
                raise RuntimeError(f"invalid HTTP header name {name!r}")
            if _VALUE_BAD.search(value):
                raise RuntimeError(f"invalid HTTP header value for {name!r}")
            name = name.lower()
            if name == b"content-length" and length is None and not chunked:
                length = int(value)
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                chunked, length = True, None
            elif name == b"connection" and b"close" in [
                t.strip().lower() for t in value.split(b",")
            ]:
                self.keep_alive = False
                close = True
            head += (name, b": ", value, b"\r\n")
        if not self.keep_alive and not close:
            head.append(b"connection: close\r\n")
        bodyless = self.scope["method"] == "HEAD" or status in _NO_BODY_STATUS
        if length is None and not chunked and not bodyless:
            chunked = True
            head.append(b"transfer-encoding: chunked\r\n")
        head.append(b"\r\n")
        self._chunked = chunked and not bodyless
        self._bodyless = bodyless
        self._left = 0 if bodyless or length is None else length
        self._head = b"".join(head)
        self.status = status
        self._started = True
        self._continue = False
        # the head waits for the first body message, but not past this loop turn: a stream's
        # client sees its headers before a slow first chunk
        self._conn.loop.call_soon(self._flush_head)

    def _flush_head(self) -> None:
        head, self._head = self._head, None
        if head is not None and not self.disconnected:
            self._conn.transport.write(head)

    async def _internal_error(self) -> None:
        body = b"Internal Server Error"
        headers = [(b"content-type", b"text/plain; charset=utf-8"),
                   (b"content-length", b"%d" % len(body)), (b"connection", b"close")]  # fmt: skip
        await self.send({"type": "http.response.start", "status": 500, "headers": headers})
        await self.send({"type": "http.response.body", "body": body})

    def _abandon(self) -> None:
        """A response that cannot be finished: close the connection (the client sees it cut)."""
        if not self._complete:
            self._complete = True
            self._head = None
            self.keep_alive = False
            conn = self._conn
            conn.transport.close()
            conn.response_complete(self)


class _HeadTooLarge(Exception):
    pass


class _DefaultHead:
    """The server's own headers (Date: uvicorn's tick puts a new list each second) as head
    lines, joined once per list."""

    __slots__ = ("_for", "_lines")

    def __init__(self) -> None:
        self._for: object = None
        self._lines = b""

    def __call__(self, server_state: Any) -> bytes:
        headers = server_state.default_headers
        if headers is not self._for:
            self._lines = b"".join(b"%s: %s\r\n" % (n, v) for n, v in headers)
            self._for = headers
        return self._lines


_default_head = _DefaultHead()


def _address(info: Any) -> tuple[str, int] | None:
    if isinstance(info, tuple | list) and len(info) >= 2:
        return str(info[0]), int(info[1])
    return None


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "a client"

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
- Each request's `receive` and `send` are its `RequestCycle`'s (services/replica/http_cycle.py):
  the body handed over as read, a unary response's head and body in one `transport.write`.
  The connection resumes reading when a cycle wants more body and pauses it above
  `HIGH_WATER` unread; a full transport (pause_writing) makes `send` wait.
- A trusted proxy's X-Forwarded-For and -Proto set the scope's client and scheme, as uvicorn's
  proxy-headers middleware (which the connection unwraps) would, the peer's trust decided once.
- Keep-alive costs no timer per request: the server's tick (`sweep_idle`) closes connections idle
  longer than the keep-alive timeout. `shutdown` (a drain) closes an idle connection at once and
  a busy one after its response.
Errors: a request httptools cannot parse gets 400 and the connection closes; an app that raises
before responding gets 500 (after responding: the connection closes); either is logged.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from collections import deque
from typing import Any, Final

import httptools
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from services.replica.http_cycle import STATUS_LINE, RequestCycle, default_head
from services.replica.metrics import HTTP_REFUSED
from shared.bus import RateLimiter

log = logging.getLogger(__name__)

MAX_HEAD_BYTES: Final = 64 * 1024
"""A request head (request line and headers) larger than this gets 431 and the connection closes."""
REFUSAL_LOG_INTERVAL_S: Final = 10.0
_refusal_log = RateLimiter(REFUSAL_LOG_INTERVAL_S)


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
        self._forwarded_key: tuple[bytes | None, ...] | None = None
        self._forwarded_answer: tuple[tuple[str, int] | None, str] = (None, "http")
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
        ProxyHeadersMiddleware reads them. The answer for the last pair of values is kept: a
        front door sends the same ones request after request on a connection."""
        proto: bytes | None = None
        forwarded_for = []
        for name, value in self._headers:
            if name == b"x-forwarded-proto":
                proto = value  # the last one counts
            elif name == b"x-forwarded-for":
                forwarded_for.append(value)
        key = (proto, *forwarded_for)
        if key == self._forwarded_key:
            return self._forwarded_answer
        self._forwarded_key = key
        self._forwarded_answer = answer = self._read_forwarded(client, proto, forwarded_for)
        return answer

    def _read_forwarded(
        self, client: tuple[str, int] | None, proto: bytes | None, forwarded_for: list[bytes]
    ) -> tuple[tuple[str, int] | None, str]:
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
        # in the server's tasks (its shutdown waits for them) until the cycle's run ends: it
        # takes itself out, no done callback to schedule
        cycle.task = task = self.loop.create_task(cycle.run(self.app))
        self.server_state.tasks.add(task)

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
        head = [STATUS_LINE[status], default_head(self.server_state)]
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


class _HeadTooLarge(Exception):
    pass


def _address(info: Any) -> tuple[str, int] | None:
    if isinstance(info, tuple | list) and len(info) >= 2:
        return str(info[0]), int(info[1])
    return None


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "a client"

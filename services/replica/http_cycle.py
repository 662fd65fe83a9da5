"""One HTTP/1.1 request and its response as the app sees them: the ASGI `receive` and `send`
of services/replica/http11.py's connection.

How it works:
- The connection feeds the cycle what it parses (`body_received`, `body_complete`,
  `disconnect`). `receive` hands over the body read so far (a future only when the app waits
  for more, the connection reading again then, and pausing above `HIGH_WATER` unread); after
  the response or a disconnect it says `http.disconnect` (waiting until then once the body is
  all read, as the ASGI spec asks).
- `send` keeps the response head until the first body message of the same loop turn and writes
  both in one `transport.write` (else the head leaves at the turn's end): a unary response is
  one send, which a kill cannot split (HAProxy retries an empty response, never a truncated
  200). Without Content-Length the body is chunked; HEAD, 204 and 304 get no body. A header
  name or value that would break the head (CR, LF, controls) is refused before anything is
  written, so the app's error still gets its 500. A full transport makes `send` wait.
- `run` runs the app: a raise before the response is a 500, after it a cut connection; a
  CancelledError (a drain that ran out of time) cuts the connection and propagates.
- `cancel_on_disconnect(task)`: the replica's app layer asks for its handler's task to be
  cancelled when the connection is lost before the response is complete (the connection hears
  that itself: no reader waits on `receive` for it).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Mapping
from http import HTTPStatus
from typing import Any, Final, Protocol

log = logging.getLogger(__name__)

HIGH_WATER: Final = 64 * 1024
"""Unread request body above which reading pauses until the app receives."""
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


class Connection(Protocol):
    """What a cycle needs of its connection (http11.HttpConnection)."""

    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    server_state: Any
    write_paused: bool

    def want_body(self) -> None: ...

    def too_much_body(self) -> None: ...

    async def writable(self) -> None: ...

    def response_complete(self, cycle: RequestCycle) -> None: ...


class RequestCycle:
    """One request and its response: the ASGI `receive` and `send` the app gets."""

    __slots__ = (
        "_body",
        "_bodyless",
        "_cancel",
        "_chunked",
        "_conn",
        "_continue",
        "_drained",
        "_head",
        "_left",
        "_more_body",
        "_waiter",
        "complete",
        "disconnected",
        "keep_alive",
        "scope",
        "started",
        "status",
        "task",
    )

    def __init__(
        self, conn: Connection, scope: dict[str, Any], keep_alive: bool, expect_continue: bool
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
        self.started = False
        self.complete = False  # the response's last byte is written
        self._cancel: asyncio.Task[Any] | None = None
        self.task: asyncio.Task[None] | None = None  # what runs the app (set by the connection)
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
        task, self._cancel = self._cancel, None
        if task is not None and not self.complete:
            task.cancel()

    def cancel_on_disconnect(self, task: asyncio.Task[Any]) -> None:
        """Cancel `task` if the client leaves before the response is complete (the replica's
        handler, as Ray Serve cancels one; services/replica/asgi.py). Not after: a background
        task that runs once the response is written is not cut short."""
        if self.disconnected and not self.complete:
            task.cancel()
        else:
            self._cancel = task

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
            if not self.started:
                await self._internal_error()
            else:
                self._abandon()
        else:
            if result is not None:
                log.error("ASGI callable should return None, but returned %r", result)
                self._abandon()
            elif not self.started and not self.disconnected:
                log.error("ASGI callable returned without starting a response")
                await self._internal_error()
            elif not self.complete and not self.disconnected:
                log.error("ASGI callable returned without completing its response")
                self._abandon()
        finally:
            self._conn.server_state.tasks.discard(self.task)

    async def receive(self) -> dict[str, Any]:
        conn = self._conn
        if self._continue and not conn.transport.is_closing():
            self._continue = False
            conn.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if not self.disconnected and not self.complete:
            if self._more_body and not self._body:
                conn.want_body()
                await self._wait()
            elif not self._more_body and not self._body and self._drained:
                await self._wait()  # the body is read: the next message is the disconnect
        if self.disconnected or self.complete:
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

    async def send(self, message: Mapping[str, Any]) -> None:
        conn = self._conn
        if conn.write_paused and not self.disconnected:
            await conn.writable()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.started:
            if kind != "http.response.start":
                raise RuntimeError(f"expected ASGI message 'http.response.start', got {kind!r}")
            self._start(message)
            return
        if self.complete:
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
            self.complete = True
            self._wake()
            conn.response_complete(self)

    def _start(self, message: Mapping[str, Any]) -> None:
        """Build the head (kept for the first body message); started only once it is valid, so
        an app's bad header still gets its 500."""
        status: int = message["status"]
        head = [STATUS_LINE[status], default_head(self._conn.server_state)]
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
        self.started = True
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
        if not self.complete:
            self.complete = True
            self._head = None
            self.keep_alive = False
            conn = self._conn
            conn.transport.close()
            conn.response_complete(self)


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


default_head = _DefaultHead()

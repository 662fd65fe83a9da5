"""A lean HTTP/1.1 keep-alive client for benchmarks, and the closed loop that drives it.

Why not aiohttp or httpx: at ~0.3-0.6 ms per request, a general-purpose client spends about as
much CPU per request as the servers being compared, and on a 2-core machine that cost shares the
cores with the servers; it flattens the difference being measured. This client does the least
HTTP/1.1 needs: each request is pre-built bytes written in one call, one request in flight per
connection, the response parsed incrementally from what `data_received` hands over
(Content-Length framing, chunked transfer coding, or read-until-close), nothing else (no
redirects, no cookies, no TLS, no pipelining).

How it works: `ResponseParser` is a pure state machine over bytes (head -> body by length, or
chunk-size line -> chunk data -> ... -> trailers, or until EOF) that says when a response is
complete; `Connection` is an asyncio Protocol that writes a request and resolves a future when
its parser completes, stamping when the first body byte and the last byte arrived (time to first
chunk of a stream). `closed_loop` runs N workers, each awaiting its own call back to back for a
fixed time: sequential is N = 1, "16 concurrent" is 16 workers on 16 connections.

Standard library only: the Ray driver process of scripts/bench/http_ray.py imports it too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import cast
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 * 1024

# parser states
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILERS, _UNTIL_CLOSE, _DONE = range(8)


class HttpProtocolError(Exception):
    """The server's bytes are not an HTTP/1.1 response this client understands."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where requests go: host, port and the base path of a URL (`http://h:p/base`)."""

    host: str
    port: int
    path: str

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        u = urlsplit(url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"not an http:// URL: {url!r}")
        return cls(u.hostname, u.port or 80, u.path or "/")

    @property
    def authority(self) -> str:
        return f"{self.host}:{self.port}"


def build_request(
    method: str,
    endpoint: Endpoint,
    path: str | None = None,
    body: bytes = b"",
    headers: Sequence[tuple[str, str]] = (),
) -> bytes:
    """One request, ready to write: the head with Content-Length (when there is a body or the
    method carries one), then the body."""
    lines = [f"{method} {path or endpoint.path} HTTP/1.1", f"Host: {endpoint.authority}"]
    lines += [f"{k}: {v}" for k, v in headers]
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


@dataclass(slots=True)
class Response:
    status: int = 0
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytearray = field(default_factory=bytearray)
    """The body (left empty when the parser was told not to keep it)."""
    body_len: int = 0
    chunks: int = 0
    """Chunks of a chunked body (0 for a Content-Length body)."""
    first_body_at: float | None = None
    """perf_counter() when the first body byte arrived (None: empty body)."""
    done_at: float = 0.0
    keep_alive: bool = True


class ResponseParser:
    """Bytes in, one complete `Response` out. `feed` returns the bytes past the end of the
    response (empty for a well-behaved server), or None while it needs more."""

    def __init__(self, *, head_only: bool = False, keep_body: bool = True) -> None:
        self.response = Response()
        self._state = _HEAD
        self._buf = bytearray()
        self._left = 0
        self._head_only = head_only  # the answer to a HEAD request has no body
        self._keep_body = keep_body

    @property
    def done(self) -> bool:
        return self._state == _DONE

    def feed(self, data: bytes, now: float = 0.0) -> bytes | None:
        buf = self._buf
        buf += data
        while True:
            st = self._state
            if st == _HEAD:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > MAX_HEAD_BYTES:
                        raise HttpProtocolError("response head over 64 KiB")
                    return None
                self._head(bytes(buf[:end]))
                del buf[: end + 4]
            elif st == _LENGTH:
                if not buf:
                    return None
                take = min(self._left, len(buf))
                self._body(buf, take, now)
                del buf[:take]
                self._left -= take
                if self._left == 0:
                    self._state = _DONE
            elif st == _CHUNK_SIZE:
                end = buf.find(b"\r\n")
                if end < 0:
                    if len(buf) > 1024:
                        raise HttpProtocolError("chunk-size line over 1 KiB")
                    return None
                line = bytes(buf[:end]).split(b";", 1)[0].strip()
                del buf[: end + 2]
                try:
                    self._left = int(line, 16)
                except ValueError:
                    raise HttpProtocolError(f"bad chunk size {line[:20]!r}") from None
                if self._left < 0:
                    raise HttpProtocolError(f"bad chunk size {line[:20]!r}")
                self._state = _CHUNK_DATA if self._left else _TRAILERS
                if self._left:
                    self.response.chunks += 1
            elif st == _CHUNK_DATA:
                if not buf:
                    return None
                take = min(self._left, len(buf))
                self._body(buf, take, now)
                del buf[:take]
                self._left -= take
                if self._left == 0:
                    self._state = _CHUNK_END
            elif st == _CHUNK_END:
                if len(buf) < 2:
                    return None
                if buf[:2] != b"\r\n":
                    raise HttpProtocolError("chunk data not followed by CRLF")
                del buf[:2]
                self._state = _CHUNK_SIZE
            elif st == _TRAILERS:
                end = buf.find(b"\r\n")
                if end < 0:
                    return None
                del buf[: end + 2]
                if end == 0:  # the empty line that ends the trailers
                    self._state = _DONE
            elif st == _UNTIL_CLOSE:
                if buf:
                    self._body(buf, len(buf), now)
                    buf.clear()
                return None
            else:  # _DONE
                self.response.done_at = now
                rest = bytes(buf)
                buf.clear()
                return rest

    def eof(self, now: float = 0.0) -> None:
        """The server closed the connection: completes a read-until-close body, else the
        response was cut short."""
        if self._state == _UNTIL_CLOSE:
            self._state = _DONE
            self.response.done_at = now
            self.response.keep_alive = False
        elif self._state != _DONE:
            raise HttpProtocolError("connection closed before the response was complete")

    def _head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise HttpProtocolError(f"bad status line {lines[0][:60]!r}")
        try:
            status = int(parts[1])
        except ValueError:
            raise HttpProtocolError(f"bad status line {lines[0][:60]!r}") from None
        if 100 <= status < 200:  # an interim answer: the real head follows
            return
        r = self.response
        r.status = status
        length: int | None = None
        chunked = False
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise HttpProtocolError(f"bad header line {line[:60]!r}")
            name, value = name.strip().lower(), value.strip()
            r.headers.append((name, value))
            if name == "content-length":
                try:
                    length = int(value)
                except ValueError:
                    raise HttpProtocolError(f"bad Content-Length {value[:20]!r}") from None
            elif name == "transfer-encoding":
                chunked = value.lower().endswith("chunked")
            elif name == "connection":
                r.keep_alive = value.lower() != "close"
        if parts[0] == "HTTP/1.0" and not any(
            n == "connection" and v.lower() == "keep-alive" for n, v in r.headers
        ):
            r.keep_alive = False
        if self._head_only or status in (204, 304):
            self._state = _DONE
        elif chunked:
            self._state = _CHUNK_SIZE
        elif length is not None:
            self._left = length
            self._state = _LENGTH if length else _DONE
        else:
            self._state = _UNTIL_CLOSE
            r.keep_alive = False

    def _body(self, buf: bytearray, take: int, now: float) -> None:
        """The first `take` bytes of `buf` are body (the caller drops them from `buf`)."""
        r = self.response
        if r.first_body_at is None and take:
            r.first_body_at = now
        r.body_len += take
        if self._keep_body:
            r.body += buf if take == len(buf) else buf[:take]


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection, one request at a time."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._transport: asyncio.Transport | None = None
        self._parser: ResponseParser | None = None
        self._waiter: asyncio.Future[Response] | None = None
        self._closed = True

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio and uvloop both set TCP_NODELAY on TCP connections they make
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._closed = False

    def data_received(self, data: bytes) -> None:
        parser, waiter = self._parser, self._waiter
        if parser is None or waiter is None or waiter.done():
            return  # bytes nobody asked for: the next request's parser would choke on them
        try:
            rest = parser.feed(data, time.perf_counter())
        except HttpProtocolError as e:
            waiter.set_exception(e)
            self._abort()
            return
        if rest is not None:
            if rest:
                waiter.set_exception(HttpProtocolError("bytes after the response"))
                self._abort()
                return
            waiter.set_result(parser.response)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._transport = None
        parser, waiter = self._parser, self._waiter
        if parser is None or waiter is None or waiter.done():
            return
        try:
            parser.eof(time.perf_counter())
        except HttpProtocolError as e:
            waiter.set_exception(e)
            return
        waiter.set_result(parser.response)

    # -- use ---------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.create_connection(lambda: self, self.endpoint.host, self.endpoint.port)

    async def request(
        self, raw: bytes, *, head_only: bool = False, keep_body: bool = True
    ) -> Response:
        """Send pre-built request bytes; the response once complete. Reconnects first when the
        server closed the connection after the previous response."""
        if self._closed:
            await self.connect()
        assert self._transport is not None
        loop = asyncio.get_running_loop()
        self._parser = ResponseParser(head_only=head_only, keep_body=keep_body)
        waiter: asyncio.Future[Response] = loop.create_future()
        self._waiter = waiter
        self._transport.write(raw)
        try:
            resp = await waiter
        finally:
            self._parser = self._waiter = None
        if not resp.keep_alive:
            self._abort()
        return resp

    def close(self) -> None:
        self._abort()

    def _abort(self) -> None:
        if self._transport is not None:
            self._transport.close()
        self._closed = True


# -- the closed loop -------------------------------------------------------------------------


@dataclass(slots=True)
class LoadResult:
    latencies_s: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    errors: int = 0
    first_error: str = ""

    @property
    def throughput(self) -> float:
        return len(self.latencies_s) / self.elapsed_s if self.elapsed_s > 0 else 0.0


async def closed_loop(
    calls: Sequence[Callable[[], Awaitable[object]]],
    duration_s: float,
    max_requests: int | None = None,
) -> LoadResult:
    """Each call in `calls` is a worker that awaits it back to back until `duration_s` has
    passed (or `max_requests` were sent in all). A call raising counts as an error; the worker
    goes on. Latency is per call; elapsed from the first start to the last finish."""
    res = LoadResult()
    stop_at = time.perf_counter() + duration_s
    budget = [max_requests if max_requests is not None else -1]
    lat = res.latencies_s

    async def worker(call: Callable[[], Awaitable[object]]) -> None:
        while time.perf_counter() < stop_at and budget[0] != 0:
            budget[0] -= 1
            t0 = time.perf_counter()
            try:
                await call()
            except Exception as e:
                res.errors += 1
                if not res.first_error:
                    res.first_error = f"{type(e).__name__}: {e}"[:300]
                await asyncio.sleep(0.01)  # a dead target must not spin the loop
                continue
            lat.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in calls))
    res.elapsed_s = time.perf_counter() - t0
    return res


def checked(
    conn: Connection, raw: bytes, expect_len: int | None
) -> Callable[[], Awaitable[object]]:
    """A call that sends `raw` on `conn` and fails unless the answer is 200 with a body of
    `expect_len` bytes (any length when None; the content is checked once, in the warm-up, not
    per request)."""

    async def call() -> object:
        r = await conn.request(raw, keep_body=False)
        if r.status != 200 or (expect_len is not None and r.body_len != expect_len):
            raise HttpProtocolError(f"status {r.status}, {r.body_len} bytes")
        return None

    return call

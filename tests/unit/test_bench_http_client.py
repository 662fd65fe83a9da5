"""The benchmarks' lean HTTP/1.1 client (scripts/bench/httpclient.py): its framing, byte by byte
and against a tiny local server.

The parser is fed responses cut at every possible point (Content-Length, chunked with
extensions and trailers, read-until-close, bodiless statuses, an interim 100) and must give back
the same status and body; bad framing is a typed `HttpProtocolError`. The connection talks to an
asyncio server on a loopback port that answers by path: an echo by Content-Length, a chunked
stream whose chunks are spaced in time (the first body byte is stamped before the last), a
`Connection: close` answer (the next request reconnects) and an HTTP/1.0 body ended by closing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scripts.bench.httpclient import (
    Connection,
    Endpoint,
    HttpProtocolError,
    ResponseParser,
    build_request,
    checked,
    closed_loop,
)


def feed_in_pieces(raw: bytes, cuts: list[int], **kw: bool) -> ResponseParser:
    """Feed `raw` split at `cuts`; the parser must finish exactly at the last byte."""
    parser = ResponseParser(**kw)
    points = sorted({c for c in cuts if 0 < c < len(raw)})
    pieces = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    for i, piece in enumerate(pieces):
        rest = parser.feed(piece, now=float(i))
        if i < len(pieces) - 1:
            assert rest is None, "complete before its last byte"
        else:
            assert rest == b"", "not complete at its last byte"
    return parser


def chunked(body: bytes, sizes: list[int], trailers: bytes = b"") -> tuple[bytes, int]:
    """`body` in chunks of `sizes` (the rest in one more), and how many chunks that is."""
    out, pos, count = bytearray(), 0, 0
    for n in sizes:
        part = body[pos : pos + n]
        if not part:
            break
        out += b"%x;ext=1\r\n" % len(part) + part + b"\r\n"
        pos, count = pos + len(part), count + 1
    if pos < len(body):
        out += b"%X\r\n" % (len(body) - pos) + body[pos:] + b"\r\n"
        count += 1
    return bytes(out) + b"0\r\n" + trailers + b"\r\n", count


# -- the parser ----------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=300), cuts=st.lists(st.integers(0, 400), max_size=8))
def test_content_length_framing_at_any_cut(body: bytes, cuts: list[int]) -> None:
    raw = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-A: b\r\n\r\n" % len(body) + body
    r = feed_in_pieces(raw, cuts).response
    assert (r.status, bytes(r.body), r.body_len, r.chunks) == (200, body, len(body), 0)
    assert ("x-a", "b") in r.headers and r.keep_alive


@settings(max_examples=200, deadline=None)
@given(
    body=st.binary(max_size=300),
    sizes=st.lists(st.integers(1, 70), max_size=10),
    cuts=st.lists(st.integers(0, 500), max_size=10),
    trailers=st.sampled_from([b"", b"X-Trailer: 1\r\n"]),
)
def test_chunked_framing_at_any_cut(
    body: bytes, sizes: list[int], cuts: list[int], trailers: bytes
) -> None:
    framed, count = chunked(body, sizes, trailers)
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + framed
    r = feed_in_pieces(raw, cuts).response
    assert (bytes(r.body), r.chunks) == (body, count)


def test_the_chunk_count_and_the_first_body_byte_are_seen() -> None:
    raw = (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunked(b"abcdef", [2, 2, 2])[0]
    )
    head_end = raw.index(b"\r\n\r\n") + 4
    parser = ResponseParser()
    assert parser.feed(raw[:head_end], now=1.0) is None
    assert parser.response.first_body_at is None  # the head alone is no body
    assert parser.feed(raw[head_end:], now=2.0) == b""
    r = parser.response
    assert (bytes(r.body), r.chunks, r.first_body_at, r.done_at) == (b"abcdef", 3, 2.0, 2.0)


def test_a_body_without_length_ends_when_the_server_closes() -> None:
    parser = ResponseParser()
    assert parser.feed(b"HTTP/1.0 200 OK\r\n\r\nsome", now=1.0) is None
    assert parser.feed(b" more", now=2.0) is None
    parser.eof(now=3.0)
    r = parser.response
    assert (bytes(r.body), r.keep_alive, r.done_at) == (b"some more", False, 3.0)


@pytest.mark.parametrize(
    ("raw", "head_only"),
    [
        (b"HTTP/1.1 204 No Content\r\n\r\n", False),
        (b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n", False),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", True),  # the answer to a HEAD
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", False),
    ],
)
def test_bodiless_answers_end_with_their_head(raw: bytes, head_only: bool) -> None:
    parser = ResponseParser(head_only=head_only)
    assert parser.feed(raw) == b""
    assert parser.response.body_len == 0


def test_an_interim_100_is_skipped_and_keep_body_false_only_counts() -> None:
    raw = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 3\r\n\r\nabc"
    parser = ResponseParser(keep_body=False)
    assert parser.feed(raw) == b""
    r = parser.response
    assert (r.status, bytes(r.body), r.body_len) == (201, b"", 3)


def test_connection_close_and_http10_are_not_kept_alive() -> None:
    for raw in (
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx",
        b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx",
    ):
        parser = ResponseParser()
        assert parser.feed(raw) == b""
        assert not parser.response.keep_alive
    parser = ResponseParser()
    parser.feed(b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\nConnection: keep-alive\r\n\r\nx")
    assert parser.response.keep_alive


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 2x0 OK\r\n\r\n",
        b"SPDY 200 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXX",
    ],
)
def test_bad_framing_is_a_typed_error(raw: bytes) -> None:
    with pytest.raises(HttpProtocolError):
        ResponseParser().feed(raw)


def test_a_response_cut_short_by_a_close_is_an_error() -> None:
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
    with pytest.raises(HttpProtocolError, match="before the response was complete"):
        parser.eof()


def test_requests_carry_their_length_and_host() -> None:
    ep = Endpoint.parse("http://127.0.0.1:8123/app")
    assert (ep.host, ep.port, ep.path) == ("127.0.0.1", 8123, "/app")
    post = build_request("POST", ep, body=b"xyz", headers=(("X-A", "1"),))
    assert post == (
        b"POST /app HTTP/1.1\r\nHost: 127.0.0.1:8123\r\nX-A: 1\r\nContent-Length: 3\r\n\r\nxyz"
    )
    assert build_request("GET", ep, "/app?n=2") == (
        b"GET /app?n=2 HTTP/1.1\r\nHost: 127.0.0.1:8123\r\n\r\n"
    )
    assert b"Content-Length: 0" in build_request("POST", ep)
    with pytest.raises(ValueError, match="not an http"):
        Endpoint.parse("https://example.com/")


# -- against a tiny local server -----------------------------------------------------------------


class TinyServer:
    """Answers by path; counts the connections it accepted."""

    def __init__(self) -> None:
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                path = lines[0].split(" ")[1]
                length = 0
                for line in lines[1:]:
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":")[1])
                body = await reader.readexactly(length)
                if path == "/echo":
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
                    )
                elif path.startswith("/stream"):
                    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                    for part in (b"one", b"two", b"three"):
                        writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                        await writer.drain()
                        await asyncio.sleep(0.05)
                    writer.write(b"0\r\n\r\n")
                elif path == "/close":
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
                    )
                    await writer.drain()
                    return
                elif path == "/old":
                    writer.write(b"HTTP/1.0 200 OK\r\n\r\nuntil the end")
                    await writer.drain()
                    return
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@pytest.fixture
async def tiny() -> AsyncIterator[tuple[TinyServer, str]]:
    server = TinyServer()
    url = await server.start()
    yield server, url
    await server.stop()


async def test_keep_alive_echo_by_content_length(tiny: tuple[TinyServer, str]) -> None:
    server, url = tiny
    conn = Connection(Endpoint.parse(url + "/echo"))
    try:
        for body in (b"a", b"", b"x" * 70_000, b"last"):
            r = await conn.request(build_request("POST", conn.endpoint, body=body))
            assert (r.status, bytes(r.body)) == (200, body)
        assert server.connections == 1  # one connection kept alive for all four
    finally:
        conn.close()


async def test_a_chunked_stream_stamps_its_first_and_last_byte(
    tiny: tuple[TinyServer, str],
) -> None:
    _, url = tiny
    conn = Connection(Endpoint.parse(url))
    try:
        r = await conn.request(build_request("GET", conn.endpoint, "/stream"))
    finally:
        conn.close()
    assert (r.status, bytes(r.body), r.chunks) == (200, b"onetwothree", 3)
    assert r.first_body_at is not None
    assert r.done_at - r.first_body_at >= 0.08  # two 50 ms gaps between three chunks


async def test_a_closed_connection_is_reopened_for_the_next_request(
    tiny: tuple[TinyServer, str],
) -> None:
    server, url = tiny
    conn = Connection(Endpoint.parse(url))
    try:
        r = await conn.request(build_request("POST", conn.endpoint, "/close"))
        assert (r.status, bytes(r.body), r.keep_alive) == (200, b"ok", False)
        assert conn.closed
        r = await conn.request(build_request("POST", conn.endpoint, "/old"))
        assert (bytes(r.body), r.keep_alive) == (b"until the end", False)
        r = await conn.request(build_request("POST", conn.endpoint, "/echo", body=b"again"))
        assert bytes(r.body) == b"again"
        assert server.connections == 3
    finally:
        conn.close()


async def test_the_closed_loop_counts_requests_and_errors(tiny: tuple[TinyServer, str]) -> None:
    server, url = tiny
    conns = [Connection(Endpoint.parse(url + "/echo")) for _ in range(4)]
    raw = build_request("POST", conns[0].endpoint, body=b"12345")
    try:
        res = await closed_loop([checked(c, raw, 5) for c in conns], 0.3)
        assert res.errors == 0 and len(res.latencies_s) > 20
        assert server.connections == 4
        assert res.throughput == pytest.approx(len(res.latencies_s) / res.elapsed_s)
        any_length = await closed_loop([checked(conns[0], raw, None)], 10.0, max_requests=3)
        assert (any_length.errors, len(any_length.latencies_s)) == (0, 3)
        wrong = await closed_loop([checked(conns[0], raw, 6)], 10.0, max_requests=3)
        assert (wrong.errors, wrong.latencies_s) == (3, [])
        assert "5 bytes" in wrong.first_error
    finally:
        for c in conns:
            c.close()

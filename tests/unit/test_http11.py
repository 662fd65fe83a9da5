"""The replica's HTTP/1.1 connection (services/replica/http11.py), driven with request bytes
through a recording transport: one send per unary response, a stream's head with its first
chunk (or at its turn's end), chunked framing, pipelining in order, request bodies across reads,
100-continue, HEAD/204, refusals (400, 431), app errors (500, a cut connection), disconnects,
back-pressure, keep-alive sweeps and drains; and the same ASGI scope and body as uvicorn's own
httptools protocol for the same bytes, however the bytes are split into reads."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
import uvicorn
import websockets
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from services.replica.http11 import MAX_HEAD_BYTES, HttpConnection
from services.replica.http_server import ReplicaHttpServer

App = Callable[[Any, Any, Any], Awaitable[None]]


class Recording(asyncio.Transport):
    """A transport that records each send and whether reading is paused."""

    def __init__(self) -> None:
        super().__init__()
        self.sends: list[bytes] = []
        self.closed = False
        self.paused = False

    def write(self, data: Any) -> None:
        self.sends.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("10.0.0.9", 5000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_write_buffer_size(self) -> int:
        return 0

    @property
    def data(self) -> bytes:
        return b"".join(self.sends)


def connect(app: App, protocol: type = HttpConnection, **config: Any) -> tuple[Any, Recording]:
    config.setdefault("proxy_headers", False)
    cfg = uvicorn.Config(app, lifespan="off", log_config=None, **config)
    cfg.load()
    conn = protocol(config=cfg, server_state=ServerState(), app_state={"k": 1})
    transport = Recording()
    conn.connection_made(transport)
    return conn, transport


async def until(check: Callable[[], object]) -> None:
    for _ in range(2000):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError("not within 2,000 loop turns")


async def turns(n: int = 10) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def read_body(receive: Any) -> bytes:
    """The whole request body, message by message."""
    body = b""
    while True:
        m = await receive()
        body += m.get("body", b"")
        if not m.get("more_body"):
            return body


async def unary(scope: Any, receive: Any, send: Any) -> None:
    out = b"echo:" + await read_body(receive)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"%d" % len(out))]})  # fmt: skip
    await send({"type": "http.response.body", "body": out})


def gated(gate: asyncio.Event) -> App:
    """`unary`, once `gate` is set."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await gate.wait()
        await unary(scope, receive, send)

    return app


def responses(data: bytes) -> list[tuple[bytes, bytes]]:
    """(head, body) of each Content-Length response in `data`."""
    out = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        out.append((head, rest[:length]))
        data = rest[length:]
    return out


GET = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"


async def test_a_unary_response_leaves_in_one_send_and_keep_alive_serves_the_next() -> None:
    conn, t = connect(unary)
    conn.data_received(GET)
    await until(lambda: t.sends)
    await turns()
    assert len(t.sends) == 1
    head, body = responses(t.sends[0])[0]
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and body == b"echo:"
    assert b"connection: close" not in head and not t.closed
    conn.data_received(b"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
    await until(lambda: len(t.sends) == 2)
    assert responses(t.sends[1])[0][1] == b"echo:abc"


async def test_a_stream_sends_its_head_with_the_first_chunk_then_each_chunk_chunked() -> None:
    step = asyncio.Event()

    async def streamed(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        await step.wait()
        await send({"type": "http.response.body", "body": b"second", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    conn, t = connect(streamed)
    conn.data_received(GET)
    await until(lambda: t.sends)
    await turns()
    assert len(t.sends) == 1
    assert b"transfer-encoding: chunked" in t.sends[0] and t.sends[0].endswith(
        b"\r\n\r\n5\r\nfirst\r\n"
    )
    step.set()
    await until(lambda: len(t.sends) == 3)
    assert t.sends[1:] == [b"6\r\nsecond\r\n", b"0\r\n\r\n"]


async def test_a_head_waiting_for_a_slow_first_chunk_leaves_at_its_turns_end() -> None:
    step = asyncio.Event()

    async def slow(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await step.wait()
        await send({"type": "http.response.body", "body": b"late"})

    conn, t = connect(slow)
    conn.data_received(GET)
    await until(lambda: t.sends)
    assert t.sends[0].endswith(b"\r\n\r\n")  # the head alone: the client sees it before the body
    step.set()
    await until(lambda: len(t.sends) == 2)
    assert t.sends[1] == b"4\r\nlate\r\n0\r\n\r\n"


async def test_pipelined_requests_are_answered_in_order_one_at_a_time() -> None:
    started: list[str] = []
    release = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        started.append(scope["path"])
        if scope["path"] == "/1":
            await release.wait()
        await unary(scope, receive, send)

    conn, t = connect(app)
    conn.data_received(b"GET /1 HTTP/1.1\r\nHost: x\r\n\r\nGET /2 HTTP/1.1\r\nHost: x\r\n\r\n")
    await turns()
    assert started == ["/1"] and t.paused  # /2 waits, and so does the socket
    release.set()
    await until(lambda: len(responses(t.data)) == 2)
    assert started == ["/1", "/2"] and not t.paused


async def test_a_body_across_reads_is_received_in_parts_and_reading_follows_the_app() -> None:
    got: list[tuple[bytes, bool]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while True:
            m = await receive()
            got.append((m["body"], m["more_body"]))
            if not m["more_body"]:
                break
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    conn, t = connect(app)
    conn.data_received(
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"
    )
    await until(lambda: got)
    conn.data_received(b"2\r\nde\r\n0\r\n\r\n")
    await until(lambda: t.sends)
    assert b"".join(b for b, _ in got) == b"abcde" and got[-1][1] is False
    head = t.sends[0]
    assert head.startswith(b"HTTP/1.1 204 ") and b"transfer-encoding" not in head


async def test_a_large_unread_body_pauses_reading_until_the_app_receives() -> None:
    gate = asyncio.Event()
    total = 0

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal total
        await gate.wait()
        while True:
            m = await receive()
            total += len(m["body"])
            if not m["more_body"]:
                break
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]}
        )
        await send({"type": "http.response.body", "body": b""})

    conn, t = connect(app)
    size = 200_000
    conn.data_received(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size)
    conn.data_received(b"x" * 100_000)
    assert t.paused  # 100 kB nobody read yet
    gate.set()
    await until(lambda: not t.paused)
    conn.data_received(b"x" * 100_000)
    await until(lambda: t.sends)
    assert total == size


async def test_100_continue_is_sent_when_the_app_first_receives_not_before() -> None:
    gate = asyncio.Event()
    app = gated(gate)

    conn, t = connect(app)
    conn.data_received(
        b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n"
    )
    await turns()
    assert t.sends == []
    gate.set()
    await until(lambda: t.sends)
    assert t.sends == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    conn.data_received(b"hi")
    await until(lambda: len(t.sends) == 2)
    assert responses(t.sends[1])[0][1] == b"echo:hi"


async def test_head_and_http_1_0_and_connection_close() -> None:
    conn, t = connect(unary)
    conn.data_received(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n")
    await until(lambda: t.sends)
    head = t.sends[0]
    assert head.endswith(b"\r\n\r\n") and b"content-length: 5" in head  # no body after the head
    conn.data_received(b"GET / HTTP/1.0\r\n\r\n")
    await until(lambda: t.closed)
    assert b"connection: close" in t.sends[-1] and t.sends[-1].endswith(b"echo:")


def refused(status: str) -> float:
    return (
        REGISTRY.get_sample_value("fleetpulse_replica_http_refused_total", {"status": status})
        or 0.0
    )


async def test_garbage_gets_400_a_huge_head_431_counted_and_the_connection_closes() -> None:
    before = refused("400"), refused("431")
    conn, t = connect(unary)
    conn.data_received(b"\x00\x01 not http\r\n\r\n")
    assert t.closed and t.sends[0].startswith(b"HTTP/1.1 400 ")
    conn, t = connect(unary)
    conn.data_received(b"GET / HTTP/1.1\r\nX: " + b"a" * (MAX_HEAD_BYTES + 1) + b"\r\n\r\n")
    assert t.closed and t.sends[0].startswith(b"HTTP/1.1 431 ")
    assert (refused("400"), refused("431")) == (before[0] + 1, before[1] + 1)
    # garbage in the middle of a response being written: no answer interleaved, just closed
    gate = asyncio.Event()
    slow = gated(gate)

    conn, t = connect(slow)
    conn.data_received(GET)
    await turns()
    conn.data_received(b"\x00garbage\r\n\r\n")
    assert t.closed and t.sends == []


async def test_an_app_error_before_the_response_is_a_500_after_it_a_cut_connection() -> None:
    async def fails_early(scope: Any, receive: Any, send: Any) -> None:
        raise ValueError("boom")

    async def fails_late(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        raise ValueError("boom")

    async def injects(scope: Any, receive: Any, send: Any) -> None:
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"x", b"a\r\nb: c")]}
        )

    for app in (fails_early, injects):
        conn, t = connect(app)
        conn.data_received(GET)
        await until(lambda: t.closed)  # noqa: B023
        assert t.sends[0].startswith(b"HTTP/1.1 500 ") and b"b: c" not in t.data
    conn, t = connect(fails_late)
    conn.data_received(GET)
    await until(lambda: t.closed)
    assert not t.data.endswith(b"0\r\n\r\n")  # cut: the client never sees a complete response


async def test_a_disconnect_ends_a_waiting_receive_and_later_sends_are_dropped() -> None:
    messages: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        messages.append((await receive())["type"])  # the body
        messages.append((await receive())["type"])  # waits until the client leaves
        await send({"type": "http.response.start", "status": 200, "headers": []})

    conn, t = connect(app)
    conn.data_received(GET)
    await until(lambda: messages)
    await turns()
    assert messages == ["http.request"]
    conn.connection_lost(None)
    await until(lambda: len(messages) == 2)
    await turns()
    assert messages == ["http.request", "http.disconnect"] and t.sends == []


async def test_a_full_transport_makes_send_wait_until_it_drains() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for part in (b"a", b"b"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    conn, t = connect(app)
    conn.pause_writing()
    conn.data_received(GET)
    await turns(20)
    assert t.sends == []
    conn.resume_writing()
    await until(lambda: t.data.endswith(b"0\r\n\r\n"))


async def test_idle_connections_are_swept_after_the_keep_alive_timeout_busy_ones_never() -> None:
    gate = asyncio.Event()
    app = gated(gate)

    conn, t = connect(app, timeout_keep_alive=5)
    now = conn.loop.time()
    conn.sweep_idle(now + 4)
    assert not t.closed
    conn.data_received(GET)
    conn.sweep_idle(now + 60)
    assert not t.closed  # a request is in flight
    gate.set()
    await until(lambda: t.sends)
    conn.sweep_idle(conn.loop.time() + 4)
    assert not t.closed
    conn.sweep_idle(conn.loop.time() + 6)
    assert t.closed


async def test_shutdown_closes_an_idle_connection_now_a_busy_one_after_its_response() -> None:
    conn, t = connect(unary)
    conn.shutdown()
    assert t.closed
    gate = asyncio.Event()
    app = gated(gate)

    conn, t = connect(app)
    conn.data_received(GET)
    await turns()
    conn.shutdown()
    assert not t.closed
    gate.set()
    await until(lambda: t.closed)
    head, body = responses(t.data)[0]
    assert body == b"echo:" and b"connection: close" in head


# -- the same as uvicorn's own protocol ----------------------------------------------------------

REQUESTS = [
    b"GET /a%20b/c?x=1&y=%2F HTTP/1.1\r\nHost: h\r\nX-Pad: v  \r\nAccept: */*\r\n\r\n",
    b"POST /p HTTP/1.1\r\nHost: h\r\nContent-Type: text/plain\r\nContent-Length: 11\r\n\r\nhello world",
    b"PUT /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nwiki\r\n5\r\npedia\r\n0\r\n\r\n",
    b"DELETE /d HTTP/1.0\r\nHost: h\r\n\r\n",
    b"GET /%E2%82%AC HTTP/1.1\r\nHost: h\r\nCookie: a=b\r\nCookie: c=d\r\n\r\n",
]


def recorder(seen: list[Any]) -> App:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        body = await read_body(receive)
        seen.append(({k: v for k, v in scope.items() if k != "state"}, scope["state"], body))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain"), (b"content-length", b"2")]})  # fmt: skip
        await send({"type": "http.response.body", "body": b"ok"})

    return app


async def served(
    protocol: type, request: bytes, cuts: list[int], **config: Any
) -> tuple[list[Any], bytes]:
    seen: list[Any] = []
    conn, t = connect(recorder(seen), protocol, **config)
    start = 0
    for cut in [*sorted(set(cuts)), len(request)]:
        if cut > start:
            conn.data_received(request[start:cut])
            start = cut
            await turns(3)
    await until(lambda: seen and t.sends)
    await turns()
    return seen, t.data


def without_date(data: bytes) -> bytes:
    return b"\r\n".join(
        line for line in data.split(b"\r\n") if not line.lower().startswith(b"date:")
    )


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(REQUESTS), st.lists(st.integers(min_value=1, max_value=120), max_size=4))
async def test_scope_body_and_response_equal_uvicorns_for_any_split(
    request: bytes, cuts: list[int]
) -> None:
    ours, our_bytes = await served(HttpConnection, request, cuts)
    theirs, their_bytes = await served(HttpToolsProtocol, request, cuts)
    assert ours == theirs
    assert without_date(our_bytes) == without_date(their_bytes)


@pytest.mark.parametrize("request_bytes", REQUESTS)
async def test_each_request_is_served_once(request_bytes: bytes) -> None:
    seen, data = await served(HttpConnection, request_bytes, [])
    assert len(seen) == 1 and data.endswith(b"ok")


# -- in the replica's server ---------------------------------------------------------------------


async def test_the_replica_server_answers_http_upgrades_websockets_and_sweeps_idle() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (m := await receive())["type"] != "lifespan.shutdown":
                await send({"type": m["type"] + ".complete"})
            await send({"type": "lifespan.shutdown.complete"})
        elif scope["type"] == "websocket":
            await receive()
            await send({"type": "websocket.accept"})
            msg = await receive()
            await send({"type": "websocket.send", "text": "echo:" + msg["text"]})
            await send({"type": "websocket.close"})
        else:
            await unary(scope, receive, send)

    server = ReplicaHttpServer(app)
    address = await server.start()
    try:
        async with httpx.AsyncClient() as client:
            for _ in range(3):
                resp = await client.post(f"http://{address}/", content=b"hi")
                assert resp.status_code == 200 and resp.content == b"echo:hi"
        async with websockets.connect(f"ws://{address}/ws") as ws:
            await ws.send("hi")
            assert await ws.recv() == "echo:hi"
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(GET)
        assert (await reader.readuntil(b"echo:")).startswith(b"HTTP/1.1 200 OK")
        for conn in server._server.server_state.connections:
            conn.keep_alive_s = 0.0  # the server's next tick closes it
        assert await asyncio.wait_for(reader.read(), timeout=30) == b""
        writer.close()
    finally:
        await server.drain()


FORWARDED = [
    b"GET / HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: 203.0.113.7\r\nX-Forwarded-Proto: https\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: 198.51.100.1, 10.0.0.9\r\n"
    b"X-Forwarded-For: 203.0.113.8\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Proto: gopher\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: [2001:db8::1]:4711\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: \r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: h\r\n\r\n",
]


# all of them on one connection, the first again last: the connection keeps the answer for the
# last values it saw, and must not give it for others
ONE_CONNECTION = b"".join([*FORWARDED, FORWARDED[0]])


@pytest.mark.parametrize("request_bytes", [*FORWARDED, ONE_CONNECTION])
@pytest.mark.parametrize("allowed", ["10.0.0.9", "127.0.0.1", "10.0.0.0/8", "*"])
async def test_forwarded_headers_give_the_client_and_scheme_uvicorns_middleware_gives(
    request_bytes: bytes, allowed: str
) -> None:
    """The peer is 10.0.0.9 (Recording): trusted or not by `allowed`, as the middleware decides."""
    config = {"proxy_headers": True, "forwarded_allow_ips": allowed}
    ours, _ = await served(HttpConnection, request_bytes, [], **config)
    theirs, _ = await served(HttpToolsProtocol, request_bytes, [], **config)
    assert ours == theirs
    if allowed != "127.0.0.1" and b"203.0.113.7" in request_bytes:
        assert ours[0][0]["client"][0] == "203.0.113.7" and ours[0][0]["scheme"] == "https"

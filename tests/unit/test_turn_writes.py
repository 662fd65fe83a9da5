"""A response's head and body in one send on the replica's HTTP connections
(services/replica/turn_writes.py): uvicorn's own protocol, driven with request bytes, writes a
unary response's head and body in one send (a kill cannot split them); a streamed response's
head leaves with the chunk written in its turn, a later chunk at the end of its turn; close
sends what is kept first, abort drops it, a closing transport gets nothing more, a reused
buffer is not resent changed; a WebSocket upgrade still works through the wrapper."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import uvicorn
import websockets
from uvicorn.server import ServerState

from services.replica.http_server import ReplicaHttpServer
from services.replica.turn_writes import TurnWriteProtocol, TurnWriteTransport


class Recording(asyncio.Transport):
    """A transport that records each send."""

    def __init__(self) -> None:
        super().__init__()
        self.sends: list[bytes] = []
        self.closed = False
        self.aborted = False

    def write(self, data: Any) -> None:
        self.sends.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


async def unary(scope: Any, receive: Any, send: Any) -> None:
    body = b"x" * 57
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"57")]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


def protocol_for(app: Any) -> TurnWriteProtocol:
    config = uvicorn.Config(app, http=TurnWriteProtocol, lifespan="off", log_config=None)
    config.load()
    return TurnWriteProtocol(config=config, server_state=ServerState(), app_state={})


async def until(check: Any) -> None:
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError("not within 1,000 loop turns")


async def test_a_unary_response_leaves_in_one_send() -> None:
    transport = Recording()
    proto = protocol_for(unary)
    proto.connection_made(transport)
    proto.data_received(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
    await until(lambda: transport.sends)
    for _ in range(10):  # nothing more follows
        await asyncio.sleep(0)
    assert len(transport.sends) == 1
    head, _, body = transport.sends[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and body == b"x" * 57
    # the next request on the keep-alive connection: one send again
    proto.data_received(b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n")
    await until(lambda: len(transport.sends) == 2)
    assert transport.sends[1].endswith(b"x" * 57)


async def test_a_streamed_response_sends_each_turns_writes_at_its_end() -> None:
    step = asyncio.Event()

    async def streamed(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        await step.wait()
        await send({"type": "http.response.body", "body": b"second", "more_body": False})

    transport = Recording()
    proto = protocol_for(streamed)
    proto.connection_made(transport)
    proto.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await until(lambda: transport.sends)
    assert len(transport.sends) == 1  # the head with the chunk written in the same turn
    assert transport.sends[0].endswith(b"5\r\nfirst\r\n")
    step.set()
    await until(lambda: len(transport.sends) == 2)
    assert transport.sends[1] == b"6\r\nsecond\r\n0\r\n\r\n"


async def test_close_sends_first_abort_drops_a_closing_transport_gets_nothing() -> None:
    loop = asyncio.get_running_loop()
    inner = Recording()
    t = TurnWriteTransport(inner, loop)
    t.write(b"a")
    t.write(b"")
    assert inner.sends == [] and t.get_write_buffer_size() == 1  # kept for the next write
    t.writelines([b"b", b"c"])  # b leaves with a at once; c is kept
    assert inner.sends == [b"ab"] and t.get_write_buffer_size() == 1
    t.close()
    assert inner.sends == [b"ab", b"c"] and inner.closed
    await asyncio.sleep(0)  # the turn's scheduled flush finds nothing left
    assert inner.sends == [b"ab", b"c"]

    inner = Recording()
    t = TurnWriteTransport(inner, loop)
    buf = bytearray(b"mine")
    t.write(buf)
    buf[:] = b"gone"  # the writer reuses its buffer: what was written leaves
    t.write(b"!")
    assert inner.sends == [b"mine!"]

    inner = Recording()
    t = TurnWriteTransport(inner, loop)
    t.write(b"lost")
    t.abort()
    await asyncio.sleep(0)
    assert inner.sends == [] and inner.aborted

    inner = Recording()
    t = TurnWriteTransport(inner, loop)
    t.write(b"late")
    inner.closed = True  # the peer left before the turn ended
    await asyncio.sleep(0)
    assert inner.sends == []
    assert t.get_extra_info("peername") == ("127.0.0.1", 5000)  # the rest is the transport's


async def test_real_server_answers_http_and_upgrades_websockets_through_the_wrapper() -> None:
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
                resp = await client.get(f"http://{address}/")
                assert resp.status_code == 200 and resp.content == b"x" * 57
        async with websockets.connect(f"ws://{address}/ws") as ws:
            await ws.send("hi")
            assert await ws.recv() == "echo:hi"
    finally:
        await server.drain()

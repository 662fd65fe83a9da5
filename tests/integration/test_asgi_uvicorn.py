"""The replica's ASGI app behind a real uvicorn (httptools, the installed WebSocket
implementation) on a free loopback port, as a replica's HTTP server runs it: SSE chunks reach the
client as they are produced, a client that disconnects mid-stream cancels the handler, WebSockets
echo both ways with close codes, and a peer that never reads is closed (1008 when the close
frame fits in the server's buffer) instead of holding the handler and an ever-growing buffer."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import uvicorn
from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from fleetpulse import serve
from services.replica.asgi import (
    WS_STUCK_CLOSE_CODE,
    ReplicaAsgi,
    WebSocketSendTimeout,
    build_asgi_app,
)
from services.replica.http11 import HttpConnection
from services.replica.usercode import UserDeployment
from tests.waiting import eventually

WS_IMPL = (
    "websockets-sansio" if "websockets-sansio" in uvicorn.config.WS_PROTOCOLS else "websockets"
)

api = FastAPI()


@serve.ingress(api)
class Live:
    def __init__(self) -> None:
        self.next_token = asyncio.Event()
        self.stream_stopped = asyncio.Event()
        self.ws_closed_by_peer: list[int] = []
        self.ws_timeouts = 0
        self.ws_sent = 0
        self.background: list[str] = []
        self.background_go = asyncio.Event()

    async def tokens(self) -> AsyncIterator[str]:
        try:
            yield "data: one\n\n"
            await self.next_token.wait()  # the test releases it once "one" has arrived
            yield "data: two\n\n"
        finally:
            self.stream_stopped.set()

    @api.get("/sse")
    def sse(self) -> StreamingResponse:
        return StreamingResponse(self.tokens(), media_type="text/event-stream")

    @api.get("/after")
    def after(self) -> Response:
        return Response(b"done", background=BackgroundTask(self.after_response))

    async def after_response(self) -> None:
        self.background.append("started")
        await self.background_go.wait()  # the test lets it finish once the client has left
        self.background.append("finished")

    @api.websocket("/echo")
    async def echo(self, ws: WebSocket) -> None:
        await ws.accept()
        try:
            while True:
                text = await ws.receive_text()
                if text == "bye":
                    await ws.close(code=4001, reason="bye to you")
                    return
                await ws.send_text(text.upper())
        except WebSocketDisconnect as exc:
            self.ws_closed_by_peer.append(exc.code)

    @api.websocket("/flood")
    async def flood(self, ws: WebSocket) -> None:
        await ws.accept()
        try:
            while True:
                await ws.send_bytes(b"z" * 65536)
                self.ws_sent += 1
        except WebSocketSendTimeout:
            self.ws_timeouts += 1


SERVERS: dict[str, uvicorn.Server] = {}
"""The server behind each address `served` gives (a test waits for it to see a client leave)."""


@pytest.fixture(params=["httptools", "replica"])
async def served(request: pytest.FixtureRequest) -> AsyncIterator[tuple[ReplicaAsgi, str]]:
    """The app on uvicorn's own httptools protocol, and on the replica's (http11.py), which
    hears a disconnect itself: with the watch put off for an hour, only it can cancel."""
    user = await UserDeployment.create("x:y", (), {}, target=Live)
    app = build_asgi_app(user, route_prefix="/live", ws_send_timeout_s=0.5)
    if request.param == "replica":
        app.watch_after_s = 3600.0
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # log_config=None everywhere here, as in the replica: uvicorn's default config is a
    # logging.config.dictConfig, which closes every handler, pytest's session-long ones too
    http: Any = HttpConnection if request.param == "replica" else "httptools"
    config = uvicorn.Config(
        app, http=http, ws=WS_IMPL, lifespan="on", log_level="warning", log_config=None
    )
    server = uvicorn.Server(config)
    SERVERS[f"127.0.0.1:{port}"] = server
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await eventually(lambda: server.started, what="uvicorn started")
    try:
        yield app, f"127.0.0.1:{port}"
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(task, 10)
        sock.close()


async def test_sse_tokens_arrive_as_they_are_produced(served: tuple[ReplicaAsgi, str]) -> None:
    app, addr = served
    live: Live = app.instance
    async with aiohttp.ClientSession() as http, http.get(f"http://{addr}/live/sse") as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        first = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 5)
        assert first == b"data: one\n\n"  # before the second token even exists
        live.next_token.set()
        assert await asyncio.wait_for(resp.content.read(), 5) == b"data: two\n\n"


async def test_a_client_leaving_mid_stream_cancels_the_handler(
    served: tuple[ReplicaAsgi, str],
) -> None:
    app, addr = served
    live: Live = app.instance
    async with aiohttp.ClientSession() as http:
        resp = await http.get(f"http://{addr}/live/sse")
        await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 5)
        resp.close()  # gone, with the second token still to come
    await asyncio.wait_for(live.stream_stopped.wait(), 5)
    await eventually(lambda: app.disconnects == 1, what="the disconnect counted")


async def test_a_client_leaving_after_the_response_does_not_cut_its_background_task(
    served: tuple[ReplicaAsgi, str],
) -> None:
    app, addr = served
    live: Live = app.instance
    async with aiohttp.ClientSession() as http, http.get(f"http://{addr}/live/after") as resp:
        assert await resp.read() == b"done"
    await http.close()  # the connection is gone while the background task still waits
    await eventually(lambda: live.background == ["started"], what="the background task")
    state = SERVERS[addr].server_state
    await eventually(lambda: not state.connections, what="the server saw the client leave")
    live.background_go.set()
    await eventually(lambda: live.background == ["started", "finished"], what="it finished")
    assert app.disconnects == 0


async def test_websocket_echo_both_ways_with_close_codes(served: tuple[ReplicaAsgi, str]) -> None:
    app, addr = served
    live: Live = app.instance
    async with connect(f"ws://{addr}/live/echo") as ws:
        await ws.send("hello")
        assert await ws.recv() == "HELLO"
        await ws.send("bye")
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4001
    async with connect(f"ws://{addr}/live/echo") as ws:
        await ws.send("x")
        await ws.recv()
        await ws.close(code=4002)
    await eventually(lambda: live.ws_closed_by_peer == [4002], what="the peer's close code")


async def stuck_peer(addr: str, path: str) -> socket.socket:
    """A WebSocket client that completes the handshake and then never reads (a small receive
    buffer, so the server's buffers fill soon)."""
    loop = asyncio.get_running_loop()
    host, port = addr.split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await loop.sock_connect(sock, (host, int(port)))
    key = base64.b64encode(os.urandom(16)).decode()
    upgrade = (f"GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\n"
               f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
               "Sec-WebSocket-Version: 13\r\n\r\n")  # fmt: skip
    await loop.sock_sendall(sock, upgrade.encode())
    head = b""
    while b"\r\n\r\n" not in head:  # one byte at a time: read nothing past the handshake
        head += await loop.sock_recv(sock, 1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


async def read_frames_until_close(sock: socket.socket) -> int | None:
    """Read what the server sent (the buffered data, then the close frame); its close code."""
    loop = asyncio.get_running_loop()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    buf = b""
    while True:
        data = await asyncio.wait_for(loop.sock_recv(sock, 1 << 16), 10)
        if not data:
            return None  # closed without a close frame
        buf += data
        while len(buf) >= 2:
            opcode, length, at = buf[0] & 0x0F, buf[1] & 0x7F, 2
            if length == 126:
                length, at = int.from_bytes(buf[2:4], "big"), 4
            elif length == 127:
                length, at = int.from_bytes(buf[2:10], "big"), 10
            if len(buf) < at + length:
                break
            payload, buf = buf[at : at + length], buf[at + length :]
            if opcode == 0x8:
                return int.from_bytes(payload[:2], "big")


async def test_a_peer_that_never_reads_is_closed_and_bounded(
    served: tuple[ReplicaAsgi, str],
) -> None:
    app, addr = served
    live: Live = app.instance
    sock = await stuck_peer(addr, "/live/flood")
    try:
        # the peer reads nothing: buffers fill, the server's send blocks, the timeout closes
        await eventually(lambda: live.ws_timeouts == 1, 30, "the stuck send timed out")
        assert live.ws_sent < 200  # bounded by the buffers (64 KiB messages), not growing
        # the close frame (1008) when the server's buffer had room for it, else the end of
        # the connection once the peer read what was buffered
        assert await read_frames_until_close(sock) in (WS_STUCK_CLOSE_CODE, None)
    finally:
        sock.close()


async def test_a_call_deployment_refuses_websockets_and_serves_http() -> None:
    class Plain:
        async def __call__(self, request: Request) -> dict[str, Any]:
            return {"client": request.client.host if request.client else None}

    user = await UserDeployment.create("x:y", (), {}, target=Plain)
    app = build_asgi_app(user)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, ws=WS_IMPL, log_level="warning", log_config=None))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await eventually(lambda: server.started, what="uvicorn started")
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/") as resp:
                assert await resp.json() == {"client": "127.0.0.1"}
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(f"http://127.0.0.1:{port}/")
            assert refused.value.status == 403
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


class Counting:
    async def __call__(self, request: Request) -> dict[str, int]:
        size = parts = 0
        async for part in request.stream():
            size += len(part)
            parts += 1
        return {"bytes": size, "parts": parts}


async def test_a_large_request_body_streams_to_the_handler() -> None:
    """24 MiB, far over the NATS carrier's limit: no refusal, read part by part."""
    user = await UserDeployment.create("x:y", (), {}, target=Counting)
    app = build_asgi_app(user)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(app, http="httptools", log_level="warning", log_config=None)
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await eventually(lambda: server.started, what="uvicorn started")

    async def body() -> AsyncIterator[bytes]:
        for _ in range(24):
            yield b"b" * (1 << 20)

    try:
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"http://127.0.0.1:{sock.getsockname()[1]}/", data=body()) as resp,
        ):
            doc = await resp.json()
        assert doc["bytes"] == 24 << 20 and doc["parts"] > 24
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()

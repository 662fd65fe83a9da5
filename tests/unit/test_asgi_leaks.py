"""Bad input through the replica's ASGI app leaks nothing: 10,000 requests of five bad kinds (a
handler that raises, a client that disconnects mid-stream, one that leaves a slow handler, a
malformed NATS-carried request, a WebSocket peer that never reads), then the app still serves, no task is left behind and memory
(live objects, RSS) stops growing after the warm-up."""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI, WebSocket
from starlette.requests import Request
from starlette.responses import StreamingResponse

from fleetpulse import serve
from services.replica.asgi import ReplicaAsgi, WebSocketSendTimeout, build_asgi_app, serve_carried
from services.replica.asgi_carrier import ScopeError
from services.replica.usercode import UserDeployment
from shared.wire.messages import HttpRequest
from tests.waiting import eventually

api = FastAPI()


@serve.ingress(api)
class Bad:
    def __init__(self) -> None:
        self.stream_cancelled = 0
        self.slow_stopped = 0
        self.ws_timeouts = 0

    @api.get("/raise")
    async def raises(self) -> None:
        raise ValueError("bad")

    @api.get("/stream")
    def stream(self) -> StreamingResponse:
        return StreamingResponse(self.forever())

    async def forever(self) -> AsyncIterator[bytes]:
        try:
            while True:
                yield b"x" * 1024
                await asyncio.sleep(0)
        finally:  # once per stream, however it was stopped (cancelled, closed)
            self.stream_cancelled += 1

    @api.get("/slow")
    async def slow(self) -> str:
        try:
            await asyncio.sleep(60)
        finally:
            self.slow_stopped += 1
        return "late"

    @api.get("/ok")
    def ok(self, request: Request) -> str:
        return "ok"

    @api.websocket("/ws")
    async def flood(self, ws: WebSocket) -> None:
        await ws.accept()
        try:
            while True:
                await ws.send_bytes(b"y" * 65536)
        except WebSocketSendTimeout:
            self.ws_timeouts += 1


async def raising(app: ReplicaAsgi) -> None:
    sent: list[Any] = []
    scope = {"type": "http", "method": "GET", "path": "/raise", "headers": [], "query_string": b""}
    await app(scope, _once_then_wait(asyncio.Event()), _append(sent))
    assert sent[0]["status"] == 500


async def disconnecting(app: ReplicaAsgi) -> None:
    gone = asyncio.Event()
    chunks = 0

    async def send(message: Any) -> None:
        nonlocal chunks
        if message["type"] == "http.response.body":
            chunks += 1
            if chunks == 3:
                gone.set()  # the client goes after reading a little
            await asyncio.sleep(0)

    scope = {"type": "http", "method": "GET", "path": "/stream", "headers": [], "query_string": b""}
    await app(scope, _once_then_wait(gone), send)


async def leaving_a_slow_handler(app: ReplicaAsgi) -> None:
    gone = asyncio.Event()
    asyncio.get_running_loop().call_later(0.02, gone.set)  # the client leaves after 20 ms
    scope = {"type": "http", "method": "GET", "path": "/slow", "headers": [], "query_string": b""}
    await app(scope, _once_then_wait(gone), _append([]))


async def malformed(app: ReplicaAsgi) -> None:
    async def emit(data: bytes) -> None:
        raise AssertionError("nothing may go out for a malformed request")

    try:
        await serve_carried(
            app, HttpRequest("GET", "no-slash", "", (), b""), emit=emit, collect=False
        )
    except ScopeError:
        return
    raise AssertionError("a malformed request was served")


async def stuck_websocket(app: ReplicaAsgi) -> None:
    never = asyncio.Event()
    messages = iter([{"type": "websocket.connect"}])

    async def receive() -> Any:
        try:
            return next(messages)
        except StopIteration:
            await never.wait()
            raise

    async def send(message: Any) -> None:
        if message["type"] == "websocket.send":
            await never.wait()  # the peer's buffer is full: it never takes the data

    await app(
        {"type": "websocket", "path": "/ws", "headers": [], "query_string": b""}, receive, send
    )


class Endless:
    def __init__(self) -> None:
        self.stopped = 0

    async def __call__(self) -> AsyncIterator[bytes]:
        try:
            while True:
                yield b"x"
                await asyncio.sleep(0.001)
        finally:
            self.stopped += 1


async def test_a_client_leaving_a_generator_stream_stops_the_generator() -> None:
    user = await UserDeployment.create("x:y", (), {}, target=Endless)
    app = build_asgi_app(user, watch_after_s=0.02)
    await asyncio.wait_for(disconnecting(app), 10)
    # cancelled between two items (not inside one), the generator is closed by the loop's
    # async-generator finalizer a turn later, not before the request returns
    await eventually(lambda: user.instance.stopped == 1, 10, "the generator stopped")
    assert user.instance.stopped == 1 and app.disconnects == 1


def _once_then_wait(gone: asyncio.Event) -> Any:
    delivered = False

    async def receive() -> Any:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    return receive


def _append(out: list[Any]) -> Any:
    async def send(message: Any) -> None:
        out.append(message)

    return send


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


KINDS = (raising, disconnecting, leaving_a_slow_handler, malformed, stuck_websocket)


async def run_batch(app: ReplicaAsgi, n: int) -> None:
    await asyncio.gather(*(KINDS[i % len(KINDS)](app) for i in range(n)))


async def test_ten_thousand_bad_requests_leave_no_task_and_bounded_memory() -> None:
    user = await UserDeployment.create("x:y", (), {}, target=Bad)
    app = build_asgi_app(user, ws_send_timeout_s=0.002, watch_after_s=0.005)
    instance: Bad = app.instance
    tasks_before = len(asyncio.all_tasks())
    for _ in range(5):  # warm-up: caches, the error log's first lines, the thread pool
        await run_batch(app, 200)
    gc.collect()
    objects, rss = len(gc.get_objects()), _rss()
    for _ in range(45):
        await run_batch(app, 200)
    gc.collect()
    grown_objects, grown_rss = len(gc.get_objects()) - objects, _rss() - rss
    # the disconnect sweep ends within a quarter of watch_after_s of the last request
    await eventually(lambda: len(asyncio.all_tasks()) == tasks_before, 5, "no task left")
    # a leak of one object per request would be 9,000; of 1 KiB per request, 9 MB
    assert grown_objects < 1000, f"{grown_objects} more live objects after 9,000 bad requests"
    assert grown_rss < 8 << 20, f"RSS grew {grown_rss} bytes over 9,000 bad requests"

    # a stream's generator that Starlette stopped iterating is closed by the loop's asyncgen
    # finaliser when it is collected: every one of them, though not always by this line
    def all_streams_closed() -> bool:
        gc.collect()
        return instance.stream_cancelled == 2000

    await eventually(all_streams_closed, 5, "every stream's generator closed")
    assert instance.slow_stopped == instance.ws_timeouts == 2000
    assert app.disconnects == 4000 and app.errors.count == 2000
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        assert (await c.get("/ok")).json() == "ok"

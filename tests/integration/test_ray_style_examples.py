"""The Ray-style examples (examples/ray_style) served by the replica's ASGI app behind uvicorn on a
free port, as an ingress replica serves them, each answer checked."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import uvicorn
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from examples.ray_style import fastapi_items, sse_tokens, starlette_counter, websocket_echo
from services.replica.asgi import build_asgi_app
from services.replica.usercode import UserDeployment, load_target
from tests.integration.test_asgi_uvicorn import WS_IMPL
from tests.waiting import eventually


@asynccontextmanager
async def serving(import_path: str, prefix: str) -> AsyncIterator[str]:
    user = await UserDeployment.create(import_path, (), {}, target=load_target(import_path))
    app = build_asgi_app(user, route_prefix=prefix)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, ws=WS_IMPL, lifespan="on", log_level="warning"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await eventually(lambda: server.started, what="uvicorn started")
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(task, 10)
        sock.close()


def path_of(module: object, name: str) -> str:
    return f"{module.__name__}:{name}"


async def test_fastapi_items_path_params_pydantic_body_and_docs() -> None:
    async with serving(path_of(fastapi_items, "Store"), "/items") as addr:
        base = f"http://{addr}/items"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/apple") as r:
                assert r.status == 200 and r.headers["x-served-by"] == "fleetpulse"
                assert await r.json() == {"name": "apple", "price": 1.5, "store": "corner",
                                          "state": "lifespan"}  # fmt: skip
            async with http.post(f"{base}/", json={"name": "pear", "price": 2.0}) as r:
                assert await r.json() == {"added": "pear", "count": 2}
            async with http.post(f"{base}/", json={"name": "pear"}) as r:
                assert r.status == 422
            async with http.get(f"{base}/plum") as r:
                assert (r.status, await r.json()) == (404, {"detail": "no item 'plum'"})
            async with http.get(f"{base}/docs") as r:
                assert r.status == 200 and "/items/openapi.json" in await r.text()
            async with http.get(f"{base}/openapi.json") as r:
                assert set((await r.json())["paths"]) == {"/{name}", "/"}


async def test_starlette_counter_awaits_the_json_body_and_hello_takes_none() -> None:
    counter = serving(path_of(starlette_counter, "Counter"), "/counter")
    async with counter as addr, aiohttp.ClientSession() as http:
        for want in (3, 6):
            async with http.post(f"http://{addr}/counter?who=ann", json={"add": 3}) as r:
                assert await r.json() == {"count": want, "path": "/counter", "who": "ann"}
    hello = serving(path_of(starlette_counter, "Hello"), "/hello")
    async with (
        hello as addr,
        aiohttp.ClientSession() as http,
        http.get(f"http://{addr}/hello") as r,
    ):
        assert await r.text() == "hello"


async def test_sse_tokens_stream_one_event_at_a_time() -> None:
    async with serving(path_of(sse_tokens, "TokenStreamer"), "/tokens") as addr:
        url = f"http://{addr}/tokens?prompt=the+quick+fox&delay=0.3"
        events: list[tuple[float, bytes]] = []
        loop = asyncio.get_running_loop()
        async with aiohttp.ClientSession() as http, http.get(url) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            async for line in r.content:
                if line.strip():
                    events.append((loop.time(), line.strip()))
        assert [e for _, e in events] == [b"data: the", b"data: quick", b"data: fox",
                                          b"data: [DONE]"]  # fmt: skip
        # produced 0.3 s apart: the first came about 0.6 s before the last, not with it
        assert events[-1][0] - events[0][0] > 0.3, events


async def test_websocket_echo_through_the_fastapi_ingress() -> None:
    served = serving(path_of(websocket_echo, "EchoServer"), "/ws")
    async with served as addr, connect(f"ws://{addr}/ws/") as ws:
        for text in ("hello", "world"):
            await ws.send(text)
            assert await ws.recv() == f"echo: {text}"
        await ws.send("close-me")
        try:
            await ws.recv()
            raise AssertionError("the server did not close")
        except ConnectionClosed as closed:
            assert closed.rcvd is not None and closed.rcvd.code == 4000

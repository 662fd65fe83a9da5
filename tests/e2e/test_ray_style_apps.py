"""The Ray-style example apps (examples/ray_style) through the whole stack: `fleetpulse up
--config examples/ray_style/serve_config.yaml` with the HAProxy front door, every answer checked
through the public HTTP port: a FastAPI ingress (path params, a pydantic body, 422, a 404 from
HTTPException, OpenAPI under the prefix), a Starlette handler awaiting its JSON body, a handler
without a parameter, SSE tokens arriving as produced, and a WebSocket echo."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.waiting import eventually

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "ray_style" / "serve_config.yaml"
APPS = ("items", "counter", "hello", "tokens", "ws")
UP_READY_S = 120.0


class Up:
    def __init__(self, tmp: Path) -> None:
        self.out = tmp / "up.out"
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "services.cli", "up", "--config", str(CONFIG),
                 "--no-live", "--http-port", "0", "--front", "haproxy"],
                cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.http = self._line(r"HTTP:\s+(http://\S+)")

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def _line(self, pattern: str) -> str:
        deadline = time.monotonic() + UP_READY_S
        while time.monotonic() < deadline:
            m = re.search(pattern, self.text())
            if m:
                return m.group(1).rstrip("/")
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"no {pattern!r} from fleetpulse up:\n{self.text()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    stack = Up(tmp_path_factory.mktemp("ray-style"))
    try:
        yield stack
    finally:
        stack.stop()


def _front_servers(metrics: str, app: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(f'fleetpulse_proxy_front_servers{{app="{app}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _served_directly(http: aiohttp.ClientSession, apps: tuple[str, ...]) -> None:
    """Until every app is registered and HAProxy has a replica of it serving HTTP."""

    async def ready() -> bool:
        async with http.get("/-/routes") as r:
            routes = (await r.json())["apps"]
        if not all(routes.get(a, {}).get("registered") for a in apps):
            return False
        async with http.get("/metrics") as r:
            metrics = await r.text()
        return all(_front_servers(metrics, a) >= 1 for a in apps)

    await eventually(ready, within_s=120, what=f"{apps} served by their replicas")


def run(up: Up, body: object) -> None:
    async def main() -> None:
        async with aiohttp.ClientSession(base_url=up.http) as http:
            await _served_directly(http, APPS)
            await body(http)  # type: ignore[operator]

    asyncio.run(main())


def test_fastapi_ingress_items(up: Up) -> None:
    async def body(http: aiohttp.ClientSession) -> None:
        async with http.get("/items/apple") as r:
            assert r.status == 200, await r.text()
            assert r.headers["x-served-by"] == "fleetpulse"  # the app's middleware
            assert await r.json() == {"name": "apple", "price": 1.5, "store": "corner",
                                      "state": "lifespan"}  # fmt: skip
        async with http.post("/items/", json={"name": "pear", "price": 2.0}) as r:
            assert (await r.json())["added"] == "pear"
        async with http.get("/items/pear") as r:
            assert (await r.json())["price"] == 2.0
        async with http.post("/items/", json={"name": "fig"}) as r:
            assert r.status == 422 and (await r.json())["detail"][0]["loc"] == ["body", "price"]
        async with http.get("/items/plum") as r:
            assert (r.status, await r.json()) == (404, {"detail": "no item 'plum'"})
        async with http.get("/items/docs") as r:
            assert r.status == 200 and "/items/openapi.json" in await r.text()
        async with http.get("/items/openapi.json") as r:
            assert set((await r.json())["paths"]) == {"/{name}", "/"}

    run(up, body)


def test_starlette_handlers(up: Up) -> None:
    async def body(http: aiohttp.ClientSession) -> None:
        async with http.post("/counter?who=ann", json={"add": 5}) as r:
            doc = await r.json()
        assert doc["path"] == "/counter" and doc["who"] == "ann" and doc["count"] >= 5
        async with http.get("/hello") as r:
            assert (r.status, await r.text()) == (200, "hello")

    run(up, body)


def test_sse_tokens_arrive_as_produced(up: Up) -> None:
    async def body(http: aiohttp.ClientSession) -> None:
        loop = asyncio.get_running_loop()
        seen: list[tuple[float, bytes]] = []
        async with http.get("/tokens?prompt=one+two+three&delay=0.5") as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            async for line in r.content:
                if line.strip():
                    seen.append((loop.time(), line.strip()))
        assert [t for _, t in seen] == [b"data: one", b"data: two", b"data: three",
                                        b"data: [DONE]"]  # fmt: skip
        # produced 0.5 s apart: streamed through HAProxy the first came about 1 s before the
        # last (gathered, all at once)
        assert seen[-1][0] - seen[0][0] > 0.5, seen

    run(up, body)


def test_websocket_echo(up: Up) -> None:
    async def body(http: aiohttp.ClientSession) -> None:
        async def upgraded() -> aiohttp.ClientWebSocketResponse | None:
            # a WebSocket needs the direct path: the Python proxy (HAProxy's fallback while the
            # replica's server is not in its backend yet) carries no upgrade
            try:
                return await http.ws_connect("/ws/")
            except aiohttp.WSServerHandshakeError:
                return None

        async with await eventually(upgraded, within_s=30, what="a WebSocket upgrade") as ws:
            for text in ("hello", "world"):
                await ws.send_str(text)
                msg = await ws.receive(timeout=10)
                assert msg.data == f"echo: {text}"
            await ws.send_str("close-me")
            msg = await ws.receive(timeout=10)
            assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 4000

    run(up, body)

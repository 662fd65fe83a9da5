"""The replica's ASGI app (services/replica/asgi.py) driven in process through httpx's ASGI
transport: the `__call__` model (Starlette request, no-argument handlers, return values,
errors, client disconnects) and `@serve.ingress` FastAPI/Starlette apps (routes bound to the
instance, 422, HTTPException, middleware, OpenAPI under the prefix, lifespan)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, HTTPException
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

from fleetpulse import serve
from services.replica.asgi import (
    ReplicaAsgi,
    build_asgi_app,
    plain_response,
    starlette_request,
    to_response,
)
from services.replica.usercode import UserDeployment
from tests.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]


async def make(target: Any, *init: Any, route_prefix: str | None = None) -> ReplicaAsgi:
    user = await UserDeployment.create("x:y", tuple(init), {}, target=target)
    app = build_asgi_app(user, route_prefix=route_prefix)
    await app.startup()
    return app


def client(app: ReplicaAsgi) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


# -- __call__ ---------------------------------------------------------------------------------


class Reader:
    async def __call__(self, request: Request) -> dict[str, Any]:
        return {
            "json": await request.json(),
            "q": request.query_params["name"],  # a string, as Starlette's
            "many": request.query_params.getlist("name"),
            "path": request.url.path,
            "h": request.headers["x-h"],
            "method": request.method,
        }


async def test_call_gets_a_starlette_request_with_awaitable_body() -> None:
    app = await make(Reader)
    async with client(app) as c:
        r = await c.post("/p?name=a&name=b", json={"k": 1}, headers={"x-h": "v"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json() == {"json": {"k": 1}, "q": "b", "many": ["a", "b"], "path": "/p",
                        "h": "v", "method": "POST"}  # fmt: skip


class NoArgs:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        return f"called {self.calls}"


async def test_a_handler_without_a_parameter_is_called_without_one() -> None:
    app = await make(NoArgs)
    async with client(app) as c:
        assert (await c.get("/")).text == "called 1"
        assert (await c.get("/")).text == "called 2"


async def plain_function(request: Request) -> bytes:
    return b"fn:" + await request.body()


async def test_a_function_deployment_gets_the_request() -> None:
    app = await make(plain_function)
    async with client(app) as c:
        assert (await c.post("/", content=b"abc")).content == b"fn:abc"


class Returns:
    async def __call__(self, request: Request) -> Any:
        kind = request.query_params["kind"]
        if kind == "bytes":
            return b"\x00\x01"
        if kind == "str":
            return "text"
        if kind == "json":
            return [1, {"a": None}]
        if kind == "serve":
            return serve.Response("made", status=201, headers={"x-a": "b"})
        if kind == "starlette":
            r = JSONResponse({"ok": True}, status_code=202, headers={"x-s": "1"})
            r.set_cookie("session", "abc")
            return r
        if kind == "stream":
            return StreamingResponse(iter([b"a", b"b"]), media_type="text/plain")
        raise ValueError(f"bad kind {kind}")


@pytest.mark.parametrize(
    ("kind", "status", "body", "ctype"),
    [
        ("bytes", 200, b"\x00\x01", "application/octet-stream"),
        ("str", 200, b"text", "text/plain; charset=utf-8"),
        ("json", 200, b'[1, {"a": null}]', "application/json"),
        ("serve", 201, b"made", None),
        ("starlette", 202, b'{"ok":true}', "application/json"),
        ("stream", 200, b"ab", "text/plain; charset=utf-8"),
    ],
)
async def test_return_values_become_responses(
    kind: str, status: int, body: bytes, ctype: str | None
) -> None:
    app = await make(Returns)
    async with client(app) as c:
        r = await c.get(f"/?kind={kind}")
    assert (r.status_code, r.content) == (status, body)
    if ctype is not None:
        assert r.headers["content-type"] == ctype
    if kind == "serve":
        assert r.headers["x-a"] == "b"
    if kind == "starlette":
        assert r.headers["x-s"] == "1" and r.cookies["session"] == "abc"


class Generators:
    def __init__(self) -> None:
        self.mode = "async"

    async def __call__(self, request: Request) -> Any:
        n = int(request.query_params["n"])
        if request.query_params.get("sync"):
            return self.sync_items(n)
        return self.items(n)

    async def items(self, n: int) -> AsyncIterator[Any]:
        for i in range(n):
            yield {"i": i} if i % 2 else str(i)

    def sync_items(self, n: int) -> Iterator[bytes]:
        for i in range(n):
            yield bytes([65 + i])


async def test_generators_are_streamed() -> None:
    app = await make(Generators)
    async with client(app) as c:
        assert (await c.get("/?n=3")).content == b'0{"i": 1}\n2'
        assert (await c.get("/?n=3&sync=1")).content == b"ABC"


class Streams:
    async def __call__(self, request: Request) -> StreamingResponse:
        return StreamingResponse(self.parts())

    async def parts(self) -> AsyncIterator[bytes]:
        for part in (b"0", b'{"i": 1}\n', b"2"):
            yield part


@pytest.mark.parametrize("target", ["Generators", "Streams"])
def test_a_replica_that_streamed_has_not_loaded_anyios_backend(target: str) -> None:
    # Starlette's StreamingResponse under ASGI 2.3 (uvicorn's) takes a task group per stream,
    # loading anyio's asyncio backend (+1.4 MB resident): the replica's app says 2.4 instead
    code = """
import asyncio, sys
from tests.unit.test_asgi_app import TARGET, make
async def main():
    app = await make(TARGET)
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "method": "GET",
             "path": "/", "raw_path": b"/", "query_string": b"n=3", "headers": [],
             "root_path": ""}
    sent = []
    bodies = [{"type": "http.request", "body": b"", "more_body": False}]
    async def receive():  # the request, then nothing until the client leaves
        if bodies:
            return bodies.pop()
        await asyncio.Event().wait()
    async def send(m):
        sent.append(m)
    await app(scope, receive, send)
    assert b"".join(m.get("body", b"") for m in sent[1:]) == b'0{"i": 1}\\n2', sent
    print("anyio backend" if "anyio._backends._asyncio" in sys.modules else "clean")
asyncio.run(main())
"""
    code = code.replace("TARGET", target)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "clean", out.stdout + out.stderr


class Raises:
    async def __call__(self, request: Request) -> str:
        if request.query_params.get("ok"):
            return "fine"
        raise KeyError("missing")


async def test_a_raising_handler_gets_a_500_and_the_app_keeps_serving(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = await make(Raises)
    async with client(app) as c:
        for _ in range(5):
            r = await c.get("/")
            assert r.status_code == 500
            assert r.json() == {"error": "user_error", "message": "KeyError: 'missing'"}
            assert r.headers["fp-error"] == "user_error"
        assert (await c.get("/?ok=1")).text == "fine"
    assert app.errors.count == 5
    lines = [r for r in caplog.records if "raised KeyError" in r.getMessage()]
    assert len(lines) == 1  # rate-limited: one line per interval per exception type


class Slow:
    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = 0

    async def __call__(self, request: Request) -> str:
        self.started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return "late"


async def test_a_client_disconnect_cancels_the_handler() -> None:
    app = await make(Slow)
    app.watch_after_s = 0.01  # the watch starts for requests running longer (1 s by default)
    instance: Slow = app.instance
    gone = asyncio.Event()
    sent: list[Any] = []
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": b""}
    task = asyncio.create_task(app(scope, receive, send))
    await asyncio.wait_for(instance.started.wait(), 5)
    gone.set()
    await asyncio.wait_for(task, 5)  # returns: the cancellation was ours, not the server's
    assert instance.cancelled == 1 and sent == [] and app.disconnects == 1


# -- @serve.ingress -----------------------------------------------------------------------------

events: list[str] = []


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
    events.append("start")
    yield {"db": "connected"}
    events.append("stop")


api = FastAPI(lifespan=lifespan)


@api.middleware("http")
async def tag(request: Request, call_next: Any) -> Any:
    response = await call_next(request)
    response.headers["x-mw"] = "1"
    return response


class Body(BaseModel):
    name: str
    qty: int


@serve.deployment
@serve.ingress(api)
class Api:
    def __init__(self, greeting: str) -> None:
        self.greeting = greeting

    @api.get("/hello/{name}")
    def hello(self, name: str, times: int = 1) -> str:
        return " ".join([f"{self.greeting} {name}"] * times)

    @api.post("/orders")
    async def order(self, body: Body, request: Request) -> dict[str, Any]:
        return {"name": body.name, "qty": body.qty, "by": self.greeting,
                "db": request.state.db, "root": request.scope["root_path"]}  # fmt: skip

    @api.get("/teapot")
    def teapot(self) -> None:
        raise HTTPException(status_code=418, detail="short and stout")

    @api.get("/boom")
    def boom(self) -> None:
        raise RuntimeError("route failed")


async def test_fastapi_routes_run_bound_to_the_instance_under_the_prefix() -> None:
    events.clear()
    app = await make(Api.func_or_class, "hi", route_prefix="/shop")
    assert events == ["start"]
    async with client(app) as c:
        r = await c.get("/shop/hello/bob?times=2")
        assert (r.status_code, r.json()) == (200, "hi bob hi bob")
        assert r.headers["x-mw"] == "1"
        r = await c.post("/shop/orders", json={"name": "tea", "qty": 2})
        assert r.json() == {"name": "tea", "qty": 2, "by": "hi", "db": "connected", "root": "/shop"}
        r = await c.post("/shop/orders", json={"name": "tea", "qty": "many"})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "qty"]
        r = await c.get("/shop/teapot")
        assert (r.status_code, r.json()) == (418, {"detail": "short and stout"})
        assert (await c.get("/shop/nothing")).status_code == 404
        r = await c.get("/shop/boom")
        assert r.status_code == 500
        assert (await c.get("/shop/hello/x")).status_code == 200  # still serving
        spec = (await c.get("/shop/openapi.json")).json()
        assert set(spec["paths"]) == {"/hello/{name}", "/orders", "/teapot", "/boom"}
        params = spec["paths"]["/hello/{name}"]["get"]["parameters"]
        assert [p["name"] for p in params] == ["name", "times"]  # `self` is not a parameter
        docs = await c.get("/shop/docs")
        assert docs.status_code == 200 and "/shop/openapi.json" in docs.text
    await app.shutdown()
    assert events == ["start", "stop"]


def test_ingress_refuses_a_class_with_call() -> None:
    with pytest.raises(TypeError, match="__call__"):

        @serve.ingress(FastAPI())
        class Bad:
            def __call__(self) -> None: ...


async def starlette_home(request: Request) -> PlainTextResponse:
    return PlainTextResponse(f"starlette {request.url.path} {request.scope['root_path']}")


@serve.ingress(Starlette(routes=[Route("/home", starlette_home)]))
class PlainStarlette:
    pass


async def test_a_starlette_app_is_served_as_it_is() -> None:
    app = await make(PlainStarlette, route_prefix="/s")
    async with client(app) as c:
        assert (await c.get("/s/home")).text == "starlette /s/home /s"


def build_app() -> FastAPI:
    built = FastAPI()

    @built.get("/built")
    def route() -> str:
        return "from a builder"

    return built


@serve.ingress(build_app)
class Built:
    pass


async def test_a_builder_function_runs_in_the_replica() -> None:
    app = await make(Built)
    async with client(app) as c:
        assert (await c.get("/built")).json() == "from a builder"


async def test_a_lifespan_scope_from_the_server_runs_the_lifespan_once() -> None:
    events.clear()
    user = await UserDeployment.create("x:y", ("yo",), {}, target=Api.func_or_class)
    app = build_asgi_app(user)
    assert build_asgi_app(user, route_prefix="/p") is app and app.route_prefix == "/p"
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        outbox.append(message)

    task = asyncio.create_task(app({"type": "lifespan"}, inbox.get, send))
    await inbox.put({"type": "lifespan.startup"})
    await eventually(lambda: outbox, what="startup answered")
    await app.startup()  # the replica's own call: already done
    assert events == ["start"] and outbox == [{"type": "lifespan.startup.complete"}]
    await inbox.put({"type": "lifespan.shutdown"})
    await asyncio.wait_for(task, 5)
    assert events == ["start", "stop"]


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)
RESULTS = (
    st.binary(max_size=20)
    | st.text(max_size=20)
    | JSONISH
    | st.builds(
        serve.Response,
        body=st.binary(max_size=10) | st.text(max_size=10),
        status=st.integers(200, 599),
        headers=st.dictionaries(
            st.sampled_from(["x-a", "X-B", "content-type"]), st.text("abc", max_size=4)
        ),
    )
)


@settings(max_examples=80, deadline=None)
@given(RESULTS)
@example(serve.Response(body=b"", status=304))  # no Content-Length on a bodiless status
@example(serve.Response(body=b"", status=204, headers={"x-a": "b"}))
def test_the_fast_path_sends_what_a_starlette_response_would(value: Any) -> None:
    plain = plain_response(value)
    assert plain is not None
    rendered = to_response(value)
    assert plain[0] == rendered.status_code and plain[2] == rendered.body
    assert sorted(plain[1]) == sorted(rendered.raw_headers)


async def test_a_whole_body_is_read_once_a_body_still_arriving_is_replayed_as_it_came() -> None:
    scope = {"type": "http", "method": "POST", "path": "/", "headers": [], "query_string": b""}
    messages = [{"type": "http.request", "body": b"whole", "more_body": False}]
    calls = 0

    async def receive() -> dict[str, Any]:
        nonlocal calls
        calls += 1
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    request = await starlette_request(scope, receive)
    assert await request.body() == b"whole" and calls == 1  # body() read nothing more
    assert await request.is_disconnected() and calls == 2

    parts = [{"type": "http.request", "body": b"a", "more_body": True},
             {"type": "http.request", "body": b"b", "more_body": False}]  # fmt: skip

    async def arriving() -> dict[str, Any]:
        return parts.pop(0)

    request = await starlette_request(scope, arriving)
    assert [chunk async for chunk in request.stream()] == [b"a", b"b", b""]

"""HTTP requests carried over NATS (body kind `http`: the Python proxy's held requests, the
gateway's calls) go through the replica's ASGI app: a live replica on the fake bus serves the
Ray-style example apps, streams StreamingResponse chunks, answers malformed requests with a typed
error and keeps serving."""

from __future__ import annotations

import asyncio
import gc
import json
import uuid
from typing import Any

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.requests import Request as StarletteRequest

from services.replica.asgi import build_asgi_app, serve_carried
from services.replica.usercode import UserDeployment
from shared.wire import decode_as, encode
from shared.wire.messages import (
    Admission,
    Chunk,
    End,
    ErrorReply,
    HttpRequest,
    HttpResponse,
    Request,
)
from tests.unit.test_replica_runtime import buses, collect, make_replica

__all__ = ["buses"]


def http(
    path: str, *, method: str = "GET", body: bytes = b"", prefix: str = "/", stream: bool = True,
    headers: tuple[tuple[str, str], ...] = (), query: str = "",
) -> bytes:  # fmt: skip
    hdrs = (("X-Forwarded-Prefix", prefix), ("content-type", "application/json"), *headers)
    req = HttpRequest(method, path, query, hdrs, body)
    return encode(Request(uuid.uuid4().hex, "__call__", False, stream, None, encode(req), "http"))


def response(out: list[Any]) -> tuple[HttpResponse, bytes]:
    assert isinstance(out[0], Admission) and out[0].accepted
    assert isinstance(out[-1], End), out[-1]
    chunks = [m for m in out if isinstance(m, Chunk)]
    assert out[-1].chunks == len(chunks)
    head = decode_as(chunks[0].data, HttpResponse)
    return head, head.body + b"".join(c.data for c in chunks[1:])


async def test_a_fastapi_ingress_is_served_over_the_carrier(buses: Any) -> None:
    rbus, cbus = buses
    rt = await make_replica(rbus, import_path="examples.ray_style.fastapi_items:Store")
    head, body = response(await collect(cbus, http("/items/apple", prefix="/items")))
    assert head.status == 200 and ("x-served-by", "fleetpulse") in head.headers
    assert json.loads(body) == {"name": "apple", "price": 1.5, "store": "corner",
                                "state": "lifespan"}  # fmt: skip
    pear = json.dumps({"name": "pear", "price": 2}).encode()
    head, body = response(await collect(cbus, http("/items/", method="POST", body=pear, prefix="/items")))  # fmt: skip
    assert (head.status, json.loads(body)) == (200, {"added": "pear", "count": 2})
    head, body = response(await collect(cbus, http("/items/", method="POST", body=b"{}", prefix="/items")))  # fmt: skip
    assert head.status == 422
    head, body = response(await collect(cbus, http("/items/plum", prefix="/items")))
    assert (head.status, json.loads(body)) == (404, {"detail": "no item 'plum'"})
    await rt.stop()


async def test_a_starlette_call_and_a_no_argument_call(buses: Any) -> None:
    rbus, cbus = buses
    rt = await make_replica(rbus, import_path="examples.ray_style.starlette_counter:Counter")
    out = await collect(cbus, http("/counter", method="POST", body=b'{"add": 3}', query="who=ann"))
    head, body = response(out)
    assert head.status == 200
    assert json.loads(body) == {"count": 3, "path": "/counter", "who": "ann"}
    await rt.stop()
    rt = await make_replica(rbus, import_path="examples.ray_style.starlette_counter:Hello")
    head, body = response(await collect(cbus, http("/hello")))
    assert (head.status, body) == (200, b"hello")
    await rt.stop()


async def test_sse_chunks_arrive_as_separate_chunks_and_whole_for_unary_callers(
    buses: Any,
) -> None:
    rbus, cbus = buses
    rt = await make_replica(rbus, import_path="examples.ray_style.sse_tokens:TokenStreamer")
    out = await collect(cbus, http("/tokens", query="prompt=a+b&delay=0"))
    head, body = response(out)
    assert ("content-type", "text/event-stream; charset=utf-8") in head.headers
    assert body == b"data: a\n\ndata: b\n\ndata: [DONE]\n\n"
    assert len([m for m in out if isinstance(m, Chunk)]) >= 3  # streamed, not gathered
    out = await collect(cbus, http("/tokens", query="prompt=a+b&delay=0", stream=False))
    assert len([m for m in out if isinstance(m, Chunk)]) == 1  # the gateway reads chunk 0 only
    assert response(out)[1] == body
    await rt.stop()


async def test_malformed_requests_get_bad_request_and_the_replica_keeps_serving(
    buses: Any,
) -> None:
    rbus, cbus = buses
    rt = await make_replica(rbus)
    bad_scope = http("no-slash")
    garbage = encode(Request("g", "__call__", False, True, None, b"\x93garbage", "http"))
    for data in (bad_scope, garbage, http("/", headers=(("bad name", "v"),))):
        out = await collect(cbus, data)
        assert isinstance(out[-1], ErrorReply) and out[-1].code == "bad_request", out[-1]
    head, body = response(await collect(cbus, http("/", method="PUT", body=b"still here")))
    assert (head.status, body) == (200, b"still here")
    await rt.stop()


async def test_a_raising_call_is_a_user_error_reply(buses: Any) -> None:
    rbus, cbus = buses
    rt = await make_replica(rbus, import_path="tests.unit.asgi_apps:Raising")
    out = await collect(cbus, http("/"))
    assert isinstance(out[-1], ErrorReply) and out[-1].code == "user_error"
    assert out[-1].message == "ValueError: no"
    out = await collect(cbus, http("/midway"))  # broke after the head: an error, never short
    assert isinstance(out[-1], ErrorReply) and out[-1].code == "user_error"
    assert any(isinstance(m, Chunk) for m in out)
    await rt.stop()


class Mirror:
    """What a handler sees of its request, as JSON."""

    async def __call__(self, request: StarletteRequest) -> dict[str, Any]:
        return {
            "method": request.method,
            "path": request.url.path,
            "query": request.query_params.multi_items(),
            "x": [(k, v) for k, v in request.headers.items() if k.startswith("x-h")],
            "body": (await request.body()).hex(),
            "root": request.scope.get("root_path", ""),
        }


NAME = st.text(alphabet="abcdefghij0123456789", min_size=1, max_size=6)


@settings(max_examples=40, deadline=None)
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]),
    segments=st.lists(NAME, max_size=3),
    query=st.lists(st.tuples(NAME, NAME), max_size=3),
    headers=st.lists(st.tuples(NAME, NAME), max_size=3, unique_by=lambda kv: kv[0]),
    body=st.binary(max_size=40),
)
def test_a_request_looks_the_same_to_user_code_on_both_carriers(
    method: str,
    segments: list[str],
    query: list[tuple[str, str]],
    headers: list[tuple[str, str]],
    body: bytes,
) -> None:
    path = "/shop/" + "/".join(segments)
    qs = "&".join(f"{k}={v}" for k, v in query)
    hdrs = tuple((f"x-h{k}", v) for k, v in headers)

    async def both() -> tuple[Any, Any]:
        user = await UserDeployment.create("x:y", (), {}, target=Mirror)
        app = build_asgi_app(user, route_prefix="/shop")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            direct = (await c.request(method, f"{path}?{qs}", content=body, headers=hdrs)).json()
        chunks: list[bytes] = []

        async def emit(data: bytes) -> None:
            chunks.append(data)

        carried = HttpRequest(method, path, qs, hdrs, body)
        await serve_carried(app, carried, emit=emit, collect=True)
        return direct, json.loads(decode_as(chunks[0], HttpResponse).body)

    direct, over_nats = asyncio.run(both())
    assert over_nats == direct
    assert direct["root"] == "/shop" and direct["body"] == body.hex()


async def test_ten_thousand_bad_carried_requests_leave_the_replica_serving(buses: Any) -> None:
    """Garbage bodies, requests no HTTP server would take, and handlers that raise, 10,000 of
    them over the fake bus: each gets its error reply, nothing stays held, admitted or running,
    and live objects stop growing after the warm-up."""
    rbus, cbus = buses
    rt = await make_replica(
        rbus, import_path="tests.unit.asgi_apps:Raising", max_ongoing_requests=200
    )

    def garbage() -> bytes:
        body = b"\x93garbage"
        return encode(Request(uuid.uuid4().hex, "__call__", False, True, None, body, "http"))

    kinds = (garbage, lambda: http("no-slash"), lambda: http("/", headers=(("a b", "v"),)),
             lambda: http("/"))  # fmt: skip
    codes = ("bad_request", "bad_request", "bad_request", "user_error")

    async def batch(n: int) -> None:
        outs = await asyncio.gather(*(collect(cbus, kinds[i % 4](), 10.0) for i in range(n)))
        for i, out in enumerate(outs):
            assert isinstance(out[-1], ErrorReply) and out[-1].code == codes[i % 4], out[-1]

    for _ in range(10):  # warm-up: 1,000
        await batch(100)
    gc.collect()
    objects = len(gc.get_objects())
    for _ in range(90):
        await batch(100)
    gc.collect()
    grown = len(gc.get_objects()) - objects
    assert grown < 1000, f"{grown} more live objects after 9,000 bad requests"
    assert not rt._tasks and not rt._held and rt.admission.ongoing == 0
    assert rt.stats.failed == 10_000
    out = await collect(cbus, http("/midway"))  # still serving: a stream, then its error
    assert any(isinstance(m, Chunk) for m in out)
    await rt.stop()


async def test_a_deployment_without_call_starts_and_answers_method_not_found(buses: Any) -> None:
    rbus, cbus = buses
    rt = await make_replica(rbus, import_path="tests.unit.asgi_apps:HandleOnly")
    out = await collect(cbus, http("/"))
    assert isinstance(out[-1], ErrorReply) and out[-1].code == "method_not_found"
    await rt.stop()

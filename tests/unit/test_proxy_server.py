"""The proxy's HTTP behaviour on the in-memory bus: pass-through, streaming, holding at zero,
503 with reasons, 404, fp_routes, /-/routes, /-/healthz and /metrics.

The proxy listens on a loopback port (aiohttp); replicas, statuses and memberships are fakes on a
`FakeServer`, written the way the controller writes them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from services.proxy.config import ProxyConfig
from services.proxy.registry import KV_ROUTES, Route
from services.proxy.server import ProxyServer
from services.router.config import RouterConfig
from services.router.testing import FakeReplica, lose_in_transit, put_membership
from shared.appconfig import AppConfig, DeploymentConfig
from shared.bus import Bus, Msg
from shared.fakebus import FakeServer
from shared.kv.status import AppStatusView, DeploymentStatusView
from shared.subjects import KV_APPS, KV_MEMBERSHIP, KV_STATUS
from shared.wire.codec import decode_as, encode
from shared.wire.messages import (
    Chunk,
    ErrorReply,
    HandleReport,
    HttpRequest,
    HttpResponse,
    Request,
    WireMessage,
)

FAST = RouterConfig(admission_timeout_s=0.2, queue_poll_max_s=0.01, metrics_interval_s=60.0)


@dataclass
class Stack:
    fake: FakeServer
    ctl: Bus
    proxy: ProxyServer
    http: aiohttp.ClientSession
    replicas: list[FakeReplica]

    async def status(
        self,
        app: str,
        deployments: dict[str, tuple[str, int]],
        *,
        prefix: str | None = "/shop",
        ingress: str | None = "Api",
        message: str = "",
        app_status: str = "RUNNING",
    ) -> None:
        views = {
            name: DeploymentStatusView(status, message, running, running, 0.0, running, 0, "")
            for name, (status, running) in deployments.items()
        }
        value = AppStatusView(app, app_status, prefix, ingress, time.time(), 1, views)
        await (await self.ctl.kv(KV_STATUS)).put(app, value.encode())

    async def replica(
        self, app: str = "shop", deployment: str = "Api", rid: str = "r1"
    ) -> FakeReplica:
        replica = await FakeReplica(self.fake.connect(rid), app, deployment, rid).start()
        self.replicas.append(replica)
        await put_membership(self.ctl, app, deployment, len(self.replicas), [replica.member])
        return replica

    async def until(self, cond: Callable[[], bool], what: str, within_s: float = 3.0) -> None:
        deadline = time.monotonic() + within_s
        while not cond():
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {within_s} s: {what}")
            await asyncio.sleep(0.005)

    def route(self, app: str) -> Route | None:
        return self.proxy.registry.table.routes.get(app)

    def reason(self, app: str) -> str:
        route = self.route(app)
        return route.reason if route else ""

    async def registered(self, app: str, want: bool = True) -> None:
        await self.until(
            lambda: (r := self.route(app)) is not None and r.registered is want, f"{app} {want}"
        )


async def make_stack(**config: Any) -> Stack:
    fake = FakeServer()
    ctl = fake.connect("controller")
    for bucket in (KV_STATUS, KV_APPS, KV_MEMBERSHIP):  # what a controller creates
        await ctl.kv(bucket)
    config.setdefault(
        "front", "python"
    )  # the Python proxy itself (the front door: test_proxy_haproxy)
    proxy = ProxyServer(
        fake.connect("proxy"), ProxyConfig(nats_url="nats://fake", port=0, router=FAST, **config)
    )
    await proxy.start()
    http = aiohttp.ClientSession(base_url=proxy.url, connector=aiohttp.TCPConnector(limit=100))
    return Stack(fake, ctl, proxy, http, [])


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    s = await make_stack(max_wait_s=5.0)
    yield s
    await close(s)


async def close(s: Stack) -> None:
    await s.http.close()
    await s.proxy.stop()
    for r in s.replicas:
        await r.stop()
        await r.bus.close()
    await s.ctl.close()
    await s.proxy.bus.close()


async def test_request_and_response_pass_through(stack: Stack) -> None:
    replica = await stack.replica()
    await stack.status("shop", {"Api": ("HEALTHY", 1)})
    await stack.registered("shop")
    seen: list[HttpRequest] = []

    def app(req: HttpRequest) -> HttpResponse:
        seen.append(req)
        headers = (("X-Multi", "1"), ("X-Multi", "2"), ("Content-Length", "999"), ("Bad Name", "x"))
        return HttpResponse(201, headers, b"out:" + req.body)

    replica.http_fn = app
    async with stack.http.put(
        "/shop/items/a%2Fb?x=1&y=%20",
        data=b"payload",
        headers=[("X-Trace", "t1"), ("X-Trace", "t2"), ("Connection", "keep-alive"),
                 ("X-Forwarded-For", "10.0.0.1"), ("X-Forwarded-Prefix", "/evil")],
    ) as resp:  # fmt: skip
        assert resp.status == 201
        assert await resp.read() == b"out:payload"
        assert resp.headers.getall("X-Multi") == ["1", "2"]
        assert resp.headers["Content-Length"] == str(len(b"out:payload"))
        assert "Bad Name" not in resp.headers
    (req,) = seen
    assert (req.method, req.path, req.query, req.body) == (
        "PUT",
        "/shop/items/a%2Fb",
        "x=1&y=%20",
        b"payload",
    )
    headers = list(req.headers)
    assert [v for k, v in headers if k.lower() == "x-trace"] == ["t1", "t2"]
    assert not any(k.lower() == "connection" for k, _ in headers)
    assert ("X-Forwarded-For", "10.0.0.1, 127.0.0.1") in headers
    assert ("X-Forwarded-Proto", "http") in headers
    assert [v for k, v in headers if k.lower() == "x-forwarded-prefix"] == ["/shop"]
    sent: Request = replica.requests[0]
    assert sent.body_kind == "http" and sent.method == "__call__"


class StreamingReplica(FakeReplica):
    """Answers like a generator deployment: a head, then raw body chunks. With `fail_after`
    set, the chunks after that seq are replaced by an ErrorReply (the user code raised)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.items = [b"one ", b"two ", b"three"]
        self.fail_after: int | None = None
        self._broken: set[str] = set()

    def _results(self, req: Request) -> list[bytes]:
        head = encode(HttpResponse(200, (("content-type", "text/plain"),), b""))
        return [head, *self.items]

    async def _send(self, reply: str, message: WireMessage) -> None:
        if reply in self._broken:
            return  # the stream already ended with the error
        late = isinstance(message, Chunk) and message.seq > (self.fail_after or 1 << 30)
        if late:
            self._broken.add(reply)
            message = ErrorReply("user_error", "generator raised", False)
        await super()._send(reply, message)


async def test_a_generator_response_is_streamed_chunk_by_chunk(stack: Stack) -> None:
    replica = await StreamingReplica(stack.fake.connect("s1"), "shop", "Api", "s1").start()
    stack.replicas.append(replica)
    replica.item_delay_s = 0.05
    await put_membership(stack.ctl, "shop", "Api", 1, [replica.member])
    await stack.status("shop", {"Api": ("HEALTHY", 1)})
    await stack.registered("shop")
    async with stack.http.get("/shop/stream") as resp:
        assert resp.status == 200
        assert resp.headers.get("Transfer-Encoding") == "chunked"
        assert "Content-Length" not in resp.headers
        parts = [chunk async for chunk in resp.content.iter_any()]
    assert b"".join(parts) == b"one two three"
    assert len(parts) >= 2  # delivered as they came, not buffered to the end

    replica.fail_after = 1  # the head and one chunk, then the user code fails
    async with stack.http.get("/shop/stream") as resp:
        assert resp.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.read()  # truncated, never a silently short body
    metrics = await (await stack.http.get("/metrics")).text()
    assert 'fleetpulse_proxy_stream_errors_total{app="shop"} 1.0' in metrics


async def test_unknown_app_is_404_and_unregistered_apps_are_503_with_the_reason(
    stack: Stack,
) -> None:
    async with stack.http.get("/nothing/here") as resp:
        assert resp.status == 404
        assert (await resp.json())["error"] == "not_found"
    await stack.status(
        "shop", {"Api": ("DEPLOY_FAILED", 0)}, message="3 replicas in a row failed to start"
    )
    await stack.registered("shop", False)
    async with stack.http.get("/shop") as resp:
        assert resp.status == 503
        assert resp.headers["Retry-After"] == "5"
        body = await resp.json()
        assert body["error"] == "app_down" and body["app"] == "shop"
        assert "DEPLOY_FAILED" in body["message"] and "failed to start" in body["message"]
    await stack.status("shop", {"Api": ("UPDATING", 0)})
    await stack.until(lambda: "UPDATING" in stack.reason("shop"), "updating")
    async with stack.http.get("/shop") as resp:
        assert resp.status == 503
        assert (await resp.json())["error"] == "app_unavailable"


async def handle_reports(bus: Bus) -> list[HandleReport]:
    reports: list[HandleReport] = []

    async def on(msg: Msg) -> None:
        reports.append(decode_as(msg.data, HandleReport))

    await bus.subscribe("fp.v1.report.handle.shop.Api", on)
    return reports


async def test_request_at_zero_is_held_wakes_the_deployment_and_is_answered(stack: Stack) -> None:
    reports = await handle_reports(stack.ctl)
    await stack.status("shop", {"Api": ("HEALTHY", 0)})
    await stack.registered("shop")  # idle at zero is registered
    call = asyncio.ensure_future(stack.http.post("/shop/wake", data=b"hi"))
    # the router has no replica: a cold-start report asks the controller for one at once
    await stack.until(lambda: any(r.queued_requests >= 1 for r in reports), "cold-start report")
    await stack.until(lambda: stack.proxy.holds.held("shop") == 1, "held")
    routes = await (await stack.http.get("/-/routes")).json()
    assert routes["apps"]["shop"]["held"] == 1 and routes["apps"]["shop"]["registered"]
    await stack.status("shop", {"Api": ("UPSCALING", 0)})  # the wake-up window
    await asyncio.sleep(0.05)
    assert not call.done()
    await stack.replica()
    await stack.status("shop", {"Api": ("HEALTHY", 1)})
    resp = await asyncio.wait_for(call, 5)
    assert resp.status == 200 and await resp.read() == b"hi"
    resp.release()
    assert stack.proxy.holds.total == 0
    metrics = await (await stack.http.get("/metrics")).text()
    assert 'fleetpulse_proxy_held_outcomes_total{app="shop",outcome="admitted"} 1.0' in metrics
    assert 'fleetpulse_proxy_held_requests{app="shop"} 0.0' in metrics


async def test_the_hold_queue_and_the_wait_are_bounded() -> None:
    s = await make_stack(max_held_per_app=2, max_wait_s=0.4, retry_after_s=7)
    try:
        await s.status("shop", {"Api": ("HEALTHY", 0)})
        await s.registered("shop")
        held = [asyncio.ensure_future(s.http.get("/shop")) for _ in range(2)]
        await s.until(lambda: s.proxy.holds.held("shop") == 2, "two held")
        t0 = time.monotonic()
        async with s.http.get("/shop") as resp:  # a third: refused at once
            assert resp.status == 503 and resp.headers["Retry-After"] == "7"
            assert (await resp.json())["error"] == "hold_queue_full"
        assert time.monotonic() - t0 < 0.3
        for resp in await asyncio.gather(*held):  # nobody woke it: the wait bound answers
            assert resp.status == 503 and resp.headers["Retry-After"] == "7"
            assert (await resp.json())["error"] == "no_replica"
            resp.release()
        assert s.proxy.holds.total == 0
    finally:
        await close(s)


async def test_held_requests_get_the_reason_at_once_when_the_app_goes_down(stack: Stack) -> None:
    await stack.status("shop", {"Api": ("HEALTHY", 0)})
    await stack.registered("shop")
    call = asyncio.ensure_future(stack.http.get("/shop"))
    await stack.until(lambda: stack.proxy.holds.held("shop") == 1, "held")
    t0 = time.monotonic()
    await stack.status("shop", {"Api": ("UNHEALTHY", 0)}, message="replicas crashing")
    resp = await asyncio.wait_for(call, 2)
    assert time.monotonic() - t0 < 1.0  # not the 5 s wait bound
    assert resp.status == 503
    assert "UNHEALTHY" in (await resp.json())["message"]
    resp.release()
    # deleted while held: the app is unknown now
    await stack.status("shop", {"Api": ("HEALTHY", 0)})
    await stack.registered("shop")
    call = asyncio.ensure_future(stack.http.get("/shop"))
    await stack.until(lambda: stack.proxy.holds.held("shop") == 1, "held again")
    await (await stack.ctl.kv(KV_STATUS)).delete("shop")
    resp = await asyncio.wait_for(call, 2)
    assert resp.status == 404
    resp.release()


async def test_queued_requests_also_get_the_reason_when_the_app_goes_down(stack: Stack) -> None:
    replica = await stack.replica()
    replica.reject = True  # full: requests wait in the router's queue (not held: not at zero)
    await stack.status("shop", {"Api": ("HEALTHY", 1)})
    await stack.registered("shop")
    call = asyncio.ensure_future(stack.http.get("/shop"))
    await stack.until(lambda: stack.proxy.holds.waiting("shop") == 1, "waiting")
    assert stack.proxy.holds.held("shop") == 0
    await stack.status("shop", {"Api": ("UNHEALTHY", 0)}, message="replicas crashing")
    resp = await asyncio.wait_for(call, 2)
    assert resp.status == 503 and "UNHEALTHY" in (await resp.json())["message"]
    resp.release()


async def test_a_full_router_queue_is_503_naming_max_queued_requests(stack: Stack) -> None:
    replica = await FakeReplica(stack.fake.connect("r1"), "shop", "Api", "r1").start()
    stack.replicas.append(replica)
    replica.reject = True  # at max_ongoing_requests: requests queue at the proxy's router
    await put_membership(stack.ctl, "shop", "Api", 1, [replica.member], max_queued=1)
    await stack.status("shop", {"Api": ("HEALTHY", 1)})
    await stack.registered("shop")
    first = asyncio.ensure_future(stack.http.get("/shop"))
    await stack.until(lambda: stack.proxy.holds.waiting("shop") == 1, "one queued")
    async with stack.http.get("/shop") as resp:
        assert resp.status == 503 and "Retry-After" in resp.headers
        assert resp.headers["Fp-Error"] == "backpressure"
        body = await resp.json()
        assert "max_queued_requests 1" in body["message"], body
    replica.reject = False
    resp = await asyncio.wait_for(first, 5)
    assert resp.status == 200
    resp.release()


async def test_replica_errors_map_to_statuses(stack: Stack) -> None:
    replica = await stack.replica()
    await stack.status("shop", {"Api": ("HEALTHY", 1)})
    await stack.registered("shop")
    replica.error = ErrorReply("user_error", "ValueError: bad", False)
    async with stack.http.get("/shop") as resp:
        assert resp.status == 500 and resp.headers["Fp-Error"] == "user_error"
        assert (await resp.json())["message"] == "ValueError: bad"
    replica.error = ErrorReply("replica_shutdown", "draining", True)
    async with stack.http.get("/shop") as resp:
        assert resp.status == 503 and "Retry-After" in resp.headers
    replica.error = None
    async with stack.http.get("/shop", headers={"Fp-Deadline-S": "soon"}) as resp:
        assert resp.status == 400
    replica.hang = True
    async with stack.http.get("/shop", headers={"Fp-Deadline-S": "0.1"}) as resp:
        assert resp.status == 504


async def test_a_response_lost_in_transit_is_a_retryable_502_saying_the_request_ran(
    stack: Stack,
) -> None:
    """A NATS node restarted between the replica and the proxy: the head never came, the end
    did (docs/proxy.md, "Status codes")."""
    replica = await stack.replica()
    await stack.status("shop", {"Api": ("HEALTHY", 1)})
    await stack.registered("shop")
    stack.fake.lose = lose_in_transit(lambda m: isinstance(m, Chunk) and m.seq == 0)
    async with stack.http.get("/shop/greet") as resp:
        assert resp.status == 502 and "Retry-After" not in resp.headers
        assert (resp.headers["Fp-Error"], resp.headers["Fp-Retryable"]) == ("response_lost", "true")
        body = await resp.json()
        assert (body["error"], body["retryable"]) == ("response_lost", True)
        assert "lost in transit" in body["message"] and "ran there" in body["message"]
    assert len(replica.requests) == 1  # not sent again by the proxy: it ran
    async with stack.http.get("/shop/greet") as resp:
        assert resp.status == 200


async def test_a_streamed_response_that_lost_its_tail_is_truncated_not_short(stack: Stack) -> None:
    replica = await StreamingReplica(stack.fake.connect("s1"), "shop", "Api", "s1").start()
    stack.replicas.append(replica)
    await put_membership(stack.ctl, "shop", "Api", 1, [replica.member])
    await stack.status("shop", {"Api": ("HEALTHY", 1)})
    await stack.registered("shop")
    stack.fake.lose = lose_in_transit(lambda m: isinstance(m, Chunk) and m.seq == 3)
    async with stack.http.get("/shop/stream") as resp:
        assert resp.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.read()  # "one two " and no final chunk: the client sees the truncation
    metrics = await (await stack.http.get("/metrics")).text()
    assert 'fleetpulse_proxy_stream_errors_total{app="shop"} 1.0' in metrics


async def test_routes_are_published_to_kv_and_removed_with_the_app(stack: Stack) -> None:
    cfg = AppConfig("shop", (DeploymentConfig("Api", "services.examples.echo:Echo"),), "/shop")
    await (await stack.ctl.kv(KV_APPS)).put("shop", cfg.to_json())
    routes = await stack.ctl.kv(KV_ROUTES)

    async def published() -> Route | None:
        entry = await routes.get("shop")
        return Route.from_json(entry.value) if entry else None

    async def eventually(pred: Callable[[Route | None], bool]) -> Route | None:
        for _ in range(300):
            value = await published()
            if pred(value):
                return value
            await asyncio.sleep(0.01)
        raise AssertionError("fp_routes did not get there")

    # deployed, no status yet: known (503, not 404), published as not registered
    first = await eventually(lambda r: r is not None)
    assert first is not None and not first.registered and "controller" in first.reason
    async with stack.http.get("/shop") as resp:
        assert resp.status == 503
    await stack.status("shop", {"Api": ("HEALTHY", 0)})
    route = await eventually(lambda r: r is not None and r.registered)
    assert route is not None and route.route_prefix == "/shop" and route.ingress == "Api"
    await (await stack.ctl.kv(KV_APPS)).delete("shop")
    await (await stack.ctl.kv(KV_STATUS)).delete("shop")
    await eventually(lambda r: r is None)


async def test_own_endpoints(stack: Stack) -> None:
    await stack.replica()
    await stack.status("shop", {"Api": ("HEALTHY", 1)})
    await stack.registered("shop")
    async with stack.http.get("/-/healthz") as resp:
        assert resp.status == 200
        assert await resp.json() == {"status": "ok", "apps": 1, "registered": 1, "held": 0}
    async with stack.http.get("/shop/x") as resp:
        assert resp.status == 200
    async with stack.http.get("/nowhere") as resp:
        assert resp.status == 404
    text = await (await stack.http.get("/metrics")).text()
    assert 'fleetpulse_proxy_request_duration_seconds_count{app="shop",code="200"} 1.0' in text
    assert 'fleetpulse_proxy_request_duration_seconds_count{app="",code="404"} 1.0' in text
    assert 'fleetpulse_proxy_registry_apps{registered="true"} 1.0' in text
    assert 'fleetpulse_proxy_app_registered{app="shop"} 1.0' in text
    routes = await (await stack.http.get("/-/routes")).json()
    shop = routes["apps"]["shop"]
    assert routes["ready"] and shop["registered"] and shop["route_prefix"] == "/shop"
    assert shop["deployments"]["Api"]["serviceability"] == "serving"


async def test_an_oversized_body_is_413(stack: Stack) -> None:
    await stack.replica()
    await stack.status("shop", {"Api": ("HEALTHY", 1)})
    await stack.registered("shop")
    too_big = b"x" * stack.proxy.bus.max_payload
    async with stack.http.post("/shop", data=too_big) as resp:
        assert resp.status == 413


class HeldStreamReplica(StreamingReplica):
    """A streamed response whose head carries its first part and says more follows; the rest
    comes much later (a token generator thinking)."""

    def _results(self, req: Request) -> list[bytes]:
        head = encode(HttpResponse(200, (("content-type", "text/plain"),), b"first ", True))
        return [head, b"second"]


async def test_a_head_that_says_more_follows_is_sent_at_once(stack: Stack) -> None:
    """The first token reaches the client while the replica still works on the second (the
    proxy used to read on to chunk 1 to decide between a whole and a streamed response)."""
    replica = await HeldStreamReplica(stack.fake.connect("s1"), "shop", "Api", "s1").start()
    stack.replicas.append(replica)
    replica.item_delay_s = 30.0
    await put_membership(stack.ctl, "shop", "Api", 1, [replica.member])
    await stack.status("shop", {"Api": ("HEALTHY", 1)})
    await stack.registered("shop")
    async with stack.http.get("/shop/stream") as resp:
        assert resp.status == 200 and resp.headers.get("Transfer-Encoding") == "chunked"
        assert await asyncio.wait_for(resp.content.readany(), 10) == b"first "

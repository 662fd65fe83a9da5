"""The replica's own HTTP server (services/replica/http_server.py) with trivial ASGI apps: the
announced address, admission and counting through the runtime, 503 when full, drain (in-flight
requests finish, new connections are refused), start failures, and no signal handlers taken."""

from __future__ import annotations

import asyncio
import signal
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import httpx
import pytest

from services.replica.config import ReplicaConfig
from services.replica.http_server import (
    RETRY_AFTER_S,
    AdmissionGate,
    HttpStartError,
    ReplicaHttpServer,
)
from services.replica.runtime import ReplicaRuntime
from services.replica.usercode import UserDeployment
from shared.bus import Msg
from shared.fakebus import FakeServer
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.wire import decode_as
from shared.wire.messages import Lifecycle, ReplicaReport
from tests.waiting import eventually

Scope = MutableMapping[str, Any]


async def respond(send: Callable[[Any], Awaitable[None]], status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-length", str(len(body)).encode())]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


async def lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        await send({"type": message["type"] + ".complete"})
        if message["type"] == "lifespan.shutdown":
            return


class Gated:
    """An app whose requests to /slow wait for `release`; echoes anything else."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.entered = 0
        self.cancelled = 0

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"] == "/boom":
            raise RuntimeError("boom")
        if scope["path"] == "/500":
            await respond(send, 500, b"bad")
            return
        if scope["path"] == "/slow":
            self.entered += 1
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        await respond(send, 200, body or scope["path"].encode())


class FakeCounter:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.ongoing = 0
        self.ended: list[tuple[str, str]] = []
        self.refused = 0

    def admit_http(self) -> bool:
        if self.ongoing >= self.limit:
            self.refused += 1
            return False
        self.ongoing += 1
        return True

    def release_http(self, started: float, outcome: str, scope: Any) -> None:
        self.ongoing -= 1
        self.ended.append((f"{scope.get('method', 'WS')} {scope.get('path', '')}", outcome))


async def serving(app: Any, **kw: Any) -> ReplicaHttpServer:
    server = ReplicaHttpServer(app, **kw)
    await server.start()
    return server


async def test_it_serves_on_a_free_port_and_announces_host_port() -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    server = await serving(Gated(), advertise="replica-7.internal")
    try:
        assert server.port and server.port != 0
        assert server.address == f"replica-7.internal:{server.port}"
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
            r = await client.post("/echo", content=b"hello")
            assert (r.status_code, r.content) == (200, b"hello")
            assert "server" not in r.headers  # no uvicorn banner
        # uvicorn took no signal handlers: the replica's own decide when to drain
        assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    finally:
        await server.drain()


async def test_connections_have_nagle_off_on_any_loop() -> None:
    """Without TCP_NODELAY a response written as head then body waits ~40 ms for the client's
    delayed ACK (asyncio sets it only on sockets created as TCP; uvloop always)."""
    server = await serving(Gated())
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
            assert (await client.get("/x")).status_code == 200
            conns = list(server._server.server_state.connections)
            assert len(conns) == 1
            sock = conns[0].transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        await server.drain()


async def test_the_gate_counts_each_request_and_refuses_over_the_limit() -> None:
    app, counter = Gated(), FakeCounter(limit=1)
    server = await serving(AdmissionGate(app, counter))
    base = f"http://127.0.0.1:{server.port}"
    try:
        async with httpx.AsyncClient(base_url=base) as a, httpx.AsyncClient(base_url=base) as b:
            slow = asyncio.create_task(a.get("/slow"))
            await eventually(lambda: app.entered == 1, what="the slow request runs")
            assert counter.ongoing == 1
            full = await b.get("/other")
            assert full.status_code == 503
            assert full.headers["retry-after"] == str(RETRY_AFTER_S)
            assert full.headers["fp-error"] == "overloaded"
            assert full.json()["retryable"] is True
            app.release.set()
            assert (await slow).status_code == 200
            assert (await b.get("/500")).status_code == 500
            assert (await b.get("/boom")).status_code == 500  # uvicorn's own answer
        assert counter.ongoing == 0 and counter.refused == 1
        assert counter.ended == [
            ("GET /slow", "ok"), ("GET /500", "user_error"), ("GET /boom", "user_error")
        ]  # fmt: skip
    finally:
        await server.drain()


async def test_drain_finishes_in_flight_requests_and_refuses_new_connections() -> None:
    app = Gated()
    server = await serving(app, graceful_timeout_s=10.0)
    base = f"http://127.0.0.1:{server.port}"
    async with httpx.AsyncClient(base_url=base) as client:
        slow = asyncio.create_task(client.get("/slow"))
        await eventually(lambda: app.entered == 1, what="the slow request runs")
        drained = asyncio.create_task(server.drain())
        await eventually(lambda: _refused(server.port), what="new connections refused")
        assert not drained.done()  # the request in flight holds the drain
        app.release.set()
        r = await slow
        assert (r.status_code, r.content) == (200, b"/slow")
        await asyncio.wait_for(drained, 10.0)
    assert app.cancelled == 0


async def test_drain_cancels_what_outlives_the_grace_timeout() -> None:
    app = Gated()
    server = await serving(AdmissionGate(app, FakeCounter(1)), graceful_timeout_s=0.5)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
        slow = asyncio.create_task(client.get("/slow"))
        await eventually(lambda: app.entered == 1, what="the slow request runs")
        await asyncio.wait_for(server.drain(), 10.0)
        assert app.cancelled == 1
        r = await slow  # what a replica stopping under a request answers over NATS too
        assert (r.status_code, r.headers["fp-error"], r.headers["fp-retryable"]) == (
            503,
            "replica_shutdown",
            "true",
        )


async def test_websockets_are_admitted_counted_and_refused_with_1013_when_full() -> None:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    async def ws_echo(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        assert scope["type"] == "websocket"
        await receive()
        await send({"type": "websocket.accept"})
        while (message := await receive())["type"] == "websocket.receive":
            await send({"type": "websocket.send", "text": message.get("text")})

    counter = FakeCounter(limit=1)
    server = await serving(AdmissionGate(ws_echo, counter))
    url = f"ws://127.0.0.1:{server.port}/ws"
    try:
        async with connect(url) as first:
            await first.send("hi")
            assert await first.recv() == "hi"
            assert counter.ongoing == 1  # a WebSocket holds a slot while it is open
            async with connect(url) as second:
                with pytest.raises(ConnectionClosed) as closed:
                    await second.recv()
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
        await eventually(lambda: counter.ongoing == 0, what="the slot freed")
        assert counter.refused == 1 and counter.ended == [("WS /ws", "ok")]
    finally:
        await server.drain()


def _refused(port: int | None) -> bool:
    assert port is not None
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


async def test_a_failed_lifespan_startup_is_a_start_error() -> None:
    async def app(scope: Scope, receive: Any, send: Any) -> None:
        assert scope["type"] == "lifespan"
        await receive()
        await send({"type": "lifespan.startup.failed", "message": "no model"})

    with pytest.raises(HttpStartError, match="lifespan"):
        await ReplicaHttpServer(app).start()


async def test_a_port_in_use_is_a_start_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(HttpStartError, match="cannot bind"):
            await ReplicaHttpServer(Gated(), port=port).start()


async def test_ipv6_loopback_is_announced_in_brackets() -> None:
    if not socket.has_ipv6:
        pytest.fail("this test needs IPv6 loopback")
    server = await serving(Gated(), host="::1")
    try:
        assert server.address == f"[::1]:{server.port}"
        async with httpx.AsyncClient(base_url=f"http://[::1]:{server.port}") as client:
            assert (await client.get("/x")).content == b"/x"
    finally:
        await server.drain()


# -- with the runtime: HTTP requests are the replica's requests -------------------------------


async def test_http_requests_count_in_the_runtime_and_its_reports() -> None:
    bus_server = FakeServer()
    bus, watcher = bus_server.connect(), bus_server.connect()
    reports: list[ReplicaReport] = []
    lifecycles: list[Lifecycle] = []

    async def on_report(m: Msg) -> None:
        reports.append(decode_as(m.data, ReplicaReport))

    async def on_lifecycle(m: Msg) -> None:
        lifecycles.append(decode_as(m.data, Lifecycle))

    await watcher.subscribe(S.report("replica", "app", "dep", "r1"), on_report)
    await watcher.subscribe(S.report("lifecycle", "app", "dep", "r1"), on_lifecycle)
    cfg = ReplicaConfig.of(
        app="app", deployment="dep", import_path="services.examples.echo:Echo",
        replica_id="r1", max_ongoing_requests=2, metrics_interval_s=0.05,
        health_check_period_s=0.05,
    )  # fmt: skip
    user = await UserDeployment.create(cfg.spec.import_path, (), {})
    rt = ReplicaRuntime(cfg, bus, user, serves_http=True)
    assert rt.push_metrics  # nobody else sees HTTP load: the replica reports it itself
    app = Gated()
    server = ReplicaHttpServer(AdmissionGate(app, rt))
    await rt.start(server.start)
    rt.drain_also.append(server.drain)
    ready = await eventually(lambda: [x for x in lifecycles if x.state == "ready"])
    assert ready[0].http_address == server.address
    base = f"http://127.0.0.1:{server.port}"
    try:
        async with httpx.AsyncClient(base_url=base) as a, httpx.AsyncClient(base_url=base) as b:
            slow = [asyncio.create_task(c.get("/slow")) for c in (a, b)]
            await eventually(lambda: app.entered == 2, what="two slow requests run")
            assert rt.admission.ongoing == 2
            reports.clear()
            await eventually(
                lambda: any(r.running_requests > 1.9 for r in reports),
                what="a report counting the two HTTP requests",
            )
            async with httpx.AsyncClient(base_url=base) as c:
                assert (await c.get("/x")).status_code == 503  # the same limit as over NATS
            assert rt.stats.rejected == 1
            app.release.set()
            assert [(await t).status_code for t in slow] == [200, 200]
        assert rt.admission.ongoing == 0
        assert rt.stats.completed == 2
    finally:
        await rt.drain()
        await bus.close()
        await watcher.close()
    assert [x.state for x in lifecycles] == ["starting", "ready", "draining", "exited"]
    assert _refused(server.port)


async def test_a_draining_runtime_drains_its_http_server_with_it() -> None:
    bus = FakeServer().connect()
    cfg = ReplicaConfig.of(
        app="app", deployment="dep", import_path="services.examples.echo:Echo",
        replica_id="r1", graceful_shutdown_timeout_s=10.0, health_check_period_s=0.05,
    )  # fmt: skip
    user = await UserDeployment.create(cfg.spec.import_path, (), {})
    rt = ReplicaRuntime(cfg, bus, user, serves_http=True)
    app = Gated()
    server = ReplicaHttpServer(AdmissionGate(app, rt), graceful_timeout_s=10.0)
    await rt.start(server.start)
    rt.drain_also.append(server.drain)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
        slow = asyncio.create_task(client.get("/slow"))
        await eventually(lambda: app.entered == 1, what="the slow request runs")
        drained = asyncio.create_task(rt.drain())
        await eventually(lambda: _refused(server.port), what="new connections refused")
        assert not drained.done()
        app.release.set()
        assert (await slow).status_code == 200
        await asyncio.wait_for(drained, 10.0)
    assert rt.stats.completed == 1
    await bus.close()


def test_admission_runs_http_that_reaches_a_draining_replica_within_the_limit() -> None:
    from services.replica.admission import Admission

    a = Admission(2)
    a.draining = True
    assert not a.try_admit()  # over NATS: a router tries another replica
    assert a.try_admit(while_draining=True) and a.try_admit(while_draining=True)
    assert not a.try_admit(while_draining=True)  # the limit holds all the same
    a.release()
    assert a.ongoing == 1

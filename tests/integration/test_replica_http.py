"""Replicas serving HTTP themselves, on a real nats-server with real replica processes:
- the whole chain: a controller and an agent run an app whose ingress replica serves HTTP at the
  address its member value carries (the other deployment's replica serves none);
- a replica draining finishes an HTTP request in flight and refuses new connections;
- HTTP load shows in the replica's own reports (what autoscaling reads).
"""

from __future__ import annotations

import asyncio
import functools
import json
import signal
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.agent.config import AgentConfig
from services.agent.service import AgentService
from shared.appconfig import AppConfig, DeploymentConfig
from shared.bus import Bus, Msg
from shared.kv.membership import Member, deployment_pattern
from shared.kv.view import DocKV
from shared.natsbus import NatsBus
from shared.replicahttp import ROUTE_PREFIX_ENV
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.subjects import KV_APPS, KV_MEMBERSHIP
from shared.wire import decode_as
from shared.wire.messages import Lifecycle, ReplicaReport
from tests.integration.test_controller_service import start_controller, stop_controller
from tests.procs import ServiceProcesses, replica_args, service_processes
from tests.waiting import eventually as _eventually

ECHO = "services.examples.echo:Echo"
WAIT_S = 30.0
eventually = functools.partial(_eventually, within_s=WAIT_S, every_s=0.05)


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    b = await NatsBus.connect(nats_url, name="test")
    yield b
    await b.close()


@pytest.fixture
def procs() -> Iterator[ServiceProcesses]:
    with service_processes() as p:
        yield p


async def members(bus: Bus, deployment: str) -> list[Member]:
    docs = DocKV(await bus.kv(KV_MEMBERSHIP), Member)
    return [c.doc for c in await docs.snapshot(deployment_pattern("demo", deployment)) if c.doc]


async def test_an_ingress_replica_serves_http_at_the_address_its_member_carries(
    bus: Bus, nats_url: str, tmp_path: Path
) -> None:
    fast = {"health_check_period_s": 0.5, "graceful_shutdown_timeout_s": 2.0, "num_replicas": 1}
    app = AppConfig(
        "demo",
        (DeploymentConfig("Api", ECHO, **fast), DeploymentConfig("Side", ECHO, **fast)),
        route_prefix="/demo",
        ingress="Api",
    )
    await (await bus.kv(KV_APPS)).put("demo", app.to_json())
    svc, ctl = await start_controller(nats_url)
    agent = AgentService(
        AgentConfig(nats_url=nats_url, agent_id="agent-h", max_replicas=2, log_dir=str(tmp_path))
    )
    run = asyncio.create_task(agent.run())
    try:

        async def served() -> Member | None:
            found = await members(bus, "Api")
            return found[0] if found and found[0].http_address else None

        member = await eventually(served, what="the ingress replica's member with its address")
        assert member.http_address is not None
        host, _, port = member.http_address.rpartition(":")
        assert host == "127.0.0.1" and int(port) > 0
        async with httpx.AsyncClient(base_url=f"http://{member.http_address}") as client:
            r = await client.post("/demo/anything", content=b"over HTTP, no NATS")
        assert (r.status_code, r.content) == (200, b"over HTTP, no NATS")
        assert r.headers["x-echo-method"] == "POST"
        side = await eventually(lambda: members(bus, "Side"), what="the other deployment runs")
        assert side[0].http_address is None  # not the ingress: serves no HTTP itself
    finally:
        agent.stop()
        await asyncio.wait_for(run, WAIT_S)
        await stop_controller(svc, ctl)


class Lifecycles:
    def __init__(self) -> None:
        self.items: list[Lifecycle] = []

    async def on_msg(self, msg: Msg) -> None:
        self.items.append(decode_as(msg.data, Lifecycle))

    def state(self, state: str) -> list[Lifecycle]:
        return [e for e in self.items if e.state == state]


async def start_serving(
    procs: ServiceProcesses,
    bus: Bus,
    url: str,
    monkeypatch: pytest.MonkeyPatch,
    extra: list[str],
) -> tuple[Any, Lifecycles, str]:
    """A replica process of an ingress (its agent would set these variables); returns it, its
    lifecycle messages and the http_address it announced on "ready"."""
    events = Lifecycles()
    await bus.subscribe(S.report("lifecycle", "app", "dep", "r1"), events.on_msg)
    await bus.flush()
    monkeypatch.setenv(ROUTE_PREFIX_ENV, "/echo")
    monkeypatch.setenv("FLEETPULSE_REPLICA_HTTP_HOST", "127.0.0.1")
    proc = procs.start(replica_args(url, "r1", extra=extra))
    ready = await eventually(lambda: events.state("ready"), what="the replica is ready")
    address = ready[0].http_address
    assert address is not None and address.startswith("127.0.0.1:")
    return proc, events, address


def refused(address: str) -> bool:
    host, _, port = address.rpartition(":")
    with socket.socket() as s:
        return s.connect_ex((host, int(port))) != 0


async def test_drain_finishes_an_http_request_in_flight_and_refuses_new_connections(
    procs: ServiceProcesses, bus: Bus, nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    delay = 2.0
    running: list[float] = []

    async def on_report(msg: Msg) -> None:
        running.append(decode_as(msg.data, ReplicaReport).running_requests)

    await bus.subscribe(S.report("replica", "app", "dep", "r1"), on_report)
    proc, events, address = await start_serving(
        procs, bus, nats_url, monkeypatch,
        ["--init-kwargs", json.dumps({"delay_s": delay}), "--graceful-shutdown-timeout-s", "15",
         "--health-check-period-s", "0.5", "--metrics-interval-s", "0.1"],
    )  # fmt: skip
    async with httpx.AsyncClient(base_url=f"http://{address}", timeout=30) as client:
        started = time.monotonic()
        in_flight = asyncio.create_task(client.post("/echo", content=b"slow"))
        await eventually(lambda: running and running[-1] > 0, what="the request runs")
        proc.send_signal(signal.SIGTERM)
        await eventually(lambda: events.state("draining"), what="the replica drains")
        await eventually(lambda: refused(address), what="new connections refused")
        assert not in_flight.done()
        r = await in_flight
        assert (r.status_code, r.content) == (200, b"slow")
        assert time.monotonic() - started >= delay
    exited = await eventually(lambda: events.state("exited"), what="the replica exits")
    assert exited[0].exit_code == 0
    assert await asyncio.to_thread(proc.wait, WAIT_S) == 0


async def test_http_load_shows_in_the_replicas_own_reports(
    procs: ServiceProcesses, bus: Bus, nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    reports: list[ReplicaReport] = []

    async def on_report(msg: Msg) -> None:
        reports.append(decode_as(msg.data, ReplicaReport))

    await bus.subscribe(S.report("replica", "app", "dep", "r1"), on_report)
    proc, _, address = await start_serving(
        procs, bus, nats_url, monkeypatch,
        ["--init-kwargs", json.dumps({"delay_s": 3.0}), "--max-ongoing-requests", "3",
         "--metrics-interval-s", "0.2", "--health-check-period-s", "0.5"],
    )  # fmt: skip
    await eventually(lambda: reports, what="the replica reports (no --push-metrics given)")
    assert all(r.running_requests == 0 for r in reports)
    limits = httpx.Limits(max_connections=10)
    async with httpx.AsyncClient(base_url=f"http://{address}", timeout=30, limits=limits) as c:
        calls = [asyncio.create_task(c.post("/echo", content=b"x")) for _ in range(3)]
        await eventually(
            lambda: any(r.running_requests > 2.5 for r in reports),
            what="a report counting three HTTP requests in flight",
        )
        full = await c.post("/echo", content=b"one too many")
        assert full.status_code == 503 and "retry-after" in full.headers
        assert [r.status_code for r in await asyncio.gather(*calls)] == [200, 200, 200]
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(proc.wait, WAIT_S) == 0


async def test_a_replica_whose_http_server_cannot_start_exits_saying_so(
    procs: ServiceProcesses, bus: Bus, nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = Lifecycles()
    await bus.subscribe(S.report("lifecycle", "app", "dep", "r1"), events.on_msg)
    await bus.flush()
    monkeypatch.setenv(ROUTE_PREFIX_ENV, "/echo")
    monkeypatch.setenv("FLEETPULSE_REPLICA_HTTP_HOST", "192.0.2.1")  # TEST-NET: not this host's
    proc = procs.start(replica_args(nats_url, "r1", extra=["--health-check-period-s", "0.5"]))
    exited = await eventually(lambda: events.state("exited"), what="the replica gives up")
    assert exited[0].exit_code == 1
    assert not events.state("ready")  # never announced as serving
    assert await asyncio.to_thread(proc.wait, WAIT_S) != 0


async def test_a_fastapi_ingress_is_served_under_its_route_prefix(
    procs: ServiceProcesses, bus: Bus, nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = Lifecycles()
    await bus.subscribe(S.report("lifecycle", "app", "dep", "r1"), events.on_msg)
    await bus.flush()
    monkeypatch.setenv(ROUTE_PREFIX_ENV, "/items")
    args = replica_args(
        nats_url, "r1", import_path="examples.ray_style.fastapi_items:Store",
        extra=["--health-check-period-s", "0.5"],
    )  # fmt: skip
    proc = procs.start(args)
    ready = await eventually(lambda: events.state("ready"), what="the replica is ready")
    async with httpx.AsyncClient(base_url=f"http://{ready[0].http_address}") as client:
        apple = await client.get("/items/apple")
        assert apple.status_code == 200, apple.text
        assert apple.json() == {"name": "apple", "price": 1.5, "store": "corner",
                                "state": "lifespan"}  # fmt: skip
        assert apple.headers["x-served-by"] == "fleetpulse"  # the app's own middleware
        assert (await client.get("/items/plum")).status_code == 404  # HTTPException
        bad = await client.post("/items/", json={"name": "pear"})
        assert bad.status_code == 422  # pydantic validation, FastAPI's answer
        added = await client.post("/items/", json={"name": "pear", "price": 2.0})
        assert added.json() == {"added": "pear", "count": 2}
        assert (await client.get("/items/docs")).status_code == 200  # OpenAPI under the prefix
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(proc.wait, WAIT_S) == 0

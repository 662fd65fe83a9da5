"""The router gateway over a real nats-server: plain NATS requests in, service errors out."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client

from services.router.config import GatewayConfig, RouterConfig
from services.router.gateway import HDR_ERROR, HDR_STATUS, Gateway, serve
from services.router.testing import FakeReplica, put_membership
from shared.natsbus import NatsBus
from shared.wire.messages import ErrorReply, HttpRequest, HttpResponse

CONFIG = RouterConfig(admission_timeout_s=0.3, metrics_interval_s=60.0)


@pytest.fixture
async def replica(nats_url: str) -> AsyncIterator[FakeReplica]:
    bus = await NatsBus.connect(nats_url, name="replica")
    r = await FakeReplica(bus, "shop", "cart", "r1").start()
    await put_membership(bus, "shop", "cart", 1, [r.member])
    yield r
    await r.stop()
    await bus.close()


@pytest.fixture
async def gateway(nats_url: str) -> AsyncIterator[Gateway]:
    bus = await NatsBus.connect(nats_url, name="gateway")
    gw = Gateway(bus, GatewayConfig(nats_url=nats_url, deadline_s=2.0, router=CONFIG))
    await gw.start()
    yield gw
    await gw.stop()
    await bus.close()


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Client]:
    client = await nats.connect(nats_url)
    yield client
    await client.close()


async def test_plain_request_gets_the_result(
    gateway: Gateway, replica: FakeReplica, nc: Client
) -> None:
    def app(req: HttpRequest) -> HttpResponse:
        return HttpResponse(200, (("Content-Type", "text/plain"),), req.body.upper())

    replica.http_fn = app
    msg = await nc.request("fp.v1.call.shop.cart", b"hello", timeout=5)
    assert msg.data == b"HELLO"
    assert msg.headers is not None
    assert msg.headers[HDR_STATUS] == "200" and msg.headers["Content-Type"] == "text/plain"
    # many callers at once: each request runs on its own task
    replica.delay_s = 0.2
    started = asyncio.get_running_loop().time()
    replies = await asyncio.gather(
        *(nc.request("fp.v1.call.shop.cart", b"x%d" % i, timeout=5) for i in range(20))
    )
    assert sorted(m.data for m in replies) == sorted(b"X%d" % i for i in range(20))
    assert asyncio.get_running_loop().time() - started < 2.0


async def test_failures_come_back_as_service_errors(
    gateway: Gateway, replica: FakeReplica, nc: Client
) -> None:
    replica.error = ErrorReply("user_error", "ZeroDivisionError: division by zero", False)
    msg = await nc.request("fp.v1.call.shop.cart", b"", timeout=5)
    assert msg.headers is not None
    assert msg.headers["Nats-Service-Error-Code"] == "500"
    assert "ZeroDivisionError" in msg.headers["Nats-Service-Error"]
    assert msg.headers[HDR_ERROR] == "user_error"
    # no replica at all: the deadline runs out and the caller hears about it
    msg = await nc.request(
        "fp.v1.call.shop.ghost", b"", headers={"Fp-Deadline-S": "0.2"}, timeout=5
    )
    assert msg.headers is not None and msg.headers["Nats-Service-Error-Code"] == "504"


async def test_srv_stats_counts_error_replies(
    gateway: Gateway, replica: FakeReplica, nc: Client
) -> None:
    """Issue 14: `$SRV.STATS` said 0 errors after error replies."""
    replica.error = ErrorReply("user_error", "boom", False)
    for _ in range(3):
        msg = await nc.request("fp.v1.call.shop.cart", b"", timeout=5)
        assert msg.headers is not None and msg.headers["Nats-Service-Error-Code"] == "500"
    replica.error = None
    await nc.request("fp.v1.call.shop.cart", b"ok", timeout=5)
    stats = json.loads((await nc.request("$SRV.STATS.fleetpulse-router", b"", timeout=5)).data)
    (endpoint,) = stats["endpoints"]
    assert endpoint["num_requests"] == 4
    assert endpoint["num_errors"] == 3 and "500" in endpoint["last_error"]


async def test_the_504_arrives_before_the_deadline_the_caller_sent(
    gateway: Gateway, replica: FakeReplica, nc: Client
) -> None:
    """A caller whose client timeout equals its Fp-Deadline-S gets the 504, not a timeout."""
    replica.hang = True
    msg = await nc.request(
        "fp.v1.call.shop.cart", b"", headers={"Fp-Deadline-S": "1.0"}, timeout=1.0
    )
    assert msg.headers is not None and msg.headers["Nats-Service-Error-Code"] == "504"


async def test_discoverable_with_srv_ping(gateway: Gateway, nc: Client) -> None:
    ping = await nc.request("$SRV.PING.fleetpulse-router", b"", timeout=5)
    assert json.loads(ping.data)["name"] == "fleetpulse-router"
    info = json.loads((await nc.request("$SRV.INFO.fleetpulse-router", b"", timeout=5)).data)
    (endpoint,) = info["endpoints"]
    assert endpoint["subject"] == "fp.v1.call.*.*" and endpoint["queue_group"] == "fp-gateway"


async def test_serve_drains_in_flight_requests_on_stop(
    nats_url: str, replica: FakeReplica, nc: Client
) -> None:
    replica.delay_s = 0.3
    stop = asyncio.Event()
    cfg = GatewayConfig(nats_url=nats_url, router=CONFIG)
    server = asyncio.create_task(serve(cfg, stop=stop))
    for _ in range(200):  # wait until the endpoint is up
        try:
            await nc.request("$SRV.PING.fleetpulse-router", b"", timeout=0.1)
            break
        except nats.errors.Error:
            await asyncio.sleep(0.02)
    call = asyncio.create_task(nc.request("fp.v1.call.shop.cart", b"late", timeout=5))
    await asyncio.sleep(0.1)
    stop.set()
    assert await asyncio.wait_for(server, 5) == 0
    assert (await call).data == b"late"


def test_cli_process_exits_cleanly_on_sigterm(nats_url: str) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.router", "--nats", nats_url],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if b"gateway: serving" in line:
                break
        else:
            pytest.fail("the gateway never reported that it serves")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

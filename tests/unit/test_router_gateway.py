"""GatewayCore (the gateway without NATS micro) and its config, on the in-memory bus."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator

import pytest

from services.router.config import (
    DEFAULT_GATEWAY_QUEUE_GROUP,
    GatewayConfig,
    RouterConfig,
    add_gateway_arguments,
)
from services.router.gateway import HDR_ERROR, HDR_RETRYABLE, HDR_STATUS, GatewayCore
from services.router.testing import FakeReplica, put_membership
from shared.errors import ConfigError
from shared.fakebus import FakeServer
from shared.wire.messages import ErrorReply, HttpRequest, HttpResponse

FAST = RouterConfig(admission_timeout_s=0.05, queue_poll_max_s=0.01, metrics_interval_s=60.0)


@pytest.fixture
async def setup() -> AsyncIterator[tuple[GatewayCore, FakeReplica]]:
    server = FakeServer()
    rbus, gbus = server.connect("replica"), server.connect("gateway")
    replica = await FakeReplica(rbus, "shop", "cart", "r1").start()
    await put_membership(rbus, "shop", "cart", 1, [replica.member])
    core = GatewayCore(gbus, GatewayConfig(nats_url="nats://x", deadline_s=5.0, router=FAST))
    yield core, replica
    await core.close()
    await replica.stop()
    for b in (gbus, rbus):
        await b.close()


async def test_body_headers_and_status(setup: tuple[GatewayCore, FakeReplica]) -> None:
    core, replica = setup
    seen: list[HttpRequest] = []

    def app(req: HttpRequest) -> HttpResponse:
        seen.append(req)
        return HttpResponse(
            201, (("X-A", "1"), ("X-A", "2"), ("Bad Name", "x")), b"out:" + req.body
        )

    replica.http_fn = app
    reply = await core.handle(
        "fp.v1.call.shop.cart", b"in", {"Fp-Path": "/v1/x", "Fp-Query": "q=1", "Trace": "t"}
    )
    assert reply.error_code is None
    assert reply.data == b"out:in"
    assert reply.headers == {"X-A": "1, 2", HDR_STATUS: "201"}
    (req,) = seen
    assert (req.method, req.path, req.query, req.body) == ("POST", "/v1/x", "q=1", b"in")
    assert ("Trace", "t") in req.headers  # NATS headers pass through
    sent = replica.requests[0]
    assert sent.body_kind == "http" and not sent.stream and sent.method == "__call__"

    await core.handle("fp.v1.call.shop.cart", b"", {"Fp-Method": "other", "Fp-Http-Method": "PUT"})
    assert replica.requests[1].method == "other" and seen[1].method == "PUT"
    assert seen[1].path == "/"


@pytest.mark.parametrize(
    "error,code,token,retryable",
    [
        (ErrorReply("user_error", "ValueError: no", False), "500", "user_error", "false"),
        (ErrorReply("method_not_found", "no such", False), "404", "method_not_found", "false"),
        (ErrorReply("replica_shutdown", "bye", True), "503", "replica_shutdown", "true"),
    ],
)
async def test_replica_errors_become_service_errors(
    setup: tuple[GatewayCore, FakeReplica], error: ErrorReply, code: str, token: str, retryable: str
) -> None:
    core, replica = setup
    replica.error = error
    reply = await core.handle("fp.v1.call.shop.cart", b"", None)
    assert reply.error_code == code
    assert reply.headers == {HDR_ERROR: token, HDR_RETRYABLE: retryable}
    assert error.message in reply.error


async def test_bad_requests_and_deadline(setup: tuple[GatewayCore, FakeReplica]) -> None:
    core, replica = setup
    bad = await core.handle("fp.v1.call.shop", b"", None)
    assert (bad.error_code, bad.headers[HDR_ERROR]) == ("400", "bad_request")
    bad = await core.handle("fp.v1.call.shop.cart", b"", {"Fp-Deadline-S": "soon"})
    assert bad.error_code == "400"
    replica.hang = True
    late = await core.handle("fp.v1.call.shop.cart", b"", {"Fp-Deadline-S": "0.1"})
    assert (late.error_code, late.headers[HDR_ERROR]) == ("504", "deadline_exceeded")
    # a deployment without replicas: the request waits its deadline out, then 504
    empty = await core.handle("fp.v1.call.shop.nothing", b"", {"Fp-Deadline-S": "0.05"})
    assert empty.error_code == "504"


def test_gateway_config_from_flags_and_env() -> None:
    p = argparse.ArgumentParser()
    add_gateway_arguments(p)
    args = p.parse_args(["--deadline", "3", "--max-queued", "7"])
    args.nats = "nats://h:1"
    env = {"FLEETPULSE_COLUMNAR_MIN_REPLICAS": "16", "FLEETPULSE_NAMESPACE": "blue"}
    cfg = GatewayConfig.from_args(args, env)
    assert (cfg.nats_url, cfg.namespace, cfg.queue_group) == (
        "nats://h:1",
        "blue",
        DEFAULT_GATEWAY_QUEUE_GROUP,
    )
    assert cfg.deadline_s == 3.0
    assert cfg.router.max_queued_requests == 7 and cfg.router.columnar_min_replicas == 16
    args = p.parse_args(["--columnar-min-replicas", "8"])
    args.nats = "nats://h:1"
    assert GatewayConfig.from_args(args, env).router.columnar_min_replicas == 8
    with pytest.raises(ConfigError, match="FLEETPULSE_COLUMNAR_MIN_REPLICAS"):
        RouterConfig.from_env({"FLEETPULSE_COLUMNAR_MIN_REPLICAS": "many"})
    with pytest.raises(ConfigError, match="admission_timeout_s"):
        RouterConfig(admission_timeout_s=0)

# ruff: noqa: F811  (the router fixtures imported from test_router_handle are test arguments)
"""Part of a response stream lost in transit (a NATS node restarted between a replica and its
router): the reader says so (`ResponseLostError`, retryable, the request ran) instead of
"ended without a result", a broken stream, or a silently short result (docs/dataplane.md,
"Lost in transit"). The fake bus loses the chosen messages; what follows them still arrives.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import REGISTRY

from services.router.errors import RequestFailed, ResponseLostError
from services.router.handle import DeploymentHandle, connect_handle
from services.router.http import call_http, failure_of
from services.router.testing import FakeReplica, lose_in_transit, put_membership
from shared.bus import Msg
from shared.clock import FakeClock
from shared.fakebus import FakeBus, FakeServer
from shared.wire.codec import decode_as, encode
from shared.wire.messages import (
    Admission,
    Chunk,
    End,
    HealthStatus,
    HttpRequest,
    Request,
    WireMessage,
)
from tests.unit.test_router_handle import FAST, bus, clock, rbus, server  # noqa: F401 (fixtures)

APP, DEP = "shop", "lossy"


def answers(rid: str) -> Callable[[str, tuple[Any, ...], dict[str, Any]], Any]:
    """`gen` yields 0..n-1 (a stream); any other method returns who answered."""

    def fn(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return range(kwargs["n"]) if method == "gen" else {"rid": rid}

    return fn


async def start(rbus: FakeBus, clock: FakeClock, *ids: str) -> list[FakeReplica]:
    reps = [await FakeReplica(rbus, APP, DEP, rid, clock=clock).start() for rid in ids]
    for r in reps:
        r.fn = answers(r.replica_id)
    await put_membership(rbus, APP, DEP, 1, [r.member for r in reps])
    return reps


async def handle(bus: FakeBus, clock: FakeClock) -> DeploymentHandle:
    return await connect_handle(APP, DEP, bus=bus, config=FAST, clock=clock, rng=random.Random(1))


def chunk(seq: int) -> Callable[[WireMessage], bool]:
    return lambda m: isinstance(m, Chunk) and m.seq == seq


def outcomes(outcome: str) -> float:
    labels = {"app": APP, "deployment": DEP, "outcome": outcome}
    return (
        REGISTRY.get_sample_value("fleetpulse_router_request_duration_seconds_count", labels) or 0
    )


@pytest.mark.parametrize("counted", [True, False], ids=["end_counts", "older_replica"])
async def test_a_unary_result_lost_before_its_end_is_a_retryable_loss(
    bus: FakeBus, rbus: FakeBus, clock: FakeClock, server: FakeServer, counted: bool
) -> None:
    (r1,) = await start(rbus, clock, "r1")
    r1.count_chunks = counted
    h = await handle(bus, clock)
    try:
        before = outcomes("response_lost")
        server.lose = lose_in_transit(chunk(0))
        with pytest.raises(ResponseLostError) as lost:
            await h.remote()
        assert lost.value.retryable and lost.value.replica_id == "r1"
        assert "lost in transit" in str(lost.value) and "runs it again" in str(lost.value)
        assert "chunk 0" in str(lost.value)
        assert outcomes("response_lost") == before + 1
        assert len(r1.requests) == 1  # the request ran once: the router did not try it again
        assert await h.remote() == {"rid": "r1"}  # the next one is whole
        assert h.router.chooser.in_flight_total() == 0
    finally:
        await h.close()


async def test_a_chunk_lost_mid_stream_is_a_loss_not_a_broken_stream(
    bus: FakeBus, rbus: FakeBus, clock: FakeClock, server: FakeServer
) -> None:
    await start(rbus, clock, "r1")
    h = await handle(bus, clock)
    try:
        server.lose = lose_in_transit(chunk(1))
        got: list[Any] = []
        with pytest.raises(ResponseLostError, match="chunk 1 never arrived, chunk 2 did"):
            async for item in h.options(method="gen").stream(n=4):
                got.append(item)
        assert got == [0]
    finally:
        await h.close()


async def test_a_gap_of_several_chunks_names_them(
    bus: FakeBus, rbus: FakeBus, clock: FakeClock, server: FakeServer
) -> None:
    await start(rbus, clock, "r1")
    h = await handle(bus, clock)
    try:
        server.lose = lose_in_transit(lambda m: isinstance(m, Chunk) and m.seq in (1, 2), 2)
        got: list[Any] = []
        with pytest.raises(ResponseLostError, match="chunks 1-2 never arrived, chunk 3 did"):
            async for item in h.options(method="gen").stream(n=5):
                got.append(item)
        assert got == [0]
    finally:
        await h.close()


async def test_a_lost_tail_is_a_loss_not_a_short_result(
    bus: FakeBus, rbus: FakeBus, clock: FakeClock, server: FakeServer
) -> None:
    await start(rbus, clock, "r1")
    h = await handle(bus, clock)
    try:
        server.lose = lose_in_transit(lambda m: isinstance(m, Chunk) and m.seq >= 2, 2)
        got: list[Any] = []
        with pytest.raises(ResponseLostError, match="chunks 2-3 of 4 never arrived"):
            async for item in h.options(method="gen").stream(n=4):
                got.append(item)
        assert got == [0, 1]
    finally:
        await h.close()


async def test_streams_that_lose_nothing_read_as_before(
    bus: FakeBus, rbus: FakeBus, clock: FakeClock
) -> None:
    (r1,) = await start(rbus, clock, "r1")
    h = await handle(bus, clock)
    try:
        gen = h.options(method="gen")
        assert [i async for i in gen.stream(n=3)] == [0, 1, 2]
        assert [i async for i in gen.stream(n=0)] == []  # no chunk at all is a whole result
        r1.count_chunks = False  # an older replica: nothing to check against, nothing refused
        assert [i async for i in gen.stream(n=0)] == []
        assert [i async for i in gen.stream(n=2)] == [0, 1]
        assert await h.remote() == {"rid": "r1"}
    finally:
        await h.close()


async def test_a_lost_admission_is_read_on_not_run_again_elsewhere(
    bus: FakeBus, rbus: FakeBus, clock: FakeClock, server: FakeServer
) -> None:
    r1, r2 = await start(rbus, clock, "r1", "r2")
    h = await handle(bus, clock)
    try:
        for _ in range(6):  # whichever replica gets it, its answer is used and nobody else runs it
            server.lose = lose_in_transit(lambda m: isinstance(m, Admission))
            ran = len(r1.requests) + len(r2.requests)
            assert (await h.remote())["rid"] in ("r1", "r2")
            assert len(r1.requests) + len(r2.requests) == ran + 1
        # admission and result lost, the end arrived: a loss, not a retry on the other replica
        server.lose = lose_in_transit(lambda m: isinstance(m, Admission | Chunk), 2)
        with pytest.raises(ResponseLostError):
            await h.remote()
        assert len(r1.requests) + len(r2.requests) == 7
        assert h.router.bad_input.total == 0
        assert h.router.chooser.in_flight_total() == 0
    finally:
        await h.close()


async def test_an_http_head_lost_in_transit_maps_to_a_retryable_502(
    bus: FakeBus, rbus: FakeBus, clock: FakeClock, server: FakeServer
) -> None:
    await start(rbus, clock, "r1")
    h = await handle(bus, clock)
    try:
        server.lose = lose_in_transit(chunk(0))
        request = HttpRequest("GET", "/greet", "", (), b"")
        with pytest.raises(ResponseLostError) as lost:
            await call_http(h.router, request, method="__call__", deadline_s=None)
        failure = failure_of(lost.value)
        assert (failure.status, failure.token, failure.retryable) == (502, "response_lost", True)
        assert "ran there" in failure.message
    finally:
        await h.close()


class _Scripted:
    """A replica that sends exactly the messages a test gives it, whatever the request."""

    def __init__(self, bus: FakeBus, messages: list[WireMessage]) -> None:
        self.bus = bus
        self.messages = messages

    async def __call__(self, msg: Msg) -> None:
        decode_as(msg.data, Request)
        assert msg.reply
        for m in self.messages:
            await self.bus.publish(msg.reply, encode(m))


@pytest.mark.parametrize(
    ("messages", "why"),
    [
        ([Chunk(0, b"\x01"), Chunk(0, b"\x01"), End(2)], "chunk 0 where 1 was due"),
        ([Chunk(0, b"\x01"), Chunk(1, b"\x02"), End(1)], "the end counts 1 chunks where 2"),
    ],
    ids=["seq_backwards", "end_counts_fewer"],
)
async def test_what_loss_cannot_explain_is_still_a_broken_stream(
    bus: FakeBus, rbus: FakeBus, clock: FakeClock, messages: list[WireMessage], why: str
) -> None:
    replica = FakeReplica(rbus, APP, DEP, "odd", clock=clock)
    health = HealthStatus("odd", True, clock.wall(), 0)
    script = _Scripted(rbus, [Admission(True, 1, health, False), *messages])
    sub = await rbus.subscribe(replica.rpc_subject, script)
    await rbus.flush()
    await put_membership(rbus, APP, DEP, 1, [replica.member])
    h = await handle(bus, clock)
    try:
        with pytest.raises(RequestFailed) as broken:
            async for _ in h.options(method="gen").stream(n=2):
                pass
        assert (broken.value.code, broken.value.retryable) == ("bad_response", False)
        assert why in broken.value.message
    finally:
        await h.close()
        await sub.unsubscribe()

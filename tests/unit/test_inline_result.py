"""A unary result riding on its admission (services/replica/inline.py): one message back for a
call that finishes before the replica's loop turns, the usual three otherwise, and a router
that reads either the same way."""

from __future__ import annotations

import uuid
from typing import Any

import msgpack
import pytest

from services.replica.inline import PendingAdmission, State
from services.router.config import RouterConfig
from services.router.handle import connect_handle
from services.router.testing import Seat, put_membership
from shared.bus import Bus, Msg
from shared.errors import BusTimeout
from shared.fakebus import FakeServer
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.wire import decode, encode
from shared.wire.messages import (
    Admission,
    CallArgs,
    Chunk,
    End,
    ErrorReply,
    HealthStatus,
    Request,
)
from tests.unit.test_replica_runtime import make_replica

GOOD = HealthStatus("r1", True, 1.0, 0)


def test_the_result_rides_only_while_the_admission_waits() -> None:
    p = PendingAdmission(1, GOOD, False, None)
    assert p.admission == Admission(True, 1, GOOD, False)
    rider = p.ride(b"\x01")
    assert rider == Admission(True, 1, GOOD, False, None, b"\x01") and p.gone
    assert p.ride(b"\x02") is None and not p.due()  # it left with the first result

    p = PendingAdmission(1, GOOD, False, ("m1",))
    assert p.due() and p.state is State.SENDING and not p.gone  # the loop turned first
    assert p.ride(b"\x01") is None and not p.due()  # chunks follow once it is sent
    assert p.admission == Admission(True, 1, GOOD, False, ("m1",))
    p.sent()
    assert p.gone


def request(method: str, *args: Any, inline: bool = True, stream: bool = False) -> bytes:
    body = encode(CallArgs(tuple(args), {}))
    req = Request(uuid.uuid4().hex, method, True, stream, None, body, "args", None, inline)
    return encode(req)


async def read_all(bus: Bus, data: bytes, quiet_s: float = 0.3) -> list[Any]:
    """Every message of the response stream, until it stays quiet for `quiet_s`."""
    stream = await bus.request_stream(S.rpc("app", "dep", "r1"), data)
    out: list[Any] = []
    try:
        while True:
            try:
                out.append(decode((await stream.next(quiet_s if out else 5.0)).data))
            except BusTimeout:
                return out
    finally:
        await stream.close()


@pytest.fixture
async def buses() -> Any:
    server = FakeServer()
    a, b = server.connect(), server.connect()
    yield a, b
    await a.close()
    await b.close()


async def test_a_fast_call_answers_with_one_message(buses: Any) -> None:
    rbus, cbus = buses
    rt = await make_replica(rbus)
    (only,) = await read_all(cbus, request("echo", {"x": 1}))
    assert isinstance(only, Admission) and only.accepted and only.health.replica_id == "r1"
    assert only.inline_result is not None and msgpack.unpackb(only.inline_result) == {"x": 1}
    assert rt.stats.completed == 1
    await rt.stop()


async def test_a_call_that_awaits_sends_its_admission_first(buses: Any) -> None:
    rbus, cbus = buses
    rt = await make_replica(rbus)
    adm, chunk, end = await read_all(cbus, request("sleep", 0.05))
    assert isinstance(adm, Admission) and adm.accepted and adm.inline_result is None
    assert isinstance(chunk, Chunk) and chunk.seq == 0 and msgpack.unpackb(chunk.data) == 0.05
    assert end == End(1)
    await rt.stop()


async def test_errors_streams_and_older_routers_keep_the_three_part_stream(buses: Any) -> None:
    rbus, cbus = buses
    rt = await make_replica(rbus)
    adm, err = await read_all(cbus, request("fail", "boom"))  # raises before the loop turns
    assert isinstance(adm, Admission) and adm.inline_result is None
    assert isinstance(err, ErrorReply) and err.code == "user_error"
    out = await read_all(cbus, request("count", 2, stream=True))
    assert [type(m) for m in out] == [Admission, Chunk, Chunk, End]
    assert out[0].inline_result is None
    out = await read_all(cbus, request("echo", 7, inline=False))  # a router that did not offer
    assert [type(m) for m in out] == [Admission, Chunk, End]
    await rt.stop()


async def test_the_router_reads_a_riding_result_and_an_ordinary_one() -> None:
    server = FakeServer()
    rbus, cbus = server.connect(), server.connect()
    rt = await make_replica(rbus)
    await put_membership(cbus, "app", "dep", 1, [Seat("r1", S.rpc("app", "dep", "r1"))])
    handle = await connect_handle("app", "dep", bus=cbus, config=RouterConfig())
    offered: list[bool] = []

    async def note(msg: Msg) -> None:
        offered.append(decode(msg.data).accepts_inline_result)

    # NATS hands the request to every subscriber: this one only looks
    spy = await server.connect().subscribe(S.rpc("app", "dep", "r1"), note)
    try:
        assert await handle.options(method="echo").remote(b"abc") == b"abc"  # rides
        assert await handle.options(method="sleep").remote(0.02) == 0.02  # three parts
        assert await handle.options(method="count").remote(3) == [0, 1, 2]  # collected
        assert offered == [True, True, True]  # unary calls offer to take a riding result
        assert [x async for x in handle.options(method="count").stream(2)] == [0, 1]
        assert offered[-1] is False  # a stream never does
    finally:
        await spy.unsubscribe()
        await handle.close()
        await rt.stop()
        await rbus.close()
        await cbus.close()


async def test_a_handle_call_answered_on_its_admission_is_counted_and_closed(buses: Any) -> None:
    rbus, cbus = buses
    rt = await make_replica(rbus)
    await put_membership(cbus, "app", "dep", 1, [Seat("r1", S.rpc("app", "dep", "r1"))])
    handle = await connect_handle("app", "dep", bus=cbus, config=RouterConfig())
    try:
        echo = handle.options(method="echo")
        assert [await echo.remote({"n": i}) for i in range(3)] == [{"n": i} for i in range(3)]
        router = handle.router
        assert router.counters.done == 3 and router.counters.arrived == 3
        assert router.core.in_flight_now == 0  # each call released its replica
        assert not cbus._streams  # and closed its reply stream
        assert rt.stats.completed == 3
    finally:
        await handle.close()
        await rt.stop()

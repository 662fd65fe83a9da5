"""DeploymentHandle against fake replicas over a real nats-server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from services.router.config import RouterConfig
from services.router.errors import DeadlineExceeded, ReplicaLostError, RequestFailed
from services.router.handle import DeploymentHandle, connect_handle
from services.router.testing import FakeReplica, Seat, put_membership
from shared.bus import Msg
from shared.natsbus import NatsBus
from shared.wire.codec import decode_as
from shared.wire.messages import ErrorReply, HandleReport

APP, DEP = "shop", "cart"
CONFIG = RouterConfig(admission_timeout_s=0.3, metrics_interval_s=60.0)

Connect = Callable[[str], Awaitable[NatsBus]]


@pytest.fixture
async def connect(nats_url: str) -> AsyncIterator[Connect]:
    opened: list[NatsBus] = []

    async def make(name: str) -> NatsBus:
        bus = await NatsBus.connect(nats_url, name=name, reconnect_wait=0.1)
        opened.append(bus)
        return bus

    yield make
    for bus in opened:
        await bus.close()


async def start_replicas(connect: Connect, *ids: str, epoch: int = 1) -> list[FakeReplica]:
    reps = []
    for rid in ids:
        r = await FakeReplica(await connect(f"replica-{rid}"), APP, DEP, rid).start()
        r.fn = lambda method, args, kwargs, rid=rid: (
            [f"{rid}:{i}" for i in range(args[0])] if method == "gen" else rid
        )
        reps.append(r)
    await put_membership(reps[0].bus, APP, DEP, epoch, [r.member for r in reps])
    return reps


async def new_handle(connect: Connect, **kw: object) -> DeploymentHandle:
    return await connect_handle(APP, DEP, bus=await connect("router"), config=CONFIG, **kw)  # type: ignore[arg-type]


async def test_unary_stream_and_frames(connect: Connect) -> None:
    (r1,) = await start_replicas(connect, "r1")
    r1.frames = 2
    h = await new_handle(connect)
    try:
        assert await h.remote() == "r1"
        assert [x async for x in h.options(method="gen").stream(3)] == ["r1:0", "r1:1", "r1:2"]
        assert h.router.health.get("r1") is not None
        results = await asyncio.gather(*(h.remote() for _ in range(50)))
        assert results == ["r1"] * 50
    finally:
        await h.close()


async def test_rejection_and_unreachable_replicas_are_retried(connect: Connect) -> None:
    r1, r2, r3 = await start_replicas(connect, "r1", "r2", "r3")
    r1.reject = True
    r2.silent = True
    ghost = Seat("ghost", f"fp.v1.rpc.{APP}.{DEP}.ghost")
    await put_membership(r1.bus, APP, DEP, 2, [r1.member, r2.member, ghost, r3.member])
    h = await new_handle(connect)
    try:
        assert h.router.epoch == 2
        for _ in range(8):
            assert await h.remote() == "r3"
        assert r3.admitted == 8
        assert r1.rejected + len(r2.requests) >= 1
    finally:
        await h.close()


async def test_deadline_and_error_reply(connect: Connect) -> None:
    (r1,) = await start_replicas(connect, "r1")
    h = await new_handle(connect)
    try:
        r1.hang = True
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            await h.options(deadline_s=0.3).remote()
        assert 0.25 <= time.monotonic() - started < 1.5
        r1.hang = False
        r1.error = ErrorReply("user_error", "KeyError: 'x'", False)
        with pytest.raises(RequestFailed) as failed:
            await h.remote()
        assert failed.value.code == "user_error" and "KeyError" in failed.value.message
    finally:
        await h.close()


async def test_replica_that_disappears_mid_request(connect: Connect) -> None:
    (r1,) = await start_replicas(connect, "r1")
    r1.hang = True
    h = await new_handle(connect)
    try:
        call = asyncio.create_task(h.remote())
        for _ in range(100):
            if r1.admitted:
                break
            await asyncio.sleep(0.01)
        assert r1.admitted == 1
        started = time.monotonic()
        await r1.bus.close()  # the process is gone: its connection closes, nothing more comes
        with pytest.raises(ReplicaLostError) as lost:
            await asyncio.wait_for(call, 5)
        assert time.monotonic() - started < 2.0
        assert lost.value.retryable
    finally:
        await h.close()
        await r1.stop()


async def test_cold_start_report_over_nats(connect: Connect) -> None:
    observer = await connect("controller")
    got: asyncio.Queue[HandleReport] = asyncio.Queue()

    async def on_report(msg: Msg) -> None:
        got.put_nowait(decode_as(msg.data, HandleReport))

    await observer.subscribe(f"fp.v1.report.handle.{APP}.{DEP}", on_report)
    await observer.flush()
    h = await new_handle(connect)  # no membership at all yet
    try:
        call = asyncio.create_task(h.remote())
        report = await asyncio.wait_for(got.get(), 2)
        assert report.queued_requests >= 1 and report.seq == 1
        await start_replicas(connect, "r1")
        assert await asyncio.wait_for(call, 5) == "r1"
    finally:
        await h.close()

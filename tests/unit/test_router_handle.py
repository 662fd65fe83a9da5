"""DeploymentHandle against fake replicas on the in-memory bus (no sockets)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import random
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from services.router.call import open_call
from services.router.config import RouterConfig
from services.router.errors import (
    BackPressureError,
    DeadlineExceeded,
    ReplicaLostError,
    RequestFailed,
)
from services.router.handle import DeploymentHandle, connect_handle
from services.router.testing import FakeReplica, Seat, put_membership
from shared.bus import Msg
from shared.clock import FakeClock
from shared.fakebus import FakeBus, FakeServer
from shared.wire.codec import decode_as, encode
from shared.wire.messages import CallArgs, HandleReport

APP, DEP = "shop", "cart"

FAST = RouterConfig(
    admission_timeout_s=0.05,
    liveness_interval_s=0.02,
    probe_timeout_s=0.02,
    queue_poll_max_s=0.01,
    frame_pump_delay_s=0.02,
    metrics_interval_s=60.0,
)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def server(clock: FakeClock) -> FakeServer:
    return FakeServer(clock=clock)


@pytest.fixture
async def bus(server: FakeServer) -> AsyncIterator[FakeBus]:
    b = server.connect("router")
    yield b
    await b.close()


@pytest.fixture
async def rbus(server: FakeServer) -> AsyncIterator[FakeBus]:
    b = server.connect("replicas")
    yield b
    await b.close()


def says_who(rid: str) -> Callable[[str, tuple[Any, ...], dict[str, Any]], Any]:
    def fn(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return {"rid": rid, "args": list(args)}

    return fn


async def replicas(rbus: FakeBus, clock: FakeClock, *ids: str, epoch: int = 1) -> list[FakeReplica]:
    reps = [await FakeReplica(rbus, APP, DEP, rid, clock=clock).start() for rid in ids]
    for r in reps:
        r.fn = says_who(r.replica_id)
    await put_membership(rbus, APP, DEP, epoch, [r.member for r in reps])
    return reps


async def handle(
    bus: FakeBus, clock: FakeClock, config: RouterConfig = FAST, seed: int = 3, **kw: Any
) -> DeploymentHandle:
    return await connect_handle(
        APP, DEP, bus=bus, config=config, clock=clock, rng=random.Random(seed), **kw
    )


async def test_unary_and_stream(bus: FakeBus, rbus: FakeBus, clock: FakeClock) -> None:
    (r1,) = await replicas(rbus, clock, "r1")
    r1.fn = lambda method, args, kwargs: (
        range(kwargs["n"]) if method == "gen" else {"m": method, "a": list(args), "k": kwargs}
    )
    h = await handle(bus, clock)
    try:
        assert await h.remote(1, "x", k=b"\x00") == {
            "m": "__call__",
            "a": [1, "x"],
            "k": {"k": b"\x00"},
        }
        assert [i async for i in h.options(method="gen").stream(n=4)] == [0, 1, 2, 3]
        it = await h.options(method="gen", stream=True).remote(n=2)
        assert [i async for i in it] == [0, 1]
        sent = r1.requests[0]
        assert sent.supports_health_frames and not sent.stream and sent.deadline is None
        assert decode_as(sent.body, CallArgs) == CallArgs((1, "x"), {"k": b"\x00"})
        assert r1.requests[1].stream and r1.requests[1].method == "gen"
        assert h.router.chooser.in_flight_total() == 0
    finally:
        await h.close()


async def test_deadline_is_sent_as_wall_clock(
    bus: FakeBus, rbus: FakeBus, clock: FakeClock
) -> None:
    (r1,) = await replicas(rbus, clock, "r1")
    h = await handle(bus, clock, deadline_s=5.0)
    try:
        await h.remote()
        assert r1.requests[0].deadline == pytest.approx(clock.wall() + 5.0)
    finally:
        await h.close()


async def test_frames_are_folded_into_carried_health_and_never_returned(
    bus: FakeBus, rbus: FakeBus, clock: FakeClock
) -> None:
    (r1,) = await replicas(rbus, clock, "r1")
    r1.frames = 3
    r1.fn = lambda method, args, kwargs: ["a", "b"] if method == "gen" else "one"
    h = await handle(bus, clock)
    try:
        assert await h.remote() == "one"
        seen = h.router.health.get("r1")
        assert seen is not None
        assert [i async for i in h.options(method="gen").stream()] == ["a", "b"]
        newer = h.router.health.get("r1")
        assert newer is not None and newer.checked_at > seen.checked_at
    finally:
        await h.close()


async def test_frame_pump_starts_only_for_a_slow_stream_consumer(
    bus: FakeBus, rbus: FakeBus, clock: FakeClock
) -> None:
    (r1,) = await replicas(rbus, clock, "r1")
    r1.frames = 2
    r1.item_delay_s = 0.005
    r1.fn = lambda method, args, kwargs: list(range(5))
    h = await handle(bus, clock)
    try:
        reader = await open_call(
            h.router,
            method="gen",
            body=encode(CallArgs((), {})),
            body_kind="args",
            stream=True,
            deadline_s=None,
        )
        first = await reader.next_chunk()
        assert first is not None and first.seq == 0
        assert not reader.pumping
        before = h.router.health.get("r1")
        await asyncio.sleep(0.2)  # a slow consumer: the pump takes over and folds frames
        assert reader.pumping
        after = h.router.health.get("r1")
        assert before is not None and after is not None and after.checked_at > before.checked_at
        seqs = []
        while (chunk := await reader.next_chunk()) is not None:
            seqs.append(chunk.seq)
        assert seqs == [1, 2, 3, 4]
        await reader.close()

        # a unary call never pumps, whatever the replica declares
        reader = await open_call(
            h.router,
            method="x",
            body=encode(CallArgs((), {})),
            body_kind="args",
            stream=False,
            deadline_s=None,
        )
        await asyncio.sleep(0.1)
        assert not reader.pumping
        await reader.close()
    finally:
        await h.close()


async def test_retry_on_rejection(bus: FakeBus, rbus: FakeBus, clock: FakeClock) -> None:
    r1, r2 = await replicas(rbus, clock, "r1", "r2")
    r1.reject = True
    h = await handle(bus, clock)
    try:
        for _ in range(10):
            assert (await h.remote())["rid"] == "r2"
            clock.advance(1.0)  # the backoff of r1 runs out: it will be tried again
        assert r1.rejected >= 2
        assert r1.admitted == 0 and r2.admitted == 10
        assert h.router.chooser.backoff_s("r1") > 0
    finally:
        await h.close()


async def test_retry_when_admission_times_out_or_nobody_listens(
    bus: FakeBus, rbus: FakeBus, clock: FakeClock
) -> None:
    r1, r2 = await replicas(rbus, clock, "r1", "r2")
    r1.silent = True
    ghost = Seat("ghost", "fp.v1.rpc.shop.cart.ghost")  # listed, but no process behind it
    await put_membership(rbus, APP, DEP, 2, [r1.member, ghost, r2.member])
    h = await handle(bus, clock)
    try:
        for _ in range(6):
            assert (await h.remote())["rid"] == "r2"
            clock.advance(1.0)
        assert len(r1.requests) >= 1
        assert h.router.chooser.backoff_s("ghost") > 0
    finally:
        await h.close()


async def test_all_reject_then_capacity_frees(
    bus: FakeBus, rbus: FakeBus, clock: FakeClock
) -> None:
    (r1,) = await replicas(rbus, clock, "r1")
    r1.reject = True
    h = await handle(bus, clock)
    try:
        call = asyncio.create_task(h.remote())
        await asyncio.sleep(0.05)
        assert not call.done() and h.router.queued_now == 1
        r1.reject = False
        clock.advance(1.0)
        assert (await call)["rid"] == "r1"
        assert h.router.queued_now == 0
    finally:
        await h.close()


async def test_zero_replicas_queues_and_reports_at_once(
    bus: FakeBus, rbus: FakeBus, server: FakeServer, clock: FakeClock
) -> None:
    await put_membership(rbus, APP, DEP, 1, [])
    reports: list[HandleReport] = []

    async def on_report(msg: Msg) -> None:
        reports.append(decode_as(msg.data, HandleReport))

    await rbus.subscribe(f"fp.v1.report.handle.{APP}.{DEP}", on_report)
    h = await handle(bus, clock)
    try:
        call = asyncio.create_task(h.remote(7))
        for _ in range(100):
            if reports:
                break
            await asyncio.sleep(0.01)
        assert len(reports) == 1, "the cold-start report goes out at once, not after 60 s"
        assert reports[0].queued_requests >= 1 and reports[0].running == {}
        # the report carries the view epoch: 0, as no member value was ever written (an empty
        # membership is the absence of slot keys; epochs live in member values)
        assert reports[0].membership_epoch == h.router.epoch == 0 and reports[0].seq == 1
        # the controller scales up: the waiting request goes through
        await replicas(rbus, clock, "r1", epoch=2)
        assert (await asyncio.wait_for(call, 2))["args"] == [7]
        await asyncio.sleep(0.05)
        assert len(reports) == 1  # then the regular cadence
    finally:
        await h.close()


async def test_back_pressure_and_deadline_while_queued(
    bus: FakeBus, rbus: FakeBus, clock: FakeClock
) -> None:
    await put_membership(rbus, APP, DEP, 1, [])
    cfg = RouterConfig(queue_poll_max_s=0.01, max_queued_requests=2, metrics_interval_s=60.0)
    h = await handle(bus, clock, config=cfg, deadline_s=5.0)
    try:
        waiting = [asyncio.create_task(h.remote()) for _ in range(2)]
        await asyncio.sleep(0.05)
        assert h.router.queued_now == 2
        with pytest.raises(BackPressureError) as bp:
            await h.remote()
        assert bp.value.limit == 2 and bp.value.retryable
        clock.advance(5.0)
        for task in waiting:
            with pytest.raises(DeadlineExceeded):
                await asyncio.wait_for(task, 2)
        assert h.router.queued_now == 0
        c = h.router.counters
        assert (c.arrived, c.rejected, c.timed_out, c.done) == (3, 1, 2, 0)
    finally:
        await h.close()


async def test_completed_requests_are_counted_with_their_replicas_concurrency(
    bus: FakeBus, rbus: FakeBus, clock: FakeClock
) -> None:
    await replicas(rbus, clock, "r1")
    h = await handle(bus, clock)
    try:
        for _ in range(3):
            await h.remote()
        clock.advance(0.25)
        stats = h.router.make_report().stats
        assert stats is not None
        assert (stats.arrived, stats.completed, stats.rejected, stats.timed_out) == (3, 3, 0, 0)
        # one at a time: the replica served each alone (its admission counts the request)
        assert (stats.concurrency_sum, stats.concurrency_sq_sum) == (3, 3)
        assert stats.concurrency_service_s == pytest.approx(stats.service_s)
    finally:
        await h.close()


async def test_the_deployments_max_queued_requests_bounds_the_queue(
    bus: FakeBus, rbus: FakeBus, clock: FakeClock
) -> None:
    (r1,) = await replicas(rbus, clock, "r1")
    r1.reject = True  # at max_ongoing_requests: requests wait in the router's queue
    await put_membership(rbus, APP, DEP, 2, [r1.member], max_queued=1)
    cfg = RouterConfig(queue_poll_max_s=0.01, max_queued_requests=1000, metrics_interval_s=60.0)
    h = await handle(bus, clock, config=cfg, deadline_s=5.0)
    try:
        await until(lambda: h.router.queue_bound[0] == 1)
        waiting = asyncio.create_task(h.remote())
        await until(lambda: h.router.queued_now == 1)
        with pytest.raises(BackPressureError) as bp:
            await h.remote()
        assert bp.value.limit == 1 and bp.value.retryable
        assert "shop.cart" in str(bp.value) and "the deployment's max_queued_requests 1" in str(
            bp.value
        )
        # the deployment drops its bound (-1): the router's own applies again
        await put_membership(rbus, APP, DEP, 3, [r1.member])
        await until(lambda: h.router.queue_bound == (1000, "the router's --max-queued"))
        more = asyncio.create_task(h.remote())
        await until(lambda: h.router.queued_now == 2)
        r1.reject = False
        clock.advance(1.0)  # past the rejection backoff
        assert (await asyncio.wait_for(waiting, 5))["rid"] == "r1"
        assert (await asyncio.wait_for(more, 5))["rid"] == "r1"
    finally:
        await h.close()


async def until(cond: Callable[[], bool], within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def test_deadline_while_admitted(bus: FakeBus, rbus: FakeBus, clock: FakeClock) -> None:
    (r1,) = await replicas(rbus, clock, "r1")
    r1.hang = True
    h = await handle(bus, clock, deadline_s=3.0)
    try:
        call = asyncio.create_task(h.remote())
        await asyncio.sleep(0.1)
        assert not call.done()
        assert r1.probes >= 2  # silence is probed, and the replica answers: keep waiting
        clock.advance(3.0)
        with pytest.raises(DeadlineExceeded):
            await asyncio.wait_for(call, 2)
        assert h.router.chooser.in_flight_total() == 0
    finally:
        await h.close()
        await r1.stop()


async def test_a_reply_lost_in_a_reconnect_is_a_retryable_loss(
    bus: FakeBus, rbus: FakeBus, clock: FakeClock
) -> None:
    """The replica is alive and answers probes, but our connection dropped while the request was
    open: its reply went into the gap. Without this the request waited for ever (a NATS node
    restarted during a rolling upgrade on a real Docker engine)."""
    (r1,) = await replicas(rbus, clock, "r1")
    r1.hang = True
    h = await handle(bus, clock)
    try:
        call = asyncio.create_task(h.remote())
        await asyncio.sleep(0.1)
        assert not call.done() and r1.probes >= 2  # silent and alive: waiting, as it should
        bus.interrupt_streams()
        with pytest.raises(ReplicaLostError) as lost:
            await asyncio.wait_for(call, 2)
        assert lost.value.retryable and "reply was lost" in str(lost.value)
    finally:
        await h.close()
        await r1.stop()


@contextlib.asynccontextmanager
async def busy_replica(
    bus: FakeBus, rbus: FakeBus, clock: FakeClock, **handle_kw: Any
) -> AsyncIterator[tuple[FakeReplica, DeploymentHandle]]:
    """Replica r1, heard on other requests all the time (a busy replica under load), and a
    handle to it; both closed afterwards."""
    (r1,) = await replicas(rbus, clock, "r1")
    h = await handle(bus, clock, **handle_kw)

    async def speaking() -> None:
        while True:
            h.router.liveness.heard("r1")
            await asyncio.sleep(0.002)

    task = asyncio.create_task(speaking())
    try:
        yield r1, h
    finally:
        task.cancel()
        await h.close()
        await r1.stop()


async def test_a_reply_lost_on_the_replicas_side_is_a_retryable_loss(
    bus: FakeBus, rbus: FakeBus, clock: FakeClock
) -> None:
    """The replica admitted the request, finished it, and its reply never came (its own NATS
    connection, or a route between NATS nodes, dropped). It keeps speaking on other requests,
    so it is never probed for being gone; only asking about this request shows it lost. Without
    that the request waited for ever (a NATS node restarted under load on a real engine)."""
    async with busy_replica(bus, rbus, clock) as (r1, h):
        r1.lose_reply = True
        with pytest.raises(ReplicaLostError) as lost:
            await asyncio.wait_for(h.remote(), 5)
        assert lost.value.retryable and "no longer holds the request" in str(lost.value)
        assert r1.asked_not_held == 1


async def test_a_slow_request_the_replica_still_holds_keeps_waiting(
    bus: FakeBus, rbus: FakeBus, clock: FakeClock
) -> None:
    async with busy_replica(bus, rbus, clock, deadline_s=3.0) as (r1, h):
        r1.hang = True
        call = asyncio.create_task(h.remote())
        await until(lambda: r1.probes >= 3)  # asked about the request, three times
        assert not call.done() and r1.asked_not_held == 0
        clock.advance(3.0)
        with pytest.raises(DeadlineExceeded):
            await asyncio.wait_for(call, 2)


async def test_replica_lost_after_admission(bus: FakeBus, rbus: FakeBus, clock: FakeClock) -> None:
    (r1,) = await replicas(rbus, clock, "r1")
    r1.hang = True
    h = await handle(bus, clock)
    try:
        call = asyncio.create_task(h.remote())
        await asyncio.sleep(0.05)
        await r1.stop()
        with pytest.raises(ReplicaLostError) as lost:
            await asyncio.wait_for(call, 2)
        assert lost.value.retryable and lost.value.replica_id == "r1"
    finally:
        await h.close()


async def test_error_reply_and_broken_stream(bus: FakeBus, rbus: FakeBus, clock: FakeClock) -> None:
    from shared.wire.messages import ErrorReply

    (r1,) = await replicas(rbus, clock, "r1")
    h = await handle(bus, clock)
    try:
        r1.error = ErrorReply("user_error", "ValueError: nope", False)
        with pytest.raises(RequestFailed) as failed:
            await h.remote()
        assert (failed.value.code, failed.value.retryable) == ("user_error", False)
        r1.error = None
        r1.garbage_after_admission = True
        with pytest.raises(RequestFailed) as broken:
            await h.remote()
        assert broken.value.code == "bad_response"
        assert h.router.bad_input.total == 1
    finally:
        await h.close()


async def test_handles_share_one_router(bus: FakeBus, rbus: FakeBus, clock: FakeClock) -> None:
    await replicas(rbus, clock, "r1")
    a = await handle(bus, clock)
    b = DeploymentHandle(APP, DEP, bus=bus)
    assert a.router is b.router and a.options(method="m").router is a.router
    await a.close()
    await a.close()  # idempotent: does not release b's reference
    assert not b.router.closed
    assert (await b.remote(1))["args"] == [1]
    await b.close()
    assert b.router.closed
    c = DeploymentHandle(APP, DEP, bus=bus)
    assert c.router is not b.router
    await c.close()


async def test_a_rejected_admission_records_the_replica_health(
    bus: FakeBus, rbus: FakeBus, clock: FakeClock
) -> None:
    """Issue 14 item 7: a rejection still carries the replica's latest health; the router keeps
    it for its reports like any admission's."""
    r1, _ = await replicas(rbus, clock, "r1", "r2")
    r1.reject = True
    r1.healthy = False
    h = await handle(bus, clock, seed=1)
    try:
        for _ in range(5):
            assert (await h.remote())["rid"] == "r2"
            clock.advance(1.0)
            if r1.rejected:
                break
        assert r1.rejected >= 1
        seen = h.router.health.get("r1")
        assert seen is not None and seen.healthy is False
        assert "r1" in {s.replica_id for s in h.router.make_report().health}
    finally:
        await h.close()


async def test_readers_and_frame_pumps_under_concurrency(
    bus: FakeBus, rbus: FakeBus, clock: FakeClock
) -> None:
    """Issue 14 item 7: many streams at once, fast and slow consumers (pumps start for the slow
    ones), some closed early: every stream reads its items in order, frames are folded, and
    nothing is left in flight or pumping."""
    reps = await replicas(rbus, clock, "r1", "r2", "r3")
    for r in reps:
        r.frames = 2
        r.item_delay_s = 0.002
        r.fn = lambda method, args, kwargs: list(range(kwargs["n"]))
    h = await handle(bus, clock)
    readers: list[Any] = []

    async def one(k: int) -> list[int]:
        reader = await open_call(
            h.router,
            method="gen",
            body=encode(CallArgs((), {"n": 8})),
            body_kind="args",
            stream=True,
            deadline_s=None,
        )
        readers.append(reader)
        got: list[int] = []
        try:
            while (chunk := await reader.next_chunk()) is not None:
                got.append(chunk.seq)
                if k % 3 == 0:
                    await asyncio.sleep(0.03)  # slow: the pump takes over reading
                if k % 7 == 6 and len(got) == 3:
                    break  # the caller gives up early
        finally:
            await reader.close()
        return got

    try:
        before = {r.replica_id: r.health().checked_at for r in reps}
        results = await asyncio.gather(*(one(k) for k in range(30)))
        for k, got in enumerate(results):
            assert got == list(range(3 if k % 7 == 6 else 8)), k
        assert any(r.pumping for r in readers)  # the slow consumers' pumps did start
        for reader in readers:
            assert reader._pump_task is None or reader._pump_task.done()
        assert h.router.chooser.in_flight_total() == 0
        for rid, t in before.items():
            seen = h.router.health.get(rid)
            assert seen is not None and seen.checked_at > t
    finally:
        await h.close()


async def test_requests_held_on_one_replica_share_one_probe(
    bus: FakeBus, rbus: FakeBus, clock: FakeClock
) -> None:
    """Eight silent requests on one replica: one plain probe per interval, not eight (each asks
    about its own request only after 3, 6, 12, ... intervals); and a replica that goes away is
    still noticed by every one of them."""
    (r1,) = await replicas(rbus, clock, "r1")
    r1.hang = True
    slow_probe = RouterConfig(
        admission_timeout_s=0.05, liveness_interval_s=0.05, probe_timeout_s=0.5,
        queue_poll_max_s=0.01, metrics_interval_s=60.0,
    )  # fmt: skip
    h = await handle(bus, clock, config=slow_probe)
    try:
        calls = [asyncio.create_task(h.remote()) for _ in range(8)]
        async with asyncio.timeout(5):
            while r1.admitted < 8:  # noqa: ASYNC110
                await asyncio.sleep(0.005)
        start, before = time.monotonic(), r1.probes - r1.asks
        async with asyncio.timeout(10):
            while r1.probes - r1.asks - before < 10:  # noqa: ASYNC110
                await asyncio.sleep(0.005)
        intervals = (time.monotonic() - start) / slow_probe.liveness_interval_s
        # one plain probe per silent interval for all eight (unshared: eight per interval)
        assert r1.probes - r1.asks - before <= 2 * intervals + 2
        # asks at 3, 6, 12, ... silent intervals: about log2(intervals / 3) + 1 per request
        assert r1.asks <= 8 * (math.log2(max(intervals, 3) / 3) + 2)
        assert h.router.liveness.probes_sent == r1.probes
        await r1.stop()
        for call in calls:
            with pytest.raises(ReplicaLostError):
                await asyncio.wait_for(call, 5)
    finally:
        await h.close()


async def test_a_replica_heard_on_another_request_is_not_probed(
    bus: FakeBus, rbus: FakeBus, clock: FakeClock
) -> None:
    (r1,) = await replicas(rbus, clock, "r1")
    r1.hang = True
    # the reader's silent interval is real time: 10x the gap between the messages heard, so a
    # busy machine that delays this loop's sleeps does not make the replica look silent
    config = dataclasses.replace(FAST, liveness_interval_s=0.2)
    h = await handle(bus, clock, config)
    try:
        held = asyncio.create_task(h.remote())
        async with asyncio.timeout(5):
            while r1.admitted < 1:  # noqa: ASYNC110
                await asyncio.sleep(0.005)
        # the replica keeps speaking: each admission (here, of rejected calls) proves it connected
        r1.hang, r1.reject = False, True
        before = r1.probes
        for _ in range(30):
            h.router.liveness.heard("r1")  # what each message from r1 does
            await asyncio.sleep(config.liveness_interval_s / 10)
        assert r1.probes - before <= 1  # at most one already in flight when it started
        assert not held.done()
        held.cancel()
    finally:
        await h.close()
        await r1.stop()


async def test_waiting_requests_go_oldest_first_and_none_is_sent_to_a_full_replica(
    bus: FakeBus, rbus: FakeBus, clock: FakeClock
) -> None:
    (r1,) = await replicas(rbus, clock, "r1")
    r1.max_ongoing = 1
    r1.release = asyncio.Semaphore(0)
    await put_membership(rbus, APP, DEP, 2, [r1.member])
    h = await handle(bus, clock, deadline_s=30.0)
    try:
        await until(lambda: "r1" in h.router.members)
        assert h.router.members["r1"].max_ongoing_requests == 1
        calls = []
        for i in range(5):
            calls.append(asyncio.create_task(h.remote(i)))
            # the first is sent, the others wait in the router's queue in arrival order
            await until(lambda i=i: len(r1.requests) == 1 and h.router.queued_now == i)
        late = None
        for i in range(5):
            r1.release.release()
            if i == 1:
                # a newcomer while the line waits: it goes behind, it does not take the slot
                late = asyncio.create_task(h.remote(99))
            assert (await asyncio.wait_for(calls[i], 5))["args"] == [i]
        assert late is not None
        r1.release.release()
        assert (await asyncio.wait_for(late, 5))["args"] == [99]
        sent = [decode_as(r.body, CallArgs).args for r in r1.requests]
        assert sent == [(0,), (1,), (2,), (3,), (4,), (99,)]
        assert r1.rejected == 0, "the router knew the replica was full: it never sent more"
    finally:
        await h.close()


async def test_a_request_a_replica_refused_keeps_its_place_at_the_front(
    bus: FakeBus, rbus: FakeBus, clock: FakeClock
) -> None:
    # the replica's limit is not in its member value: the router learns it is full by refusals
    (r1,) = await replicas(rbus, clock, "r1")
    r1.release = asyncio.Semaphore(0)
    r1.max_ongoing = 1
    h = await handle(bus, clock, deadline_s=30.0)
    try:
        first = asyncio.create_task(h.remote(0))
        await until(lambda: r1.admitted == 1)
        second = asyncio.create_task(h.remote(1))  # refused, then backs off in the queue
        await until(lambda: r1.rejected >= 1 and h.router.queued_now == 1)
        third = asyncio.create_task(h.remote(2))
        await until(lambda: h.router.queued_now == 2)
        r1.release.release()
        assert (await asyncio.wait_for(first, 5))["args"] == [0]
        r1.release.release()
        assert (await asyncio.wait_for(second, 5))["args"] == [1]
        r1.release.release()
        assert (await asyncio.wait_for(third, 5))["args"] == [2]
    finally:
        await h.close()

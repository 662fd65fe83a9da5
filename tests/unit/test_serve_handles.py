"""What real apps do with handles (fleetpulse/serve/handle.py), against scripted fake replicas:
responses passed as arguments (Ray's semantics), `stream=True` generators iterated with
`async for` and with `for`, and `multiplexed_model_id` reaching the replica."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fleetpulse.serve.handle import DeploymentHandle
from services.router.errors import RequestFailed
from services.router.testing import FakeReplica, put_membership
from shared.fakebus import FakeBus, FakeServer
from shared.wire.messages import ErrorReply
from tests.waiting import eventually as until

APP = "shop"


@pytest.fixture
async def bus() -> AsyncIterator[FakeBus]:
    b = FakeServer().connect("replica")
    yield b
    await b.close()


async def back_end(bus: FakeBus, name: str = "Back") -> FakeReplica:
    replica = await FakeReplica(bus, APP, name, f"{name.lower()}-1").start()

    def fn(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if method == "count":
            return list(range(args[0]))
        if method == "add":
            return sum(args) + sum(kwargs.values())
        return args[0] * 2 if args else None

    replica.fn = fn
    await put_membership(bus, APP, name, 1, [replica.member])
    return replica


def handle(bus: FakeBus, name: str = "Back") -> DeploymentHandle:
    return DeploymentHandle._connect(APP, name, bus, asyncio.get_running_loop())


async def test_top_level_responses_are_resolved_concurrently_before_the_call(
    bus: FakeBus,
) -> None:
    back = await back_end(bus)
    h = handle(bus)
    try:
        back.release = asyncio.Semaphore(0)  # hold every request until both upstreams are in
        first, second = h.double.remote(1), h.double.remote(2)
        total = h.add.remote(first, 10, y=second)
        for _ in range(200):
            if len(back.requests) >= 2:
                break
            await asyncio.sleep(0.01)
        # both upstream calls are in flight at once, and the downstream one is not sent yet
        assert [r.method for r in back.requests] == ["double", "double"]
        back.release.release()
        back.release.release()
        back.release.release()  # the add itself
        assert await total == 2 + 10 + 4
        assert [r.method for r in back.requests] == ["double", "double", "add"]
    finally:
        await back.stop()


async def test_a_failed_upstream_fails_the_call_which_is_never_sent(bus: FakeBus) -> None:
    back = await back_end(bus)
    h = handle(bus)
    try:
        back.error = ErrorReply("user_error", "ValueError: boom", False)
        bad = h.double.remote(1)
        with pytest.raises(RequestFailed, match="boom"):
            await h.add.remote(bad, 1)
        assert [r.method for r in back.requests] == ["double"]
    finally:
        await back.stop()


async def test_nested_responses_and_generators_are_refused_as_ray_does(bus: FakeBus) -> None:
    back = await back_end(bus)
    h = handle(bus)
    try:
        pending = h.double.remote(1)
        with pytest.raises(TypeError, match="argument 0 holds a DeploymentResponse inside a list"):
            await h.add.remote([pending])
        with pytest.raises(
            TypeError, match="argument 'x' holds a DeploymentResponse inside a dict"
        ):
            await h.add.remote(x={"a": [pending]})
        with pytest.raises(TypeError, match="inside a tuple"):
            [i async for i in h.options(stream=True).count.remote((1, pending))]
        gen = h.options(stream=True).count.remote(2)
        with pytest.raises(TypeError, match="DeploymentResponseGenerator"):
            h.add.remote(gen)
        assert await pending == 2
        assert [item async for item in gen] == [0, 1]
        assert [r.method for r in back.requests] == ["double", "count"]  # nothing else was sent
    finally:
        await back.stop()


async def test_a_stream_iterates_with_async_for_and_with_for_from_a_thread(bus: FakeBus) -> None:
    back = await back_end(bus)
    h = handle(bus)
    try:
        streaming = h.options(stream=True)
        assert [i async for i in streaming.count.remote(4)] == [0, 1, 2, 3]
        gen = streaming.count.remote(3)
        for _ in range(200):  # the call starts at remote(), before anyone iterates (as Ray)
            if len(back.requests) >= 2:
                break
            await asyncio.sleep(0.01)
        assert back.requests[-1].stream and back.requests[-1].method == "count"

        def sync_user_code() -> list[int]:  # synchronous user code runs in a worker thread
            return [item for item in gen]

        assert await asyncio.to_thread(sync_user_code) == [0, 1, 2]
        assert [i async for i in gen] == []  # ended: iterating again yields nothing
        with pytest.raises(RuntimeError, match="async for"):
            next(iter(streaming.count.remote(1)))  # `for` on the event loop would block it
    finally:
        await back.stop()


async def test_a_stream_error_reaches_the_iterator(bus: FakeBus) -> None:
    back = await back_end(bus)
    h = handle(bus)
    try:
        back.error = ErrorReply("user_error", "RuntimeError: broke", False)
        with pytest.raises(RequestFailed, match="broke"):
            [i async for i in h.options(stream=True).count.remote(3)]
    finally:
        await back.stop()


async def test_a_stream_can_be_cancelled(bus: FakeBus) -> None:
    back = await back_end(bus)
    h = handle(bus)
    try:
        back.hang = True
        gen = h.options(stream=True).count.remote(3)
        for _ in range(200):
            if back.held:
                break
            await asyncio.sleep(0.01)
        gen.cancel()
        with pytest.raises(asyncio.CancelledError):  # a reader gets the cancellation, no hang
            await asyncio.wait_for(gen.__anext__(), 5)
        router = h._inner.router
        await until(lambda: router.in_flight_now == 0, 5, "the cancelled call released")
    finally:
        await back.stop()


async def test_a_generator_dropped_early_stops_its_call(bus: FakeBus) -> None:
    back = await back_end(bus)
    h = handle(bus)
    try:
        back.item_delay_s = 0.05
        gen = h.options(stream=True).count.remote(1000)
        async for _ in gen:
            break  # the caller wants one item only
        del gen
        gc.collect()
        router = h._inner.router
        await until(lambda: router.in_flight_now == 0, 5, "the dropped stream released")
    finally:
        await back.stop()


async def test_the_multiplexed_model_id_reaches_the_replica(bus: FakeBus) -> None:
    back = await back_end(bus)
    h = handle(bus)
    try:
        assert await h.options(multiplexed_model_id="m7").double.remote(2) == 4
        assert back.requests[-1].multiplexed_model_id == "m7"
        m7 = h.options(multiplexed_model_id="m7")
        assert await m7.options(method_name="double").remote(1) == 2  # kept across options
        assert back.requests[-1].multiplexed_model_id == "m7"
        await m7.options(multiplexed_model_id="").double.remote(1)  # "" clears it
        assert back.requests[-1].multiplexed_model_id is None
        with pytest.raises(TypeError, match="str"):
            h.options(multiplexed_model_id=7)  # type: ignore[arg-type]
    finally:
        await back.stop()


async def test_responses_as_arguments_from_synchronous_user_code(bus: FakeBus) -> None:
    back = await back_end(bus)
    h = handle(bus)
    try:

        def sync_user_code() -> Any:  # a sync method: runs in a worker thread
            return h.add.remote(h.double.remote(3), y=h.double.remote(4)).result(timeout_s=5)

        assert await asyncio.to_thread(sync_user_code) == 6 + 8
    finally:
        await back.stop()

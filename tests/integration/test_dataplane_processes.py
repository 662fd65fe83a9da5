"""The data plane end to end: real replica processes, a real nats-server, a DeploymentHandle.

Membership is written to KV by the test (the controller's job in production).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from services.router.config import RouterConfig
from services.router.errors import DeadlineExceeded, ReplicaLostError, RequestFailed
from services.router.handle import DeploymentHandle, connect_handle
from services.router.testing import Seat, put_membership
from shared.bus import Bus, Msg
from shared.natsbus import NatsBus
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.wire import decode_as
from shared.wire.messages import Heartbeat
from tests.procs import ServiceProcesses, replica_args, service_processes, wait_for_replica

FAST = ["--health-check-period-s", "0.2", "--graceful-shutdown-timeout-s", "10"]


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    b = await NatsBus.connect(nats_url, name="test")
    yield b
    await b.close()


@pytest.fixture
def procs() -> Any:
    with service_processes() as p:
        yield p


async def set_members(bus: Bus, replicas: list[str], epoch: int) -> None:
    """The membership of app.dep becomes `replicas` (slot keys 0.., further ones deleted)."""
    await put_membership(
        bus, "app", "dep", epoch, [Seat(r, S.rpc("app", "dep", r)) for r in replicas]
    )


async def start_replicas(
    procs: ServiceProcesses, bus: Bus, url: str, ids: list[str], extra: list[str] | None = None
) -> dict[str, Any]:
    started = {r: procs.start(replica_args(url, r, extra=[*FAST, *(extra or [])])) for r in ids}
    for r in ids:
        await wait_for_replica(bus, r)
    return started


async def handle_for(bus: Bus, **cfg: Any) -> DeploymentHandle:
    return await connect_handle("app", "dep", bus=bus, config=RouterConfig(**cfg))


async def test_unary_streaming_and_typed_errors(
    procs: ServiceProcesses, bus: Bus, nats_url: str
) -> None:
    await start_replicas(procs, bus, nats_url, ["r1", "r2"])
    await set_members(bus, ["r1", "r2"], 1)
    h = await handle_for(bus)
    try:
        assert await h.options(method="echo").remote({"a": [1, 2]}) == {"a": [1, 2]}
        assert await h.options(method="sync_echo").remote(b"\x00bin") == b"\x00bin"
        items = [i async for i in h.options(method="count").stream(5, delay_s=0.01)]
        assert items == [0, 1, 2, 3, 4]
        with pytest.raises(RequestFailed) as err:
            await h.options(method="fail").remote("boom")
        assert err.value.code == "user_error" and "boom" in err.value.message
        pids = {await h.options(method="pid").remote() for _ in range(20)}
        assert len(pids) == 2  # both replicas serve
    finally:
        await h.close()


async def test_rejections_queue_and_retry_until_capacity_frees(
    procs: ServiceProcesses, bus: Bus, nats_url: str
) -> None:
    await start_replicas(procs, bus, nats_url, ["r1", "r2"], ["--max-ongoing-requests", "1"])
    await set_members(bus, ["r1", "r2"], 1)
    h = await handle_for(bus)
    try:
        start = time.monotonic()
        results = await asyncio.gather(*(h.options(method="sleep").remote(0.4) for _ in range(5)))
        elapsed = time.monotonic() - start
        assert results == [0.4] * 5
        assert elapsed >= 1.1  # 5 requests, 2 slots of 0.4 s: at least three rounds
    finally:
        await h.close()


async def test_deadline(procs: ServiceProcesses, bus: Bus, nats_url: str) -> None:
    await start_replicas(procs, bus, nats_url, ["r1"])
    await set_members(bus, ["r1"], 1)
    h = await handle_for(bus)
    try:
        start = time.monotonic()
        with pytest.raises((DeadlineExceeded, RequestFailed)) as err:
            await h.options(method="sleep", deadline_s=0.3).remote(5)
        if isinstance(err.value, RequestFailed):
            assert err.value.code == "deadline_exceeded"
        assert time.monotonic() - start < 2.0
        assert await h.options(method="echo").remote(1) == 1  # the replica is still fine
    finally:
        await h.close()


async def test_frames_advance_carried_health_past_the_admission(
    procs: ServiceProcesses, bus: Bus, nats_url: str
) -> None:
    await start_replicas(procs, bus, nats_url, ["r1"])
    await set_members(bus, ["r1"], 1)
    h = await handle_for(bus)
    try:
        call = asyncio.create_task(h.options(method="sleep").remote(1.5))
        await asyncio.sleep(0.1)
        at_admission = h.router.health.get("r1")
        assert at_admission is not None
        await call
        after = h.router.health.get("r1")
        assert after is not None
        # checks every ~0.2 s while held: frames carried several newer results
        assert after.checked_at > at_admission.checked_at + 0.8
    finally:
        await h.close()


async def test_heartbeats_suppressed_while_traffic_flows_and_resumed_after(
    procs: ServiceProcesses, bus: Bus, nats_url: str
) -> None:
    beats: list[float] = []

    async def on_beat(msg: Msg) -> None:
        decode_as(msg.data, Heartbeat)
        beats.append(time.monotonic())

    await bus.subscribe(S.report("heartbeat", "app", "dep") + ".*", on_beat)
    await start_replicas(procs, bus, nats_url, ["r1"])  # freshness window max(0.3, 1) = 1 s
    await set_members(bus, ["r1"], 1)
    h = await handle_for(bus)
    try:
        await asyncio.sleep(2.5)
        idle = len(beats)
        assert idle >= 1
        start = time.monotonic()
        while time.monotonic() - start < 3.0:
            await h.options(method="echo").remote(1)
            await asyncio.sleep(0.05)
        end = time.monotonic()
        during = [t for t in beats if start + 0.3 < t < end]
        await asyncio.sleep(2.5)
        after = [t for t in beats if t > end]
        assert during == [], f"{len(during)} heartbeats while admissions carried health"
        assert len(after) >= 1, "heartbeats did not resume after traffic stopped"
    finally:
        await h.close()


async def test_sigkill_mid_request_is_a_retryable_error_and_the_next_goes_elsewhere(
    procs: ServiceProcesses, bus: Bus, nats_url: str
) -> None:
    started = await start_replicas(procs, bus, nats_url, ["r1", "r2"])
    await set_members(bus, ["r1"], 1)
    h = await handle_for(bus)
    try:
        call = asyncio.create_task(h.options(method="sleep").remote(10))
        await asyncio.sleep(0.3)
        started["r1"].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        with pytest.raises(ReplicaLostError) as err:
            await call
        assert err.value.retryable and err.value.replica_id == "r1"
        assert time.monotonic() - killed_at < 3.0
        # the dead replica is still listed: a request never admitted is retried on r2
        await set_members(bus, ["r1", "r2"], 2)
        await asyncio.sleep(0.2)
        for _ in range(5):
            assert await h.options(method="echo").remote("x") == "x"
    finally:
        await h.close()


async def test_sigterm_drains_without_losing_in_flight_requests(
    procs: ServiceProcesses, bus: Bus, nats_url: str
) -> None:
    started = await start_replicas(procs, bus, nats_url, ["r1", "r2"])
    await set_members(bus, ["r1"], 1)
    h = await handle_for(bus)
    try:
        in_flight = [asyncio.create_task(h.options(method="sleep").remote(1.0)) for _ in range(3)]
        await asyncio.sleep(0.3)
        await set_members(bus, ["r1", "r2"], 2)
        started["r1"].send_signal(signal.SIGTERM)
        await asyncio.sleep(0.2)
        # while r1 drains it rejects new work; the router sends it to r2
        assert await h.options(method="echo").remote("new") == "new"
        assert await asyncio.gather(*in_flight) == [1.0, 1.0, 1.0]
        assert await asyncio.to_thread(started["r1"].wait, 10) == 0
    finally:
        await h.close()

"""A reply lost with a NATS node, on real nats-servers: what the router's reader makes of it.

Three routed nodes; the replica is on node 0, the router on node 1. The loss is forced, not
waited for: node 0 is frozen (SIGSTOP), the replica writes a chunk into a socket nobody reads,
node 0 is killed (its unread input dies with it), and once the replica's client has seen the
disconnect it sends the rest, which nats-py holds until it reconnects to another node and then
delivers. That is the shape a `docker restart` of a node under load produced (an `end` without
its chunk 0); the reader must call it a loss (docs/dataplane.md, "Lost in transit").
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgpack
import pytest

from services.router.config import RouterConfig
from services.router.errors import ResponseLostError
from services.router.handle import DeploymentHandle, connect_handle
from services.router.testing import Seat, put_membership
from shared.bus import Msg
from shared.natsbus import NatsBus
from shared.natsserver import NatsCluster
from shared.subjects import DEFAULT_SUBJECTS
from shared.wire.codec import decode_as, encode
from shared.wire.messages import Admission, Chunk, End, HealthStatus, Request, WireMessage

APP, DEP, RID = "shop", "lossy", "r1"
# long liveness intervals: the request is silent while the test takes node 0 down
CONFIG = RouterConfig(admission_timeout_s=2.0, liveness_interval_s=10.0, metrics_interval_s=60.0)


async def until(cond: Callable[[], bool], what: str, within_s: float = 20.0) -> None:
    deadline = time.monotonic() + within_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within_s} s: {what}")
        await asyncio.sleep(0.01)


def process_state(pid: int | None) -> str:
    """The state letter of /proc/<pid>/stat ("T": stopped by a signal)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return "?"


class StepReplica:
    """Admits each request, then sends only what the test tells it to, when it tells it."""

    def __init__(self, bus: NatsBus) -> None:
        self.bus = bus
        self.subject = DEFAULT_SUBJECTS.rpc(APP, DEP, RID)
        self.replies: asyncio.Queue[str] = asyncio.Queue()

    async def start(self) -> StepReplica:
        await self.bus.subscribe(self.subject, self._on_rpc)
        await self.bus.flush()
        return self

    async def _on_rpc(self, msg: Msg) -> None:
        decode_as(msg.data, Request)
        assert msg.reply
        health = HealthStatus(RID, True, time.time(), 0)
        await self.send(msg.reply, Admission(True, 1, health, False))
        await self.bus.flush()
        self.replies.put_nowait(msg.reply)

    async def send(self, reply: str, message: WireMessage) -> None:
        await self.bus.publish(reply, encode(message))


@pytest.fixture
async def opened() -> AsyncIterator[list[NatsBus]]:
    buses: list[NatsBus] = []
    yield buses
    for bus in buses:
        await bus.close()


async def setup(
    cluster: NatsCluster, opened: list[NatsBus]
) -> tuple[StepReplica, DeploymentHandle]:
    node0, node1, _ = cluster.servers
    rbus = await NatsBus.connect(node0.url, name="replica", reconnect_wait=0.1)
    opened.append(rbus)
    replica = await StepReplica(rbus).start()
    await put_membership(rbus, APP, DEP, 1, [Seat(RID, replica.subject)])
    router_bus = await NatsBus.connect(node1.url, name="router", reconnect_wait=0.1)
    opened.append(router_bus)
    return replica, await connect_handle(APP, DEP, bus=router_bus, config=CONFIG)


async def lose_with_node0(
    cluster: NatsCluster, replica: StepReplica, reply: str, lost: Chunk
) -> None:
    """`lost` goes into node 0's socket while node 0 is frozen; then node 0 dies."""
    node0, nc = cluster.servers[0], replica.bus.nc
    assert node0.pid is not None
    reconnects = nc.stats["reconnects"]
    os.kill(node0.pid, signal.SIGSTOP)
    try:
        # kill() returns before the signal takes hold: on another core node 0 may still read
        # (and forward) what comes next for a moment; wait until the kernel says it is stopped
        await until(lambda: process_state(node0.pid) == "T", "node 0 stopped")
        await replica.send(reply, lost)
        # written out of nats-py's buffer into the socket (private: nats-py < 3)
        await until(lambda: nc._pending_data_size == 0, "the chunk written")
    finally:
        cluster.kill(0)  # SIGKILL reaches a stopped process; its unread input is dropped
    # what the replica sends from here on is held while it reconnects, or goes to its new node
    await until(
        lambda: not nc.is_connected or nc.stats["reconnects"] > reconnects,
        "the replica's client sees its connection gone",
    )


async def test_a_unary_result_lost_with_a_nats_node_is_a_retryable_loss(
    nats_cluster: NatsCluster, opened: list[NatsBus]
) -> None:
    replica, h = await setup(nats_cluster, opened)
    try:
        call = asyncio.create_task(h.remote())
        reply = await asyncio.wait_for(replica.replies.get(), 20)
        await until(lambda: h.router.health.get(RID) is not None, "the admission read")
        await lose_with_node0(nats_cluster, replica, reply, Chunk(0, msgpack.packb("result")))
        await replica.send(reply, End(1))  # held by nats-py, delivered after the reconnect
        with pytest.raises(ResponseLostError) as lost:
            await asyncio.wait_for(call, 30)
        assert lost.value.retryable and "chunk 0 of 1 never arrived" in str(lost.value)
        assert replica.bus.nc.is_connected  # the end did come, through another node
    finally:
        await h.close()


async def test_a_stream_that_lost_its_tail_with_a_nats_node_is_a_loss_not_a_short_result(
    nats_cluster: NatsCluster, opened: list[NatsBus]
) -> None:
    replica, h = await setup(nats_cluster, opened)
    try:
        items = h.options(method="gen").stream()

        async def next_item() -> Any:
            return await anext(items)

        first = asyncio.create_task(next_item())
        reply = await asyncio.wait_for(replica.replies.get(), 20)
        await replica.send(reply, Chunk(0, msgpack.packb("one")))
        assert await asyncio.wait_for(first, 20) == "one"
        await lose_with_node0(nats_cluster, replica, reply, Chunk(1, msgpack.packb("two")))
        await replica.send(reply, End(2))
        with pytest.raises(ResponseLostError, match="chunk 1 of 2 never arrived"):
            await asyncio.wait_for(next_item(), 30)
    finally:
        await h.close()

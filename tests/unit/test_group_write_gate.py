"""A member writes control state only while its leases are certainly its own: within half a
member TTL of a heartbeat it sent, and, after a gap in its heartbeats (a pause), only once its
leases were read back as its own. A paused owner's queued writes wait, and are then dropped with
the partition it lost (the service checks the epoch after `writable`)."""

from __future__ import annotations

import asyncio

from services.controller.group import GroupCore, Lease
from services.controller.group_shell import GroupRunner
from shared.clock import FakeClock
from shared.fakebus import FakeServer
from shared.kv import envelope
from shared.kv.group import PartitionLease, lease_key
from shared.subjects import KV_CONTROLLERS

TTL = 2.0


async def runner() -> tuple[GroupRunner, FakeClock]:
    clock = FakeClock()
    bus = FakeServer(clock=clock).connect()

    async def nothing(*_: object) -> None:
        return None

    r = GroupRunner(
        bus, GroupCore("me", 2, TTL), nothing, nothing, heartbeat_s=0.01,
        describe=dict, clock=clock,
    )  # fmt: skip
    r.members_kv = await bus.kv(KV_CONTROLLERS, ttl=TTL * 2)
    r.leases_kv = await bus.kv("fp_leases")
    rev = await r.leases_kv.create(lease_key(0), envelope.encode(PartitionLease("me", 7)))
    r.core.took(Lease(0, "me", 7, rev))
    return r, clock


async def returns(coro: object, within_s: float = 0.2) -> bool:
    try:
        await asyncio.wait_for(coro, within_s)  # type: ignore[arg-type]
    except TimeoutError:
        return False
    return True


async def test_writes_flow_while_heartbeats_do_and_wait_after_a_pause() -> None:
    r, clock = await runner()
    assert not await returns(r.writable())  # no heartbeat sent yet
    await r._beat()
    assert await returns(r.writable())
    clock.advance(TTL / 2)  # no heartbeat for half a TTL: another member may soon take over
    assert not await returns(r.writable())
    await r._beat()  # a gap: the leases are read back first, and they are still ours
    assert await returns(r.writable())


async def test_after_a_pause_a_lost_lease_keeps_writes_waiting() -> None:
    r, clock = await runner()
    await r._beat()
    clock.advance(5.0)  # paused past the TTL: "other" took partition 0 over
    entry = await r.leases_kv.get(lease_key(0))
    assert entry is not None
    await r.leases_kv.update(
        lease_key(0), envelope.encode(PartitionLease("other", 8)), entry.revision
    )
    await r._beat()  # our heartbeat lands again, but the lease is not ours any more
    assert not await returns(r.writable())
    assert r.core.leases[0].owner == "other"  # the core's plan now lets partition 0 go
    lost = [a.partition for a in r.core.plan(clock.monotonic()) if type(a).__name__ == "Lose"]
    assert lost == [0]

"""The controller group's KV documents end to end on the fake bus: a member's heartbeat entry is a
`controller_member` document that `fleetpulse status` reads back, and its leases are `lease`
documents."""

from __future__ import annotations

from services.controller.group import GroupCore, Lease
from services.controller.group_shell import KV_LEASES, GroupRunner
from services.ops.group_view import GroupView, read_group
from shared.clock import FakeClock
from shared.fakebus import FakeServer
from shared.kv import envelope
from shared.kv.group import ControllerMember, PartitionLease, lease_key
from shared.subjects import KV_CONTROLLERS
from tests.waiting import eventually

PARTITIONS = 4


async def test_member_entry_and_leases_are_documents() -> None:
    server = FakeServer()

    async def on_take(p: int, epoch: int) -> None:
        return None

    async def on_drop(p: int) -> None:
        return None

    runner = GroupRunner(
        server.connect("m1"),
        GroupCore("m1", PARTITIONS, 2.0),
        on_take,
        on_drop,
        heartbeat_s=0.01,
        describe=lambda: {"partitions": [3, 1], "pending": 7, "apps": 2, "future": True},
        clock=FakeClock(),
    )
    await runner.start()
    try:
        await eventually(lambda: len(runner.core.owned) == PARTITIONS, 5, "owns every partition")
        reader = server.connect("status")
        entry = await (await reader.kv(KV_CONTROLLERS)).get("m1")
        assert entry is not None
        member = envelope.decode(entry.value, ControllerMember)
        assert member == ControllerMember("m1", (1, 3), pending=7, apps=2)
        group = await read_group(reader)
        assert group.to_json() == {"m1": {"partitions": [1, 3], "pending": 7}}
        assert group.leases == {p: PartitionLease("m1", 1) for p in range(PARTITIONS)}
        lease = await (await reader.kv(KV_LEASES)).get(lease_key(0))
        assert lease is not None
        assert envelope.decode(lease.value, PartitionLease) == PartitionLease("m1", 1)
        assert Lease.decode(0, lease.value, lease.revision) == Lease(0, "m1", 1, lease.revision)
    finally:
        await runner.step_down()


async def test_status_skips_a_member_entry_that_is_not_a_document() -> None:
    bus = FakeServer().connect("status")
    kv = await bus.kv(KV_CONTROLLERS)
    await kv.put("old", b'{"v":1,"kind":"controller","partitions":[0]}')
    await kv.put("new", envelope.encode(ControllerMember("new", (2,))))
    leases = await bus.kv(KV_LEASES)
    await leases.put(lease_key(1), b"not a lease")
    await leases.put("other", envelope.encode(PartitionLease("new", 2)))
    await leases.put(lease_key(2), envelope.encode(PartitionLease("new", 4)))
    assert await read_group(bus) == GroupView(
        {"new": ControllerMember("new", (2,))}, {2: PartitionLease("new", 4)}
    )

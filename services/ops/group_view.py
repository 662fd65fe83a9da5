"""Who looks after which app: the controller group as `fleetpulse status` reads it.

How it works: a status document (fp_status) names the partition its writer held the app under
and the lease epoch it held it at. The status is looked after while that partition's lease
(fp_leases) still has that epoch and names a member whose entry is in fp_controllers: members
re-put their entry every heartbeat and the bucket's TTL drops a silent member's entry, so an
entry that is there is a live member. The controller does not rewrite unchanged statuses, so a
status's age says when it last changed, not whether anyone is watching. A status from an
older controller (no partition) is judged by its age, as those controllers rewrote every few
seconds. Reading is a snapshot of each bucket; judging (`unattended`) is pure.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.bus import Bus
from shared.errors import WireError
from shared.kv import buckets, envelope
from shared.kv.group import ControllerMember, PartitionLease, lease_partition
from shared.kv.status import AppStatusView
from shared.kvfollow import existing_kv

GROUP_READ_S = 1.0
"""How often a watching reader reads the group again."""
LEGACY_STALE_AFTER_S = 30.0
"""A status without a partition (an older controller, which rewrote every 2 s) older than this
was not refreshed."""


@dataclass(frozen=True, slots=True)
class GroupView:
    """The controller group as read: live members by id, and partition leases."""

    members: Mapping[str, ControllerMember] = field(default_factory=dict)
    leases: Mapping[int, PartitionLease] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """member -> {partitions, pending}: the `controllers` part of `status --json`."""
        return {
            k: {"partitions": list(m.partitions), "pending": m.pending}
            for k, m in sorted(self.members.items())
        }


def unattended(view: AppStatusView, group: GroupView, now: float) -> str | None:
    """Why no live controller looks after this status, or None when one does. `now` (unix s)
    only dates a status of an older controller."""
    p = view.partition
    if p is None:
        age = now - view.updated_at
        return None if age <= LEGACY_STALE_AFTER_S else f"not refreshed for {age:.0f}s"
    lease = group.leases.get(p)
    if lease is None or lease.free:
        return f"partition {p} has no owner"
    if lease.owner not in group.members:
        return f"partition {p}'s owner {lease.owner} is gone"
    if lease.epoch != view.owner_epoch:
        return f"partition {p} changed hands: {lease.owner} has not written this status yet"
    return None


async def read_group(bus: Bus) -> GroupView:
    """Snapshots of fp_controllers and fp_leases; a value that is not a document of its bucket
    is left out (as is a bucket not created yet)."""
    members: dict[str, ControllerMember] = {}
    leases: dict[int, PartitionLease] = {}
    kv = await existing_kv(bus, buckets.CONTROLLERS.name)
    for entry in await kv.snapshot([">"]) if kv is not None else []:
        try:
            members[entry.key] = envelope.decode(entry.value, ControllerMember)
        except WireError:
            continue
    kv = await existing_kv(bus, buckets.LEASES.name)
    for entry in await kv.snapshot([">"]) if kv is not None else []:
        p = lease_partition(entry.key)
        if p is None:
            continue
        try:
            leases[p] = envelope.decode(entry.value, PartitionLease)
        except WireError:
            continue
    return GroupView(members, leases)


class GroupReads:
    """The group for `status --watch`, read again at most every GROUP_READ_S: a snapshot (an
    expired member entry is simply absent from it, where a watch would never hear of the
    expiry), not one per refresh of a fast `--interval`."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.group = GroupView()
        self._read_at = -math.inf

    async def current(self) -> GroupView:
        if time.monotonic() - self._read_at >= GROUP_READ_S:
            self.group = await read_group(self.bus)
            self._read_at = time.monotonic()
        return self.group


def group_notes(group: GroupView) -> list[str]:
    if not group.members:
        return ["controller group: no member announced itself (is a controller running?)"]
    lines = [f"controller group: {len(group.members)} member(s)"]
    for member_id, m in sorted(group.members.items()):
        parts = list(m.partitions)
        lines.append(
            f"  {member_id}: {len(parts)} partition(s) {parts}, {m.pending} report(s) behind"
        )
    return lines

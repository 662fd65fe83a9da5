"""The controller group's documents: partition leases (KV `fp_leases`) and member entries
(KV `fp_controllers`). The rules that use them are in services/controller/group.py.

- `fp_leases`, key `p{partition}`: `PartitionLease` {owner, epoch}. Owner "" means free (handed
  over). Every write is revision-checked (create when absent, else update at the revision read),
  and taking a lease bumps `epoch`, which then fences every value the owner writes for the
  partition's apps (`owner_epoch`). Writers and readers: the controllers; `fleetpulse status`.
- `fp_controllers`, key `{member_id}`: `ControllerMember`, re-put every heartbeat; the bucket's
  TTL (a few member TTLs) ages out a member that died. Liveness is judged by who put when (local
  receipt time), not by the value: the value says what the member does, for `fleetpulse status`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from shared.errors import WireError
from shared.kv import envelope as e
from shared.wire import reasons

MAX_PARTITIONS = 4096
"""More partitions than any group runs: bounds a member entry."""


def lease_key(partition: int) -> str:
    return f"p{partition}"


def lease_partition(key: str) -> int | None:
    """The partition of a lease key, or None when `key` is not one."""
    if key.startswith("p") and key[1:].isdigit():
        return int(key[1:])
    return None


@dataclass(frozen=True, slots=True)
class PartitionLease:
    """Who owns a partition of FP_REPORTS, and at which epoch (the KV revision is not in it)."""

    KIND: ClassVar[str] = "lease"
    owner: str
    """The owning member's id; "" when the partition is free."""
    epoch: int

    @property
    def free(self) -> bool:
        return self.owner == ""

    def to_doc(self) -> dict[str, Any]:
        return {"owner": self.owner, "epoch": self.epoch}

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> PartitionLease:
        return cls(owner=e.string(doc, "owner"), epoch=e.count(doc, "epoch"))


@dataclass(frozen=True, slots=True)
class ControllerMember:
    """What one controller member announces: the partitions it processes, how many reports it
    has still to process, and how many apps it looks after."""

    KIND: ClassVar[str] = "controller_member"
    member_id: str
    partitions: tuple[int, ...] = ()
    pending: int = 0
    apps: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "partitions", tuple(sorted(self.partitions)))

    def to_doc(self) -> dict[str, Any]:
        return {
            "member_id": self.member_id,
            "partitions": list(self.partitions),
            "pending": self.pending,
            "apps": self.apps,
        }

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> ControllerMember:
        member_id = e.string(doc, "member_id")
        if not member_id:
            raise WireError(reasons.BAD_VALUE, "controller_member.member_id is empty")
        raw = e.listing(doc, "partitions", default_empty=True)
        if len(raw) > MAX_PARTITIONS:
            raise WireError(
                reasons.BAD_VALUE, f"controller_member lists > {MAX_PARTITIONS} partitions"
            )
        partitions = tuple(e.whole(p, "controller_member.partitions[]") for p in raw)
        return cls(
            member_id=member_id,
            partitions=partitions,
            pending=e.count(doc, "pending", 0),
            apps=e.count(doc, "apps", 0),
        )

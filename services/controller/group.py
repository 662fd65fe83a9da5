"""The controller as a consumer group: which member owns which partition of FP_REPORTS.

How it works (every rule below is enforced by NATS KV compare-and-set, not by trust):
- Each member re-puts its entry in KV `fp_controllers` every `heartbeat_s`. A member is live while
  its last put was seen, by local receipt time, within `member_ttl_s`; a deleted entry (clean
  shutdown) means gone at once.
- The wanted owner of partition p is `sorted(live members)[p % M]`: every member computes the same
  map from the same view, and each owns floor(P/M) or ceil(P/M) partitions.
- Ownership is a lease key `p{N}` in KV `fp_leases` holding {owner, epoch}. A member takes a
  partition with a revision-checked write (create, or update at the revision it read) that bumps
  the epoch, and only when the lease is free (no key, or owner "") or its owner is not live. It
  hands a partition over by writing owner "" at the same epoch after it stopped processing it.
  Two members can never both succeed at one revision, so ownership is exclusive.
- A lease that names another owner while we think we hold it means we lost it (we were paused
  past our TTL and a successor took over): stop processing it at once, write nothing.
- The epoch fences every KV value the owner writes for the partition's apps (see fenced.py).

Pure: `plan(now)` turns the current view into Take / Release / Lose decisions for the shell.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from shared import settings
from shared.kv import envelope
from shared.kv.group import PartitionLease
from shared.kv.group import lease_key as lease_key  # the key shape is the contract's
from shared.kv.group import lease_partition as lease_partition

DEFAULT_HEARTBEAT_S: float = settings.CONTROLLER_HEARTBEAT.default
DEFAULT_MEMBER_TTL_S: float = settings.CONTROLLER_MEMBER_TTL.default


@dataclass(frozen=True, slots=True)
class Lease:
    """A partition's lease as read: its document (shared.kv.group) and the KV revision it was
    read at, which the next compare-and-set is checked against."""

    partition: int
    owner: str
    epoch: int
    revision: int

    def encode(self) -> bytes:
        return envelope.encode(PartitionLease(self.owner, self.epoch))

    @staticmethod
    def decode(partition: int, value: bytes, revision: int) -> Lease:
        """Raises WireError (with the reason) when `value` is not a lease document."""
        doc = envelope.decode(value, PartitionLease)
        return Lease(partition, doc.owner, doc.epoch, revision)


@dataclass(frozen=True, slots=True)
class Take:
    partition: int
    lease: Lease | None
    """The lease as read (None: no key yet): the write is checked against its revision."""


@dataclass(frozen=True, slots=True)
class Release:
    partition: int
    lease: Lease


@dataclass(frozen=True, slots=True)
class Lose:
    partition: int


GroupAction = Take | Release | Lose


@dataclass(slots=True)
class GroupCore:
    member_id: str
    partitions: int
    member_ttl_s: float = DEFAULT_MEMBER_TTL_S
    members: dict[str, float] = field(default_factory=dict)
    leases: dict[int, Lease] = field(default_factory=dict)
    owned: dict[int, int] = field(default_factory=dict)
    """Partitions this member processes now -> the epoch it holds them at."""

    def member_seen(self, member_id: str, now: float) -> None:
        self.members[member_id] = now

    def member_left(self, member_id: str) -> None:
        self.members.pop(member_id, None)

    def lease_seen(self, lease: Lease) -> None:
        held = self.leases.get(lease.partition)
        if held is None or lease.revision >= held.revision:
            self.leases[lease.partition] = lease

    def lease_deleted(self, partition: int) -> None:
        self.leases.pop(partition, None)

    def live(self, now: float) -> list[str]:
        return sorted(m for m, seen in self.members.items() if now - seen < self.member_ttl_s)

    def wanted(self, now: float) -> dict[int, str]:
        live = self.live(now)
        if not live:
            return {}
        return {p: live[p % len(live)] for p in range(self.partitions)}

    def plan(self, now: float) -> list[GroupAction]:
        live = set(self.live(now))
        if self.member_id not in live:
            # we are not (yet, or any more) a visible member: own nothing
            return [Lose(p) for p in sorted(self.owned)]
        wanted = self.wanted(now)
        out: list[GroupAction] = []
        for p in range(self.partitions):
            lease = self.leases.get(p)
            mine = lease is not None and lease.owner == self.member_id
            if p in self.owned and not mine:
                out.append(Lose(p))  # a successor holds it: stop at once
                continue
            if mine and lease is not None and wanted.get(p) != self.member_id:
                out.append(Release(p, lease))
            elif p not in self.owned and wanted.get(p) == self.member_id:
                # ours in KV but let go here (a refresh that failed): take it again, at a new
                # epoch, or the partition is never processed again while we live
                free = mine or lease is None or lease.owner == "" or lease.owner not in live
                if free:
                    out.append(Take(p, lease))
        return out

    def took(self, lease: Lease) -> None:
        self.leases[lease.partition] = lease
        self.owned[lease.partition] = lease.epoch

    def released(self, partition: int) -> None:
        self.owned.pop(partition, None)

    def assignment(self) -> dict[int, str]:
        """partition -> owner as the leases say (for `fleetpulse status`)."""
        return {p: lease.owner for p, lease in sorted(self.leases.items())}


def fnv1a_32(data: bytes) -> int:
    """The hash nats-server's `partition()` mapping uses (FNV-1a, 32 bit)."""
    h = 0x811C9DC5
    for b in data:
        h ^= b
        h = (h * 0x01000193) & 0xFFFFFFFF
    return h


@functools.lru_cache(maxsize=1 << 16)
def partition_of(app: str, partitions: int) -> int:
    """The FP_REPORTS partition of an app, exactly as the stream's subject transform computes it.
    Cached: the service asks per KV write and per heartbeat for every app (the hash is a Python
    loop over the name's bytes; at 10,000 apps those asks were 2% of the controller's CPU)."""
    return fnv1a_32(app.encode()) % partitions

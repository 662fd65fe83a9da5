"""One deployment's keys in fp_targets and fp_membership, kept in line with its replicas by delta.

How it works: `DeploymentState` notes which replica records changed since the last tick (any
field set, a record added or removed). `KVDelta.changes(...)` looks at those records only and
says what each now needs:

    a target    while it is not draining               -> key {agent}.{app}.{deployment}.{slot}
                (no agent chosen yet: `_unplaced` instead of the agent id)
    a member    while it is RUNNING without a verdict       -> key {app}.{deployment}.{slot}

and returns the puts and deletes that bring the written keys to that, so one replaced replica
costs a handful of small writes and O(1) work, whatever the size of the deployment.

A replica holds a slot (a small integer, the lowest free one) while it needs either key; a freed
slot is given to the next replica, so a deployment's keys are bounded by its largest size, never
by how many replicas it ever had. Releases are handled before acquisitions, so a slot freed and
taken in the same tick is one put (the writer keeps only the newest value per key). The
membership epoch grows once per tick in which any member changed; each member value carries the
epoch it was written at, and the deployment's report interval (`metrics_interval_s`, which its
routers report at): a change of that setting rewrites every member, once.

Pure: no I/O, no clock. `restore` takes over what a previous owner wrote.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from shared.kv import buckets
from shared.kv.membership import Member, member_key
from shared.kv.targets import ReplicaTarget, target_key
from shared.replicaspec import ReplicaSpec

from .deployment_state import ReplicaRecord, ReplicaState


@dataclass(frozen=True, slots=True)
class PutDoc:
    bucket: str
    key: str
    doc: ReplicaTarget | Member


@dataclass(frozen=True, slots=True)
class DeleteDoc:
    bucket: str
    key: str


KVChange = PutDoc | DeleteDoc
RpcFor = Callable[[str], str]
_Written = tuple[int, str, float | None, int | None, int | None, str | None]


class KVDelta:
    __slots__ = (
        "_free", "_next_slot", "_restamp", "_specs", "app", "deployment", "max_queued_requests",
        "members", "report_interval_s", "slots", "targets",
    )  # fmt: skip

    def __init__(self, app: str, deployment: str) -> None:
        self.app = app
        self.deployment = deployment
        self.slots: dict[str, int] = {}
        """Replica id -> its slot, while it needs a key."""
        self.targets: dict[str, str] = {}
        """Replica id -> the fp_targets key written for it."""
        self.members: dict[str, _Written] = {}
        """Replica id -> (slot, rpc subject, report interval, queue bound, its max ongoing, its
        http address) written to fp_membership."""
        self._free: list[int] = []
        self._next_slot = 0
        self._specs: dict[str, ReplicaSpec] = {}
        """Version -> spec: a replica is started with its own version's settings."""
        self.report_interval_s: float | None = None
        self.max_queued_requests: int | None = None
        self._restamp = False

    def set_spec(self, version: str, spec: ReplicaSpec) -> None:
        """The current version's settings (its metrics interval is the deployment's)."""
        self._specs[version] = spec
        if spec.metrics_interval_s != self.report_interval_s:
            self.report_interval_s = spec.metrics_interval_s
            self._restamp = True

    def set_queue_bound(self, bound: int | None) -> None:
        """The deployment's `max_queued_requests` for its routers (None: theirs)."""
        if bound != self.max_queued_requests:
            self.max_queued_requests = bound
            self._restamp = True

    def take_restamp(self) -> list[str]:
        """After a change of the report interval, once: every member (to be looked at again)."""
        if not self._restamp:
            return []
        self._restamp = False
        return list(self.members)

    @property
    def slot_count(self) -> int:
        """The deployment's largest size so far: keys never exceed it."""
        return self._next_slot

    def changes(
        self,
        records: Mapping[str, ReplicaRecord],
        dirty: Iterable[str],
        *,
        rpc_for: RpcFor,
        epoch: int,
    ) -> tuple[list[KVChange], bool]:
        """The writes for the `dirty` replicas, and whether the member set changed (the caller
        then bumps the epoch: `epoch` is the one the new member values carry)."""
        out: list[KVChange] = []
        wants: list[tuple[str, ReplicaRecord | None, bool, bool]] = []
        for rid in dirty:
            rec = records.get(rid)
            target = rec is not None and rec.state is not ReplicaState.DRAINING
            member = rec is not None and rec.state is ReplicaState.RUNNING and not rec.verdict
            wants.append((rid, rec, target, member))
        members_changed = False
        # releases first: a slot freed this tick can be taken by a replica of this tick
        for rid, _, target, member in wants:
            if not target and rid in self.targets:
                out.append(DeleteDoc(buckets.TARGETS.name, self.targets.pop(rid)))
            if not member and rid in self.members:
                slot = self.members.pop(rid)[0]
                out.append(
                    DeleteDoc(buckets.MEMBERSHIP.name, member_key(self.app, self.deployment, slot))
                )
                members_changed = True
            if not target and not member and rid in self.slots:
                heapq.heappush(self._free, self.slots.pop(rid))
        for rid, rec, target, member in wants:
            if rec is None or not (target or member):
                continue
            slot = self._slot(rid)
            rpc = rec.rpc_subject or rpc_for(rid)
            # a target is written when its key (agent, slot) changes; the document is built
            # only then (a record changes several times while it starts: no doc each time)
            key = target_key(rec.agent_id, self.app, self.deployment, slot) if target else None
            if key is not None and self.targets.get(rid) != key:
                old = self.targets.get(rid)
                if old is not None:
                    out.append(DeleteDoc(buckets.TARGETS.name, old))
                self.targets[rid] = key
                out.append(PutDoc(buckets.TARGETS.name, key, self._target(rec, slot, rpc)))
            spec = self._specs.get(rec.version)
            ongoing = spec.max_ongoing_requests if spec is not None else None
            http = rec.http_address or None
            written = (slot, rpc, self.report_interval_s, self.max_queued_requests, ongoing, http)
            if member and self.members.get(rid) != written:
                self.members[rid] = written
                m = Member(
                    self.app, self.deployment, slot, rid, rpc, rec.order, epoch,
                    report_interval_s=self.report_interval_s,
                    max_queued_requests=self.max_queued_requests,
                    max_ongoing_requests=ongoing,
                    http_address=http,
                )  # fmt: skip
                out.append(PutDoc(buckets.MEMBERSHIP.name, m.key, m))
                members_changed = True
        return _coalesce(out), members_changed

    def _slot(self, rid: str) -> int:
        slot = self.slots.get(rid)
        if slot is None:
            if self._free:
                slot = heapq.heappop(self._free)
            else:
                slot, self._next_slot = self._next_slot, self._next_slot + 1
            self.slots[rid] = slot
        return slot

    def _target(self, rec: ReplicaRecord, slot: int, rpc: str) -> ReplicaTarget:
        spec = self._specs[rec.version]
        return ReplicaTarget(
            self.app, self.deployment, rec.replica_id, rec.agent_id, slot, rec.order,
            rec.version, rpc, spec, devices=rec.devices,
        )  # fmt: skip

    def spec_of(self, version: str) -> ReplicaSpec | None:
        """The settings replicas of `version` are started with (None: a version not known)."""
        return self._specs.get(version)

    # -- takeover ----------------------------------------------------------------------------

    def restore(self, targets: Iterable[ReplicaTarget], members: Iterable[Member]) -> None:
        """What a previous owner wrote becomes what we have written (slots included)."""
        for t in targets:
            self.slots[t.replica_id] = t.slot
            self.targets[t.replica_id] = t.key
            self._specs.setdefault(t.version, t.spec)
        for m in members:
            if self.slots.setdefault(m.replica_id, m.slot) == m.slot:
                self.members[m.replica_id] = (
                    m.slot, m.rpc_subject, m.report_interval_s, m.max_queued_requests,
                    m.max_ongoing_requests, m.http_address,
                )  # fmt: skip
        used = set(self.slots.values())
        self._next_slot = max(used, default=-1) + 1
        self._free = sorted(set(range(self._next_slot)) - used)

    def stray_members(self, members: Iterable[Member]) -> list[KVChange]:
        """Member keys found in KV that no replica we know holds: deletes (a slot's key must
        never name a replica the owner does not run)."""
        mine = {written[0] for written in self.members.values()}
        return [DeleteDoc(buckets.MEMBERSHIP.name, m.key) for m in members if m.slot not in mine]


def _coalesce(changes: list[KVChange]) -> list[KVChange]:
    """The last change per key, in the order of their last occurrence (what the writer keeps)."""
    last: dict[tuple[str, str], KVChange] = {}
    for c in changes:
        last.pop((c.bucket, c.key), None)
        last[(c.bucket, c.key)] = c
    return list(last.values())

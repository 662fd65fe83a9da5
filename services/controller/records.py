"""Replica records, the log of which of them changed, and their classes kept up to date by delta.

How it works: a `ReplicaRecord` counts every assignment to any of its fields on its deployment's
`Revision`, and adds its id to every change channel opened on it (`Revision.channel()`). Each
consumer of the records (the classes below, the KV delta, the index that feeds health and
metrics) owns one channel and looks only at the ids in it, so one changed replica costs O(1)
work, not a pass over the deployment.

`RecordSets` is one such consumer: which records are live (not draining), waiting (PENDING or
STARTING), running, of an old version, and the counts the status and the policy read. Each
record's last contribution is remembered, so an update subtracts it and adds the new one; a record
stays in a set it still belongs to (its position there is kept). A change of the deployment's
version re-sorts old from new once (a rollout), a pass that happens once per rollout.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


class ReplicaState(enum.Enum):
    PENDING = "PENDING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    DRAINING = "DRAINING"
    GONE = "GONE"
    """The record was removed (lifecycle.py's end state): no record holds it."""


class Revision:
    """A counter of changes to one deployment's records (shared by the records), and the change
    channels: each a set of the ids changed since its owner last took them."""

    __slots__ = ("channels", "n")

    def __init__(self) -> None:
        self.n = 0
        self.channels: list[set[str]] = []

    def channel(self) -> set[str]:
        ch: set[str] = set()
        self.channels.append(ch)
        return ch

    def touched(self, replica_id: str) -> None:
        self.n += 1
        for ch in self.channels:
            ch.add(replica_id)


def take(channel: set[str]) -> list[str]:
    """The ids in `channel`, sorted (deterministic), and the channel emptied."""
    out = sorted(channel)
    channel.clear()
    return out


@dataclass(slots=True)
class ReplicaRecord:
    replica_id: str
    version: str
    state: ReplicaState
    since: float
    order: int
    rpc_subject: str = ""
    agent_id: str = ""
    http_address: str = ""
    """Where it serves HTTP itself (its "ready" lifecycle; empty: it serves none): copied into
    its member value for the proxy's HAProxy."""
    devices: tuple[int, ...] = ()
    """GPU device indices on its agent (placement.py); written into its target."""
    verdict: str = ""
    rev: Revision | None = field(default=None, repr=False, compare=False)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        # any change may alter what the deployment derived from its records
        rev = getattr(self, "rev", None)
        if rev is not None:
            rev.touched(self.replica_id)


Contribution = tuple[ReplicaState, bool, bool]
"""(state, holds a verdict, of the current version)."""


class RecordSets:
    __slots__ = (
        "_seen", "condemned", "draining_clean", "live", "old", "pending", "running",
        "running_condemned", "running_current", "version", "waiting", "waiting_current",
    )  # fmt: skip

    def __init__(self, version: str) -> None:
        self.version = version
        self.live: dict[str, ReplicaRecord] = {}
        """Not draining, in the order they became live (creation order)."""
        self.waiting: dict[str, ReplicaRecord] = {}
        """PENDING or STARTING."""
        self.pending: dict[str, ReplicaRecord] = {}
        """PENDING: in fp_targets, not heard from (those without an agent are to be placed)."""
        self.waiting_current = 0
        """Waiting replicas of the current version (the rest of `waiting` are old)."""
        self.running: dict[str, ReplicaRecord] = {}
        self.old: dict[str, ReplicaRecord] = {}
        """Live replicas of another version than the deployment's."""
        self.running_current = 0
        """RUNNING, no verdict, current version."""
        self.running_condemned = 0
        self.condemned = 0
        """Records holding a verdict."""
        self.draining_clean = 0
        """Replicas draining without a verdict (scale-down or rollout)."""
        self._seen: dict[str, Contribution] = {}

    def update(
        self, records: Mapping[str, ReplicaRecord], changed: Iterable[str], version: str
    ) -> None:
        if version != self.version:
            self._rebuild(records, version)
            return
        for rid in changed:
            rec = records.get(rid)
            new = None if rec is None else self._contribution(rec)
            old = self._seen.get(rid)
            if new == old:
                continue
            if old is not None:
                self._count(old, -1)
            if rec is None or new is None:
                self._seen.pop(rid, None)
                for s in (self.live, self.waiting, self.pending, self.running, self.old):
                    s.pop(rid, None)
                continue
            self._seen[rid] = new
            self._count(new, +1)
            self._place(rec, new)

    def _rebuild(self, records: Mapping[str, ReplicaRecord], version: str) -> None:
        fresh = RecordSets(version)
        fresh.update(records, records, version)
        for name in RecordSets.__slots__:
            setattr(self, name, getattr(fresh, name))

    def _contribution(self, rec: ReplicaRecord) -> Contribution:
        return rec.state, bool(rec.verdict), rec.version == self.version

    def _count(self, c: Contribution, sign: int) -> None:
        state, verdict, current = c
        self.condemned += sign * verdict
        if state is ReplicaState.DRAINING:
            self.draining_clean += sign * (not verdict)
        elif state is not ReplicaState.RUNNING:
            self.waiting_current += sign * current
        elif state is ReplicaState.RUNNING:
            if verdict:
                self.running_condemned += sign
            else:
                self.running_current += sign * current

    def _place(self, rec: ReplicaRecord, c: Contribution) -> None:
        rid = rec.replica_id
        state, _, current = c
        _member(self.live, rid, rec, state is not ReplicaState.DRAINING)
        _member(self.old, rid, rec, state is not ReplicaState.DRAINING and not current)
        _member(self.running, rid, rec, state is ReplicaState.RUNNING)
        _member(self.waiting, rid, rec, state in (ReplicaState.PENDING, ReplicaState.STARTING))
        _member(self.pending, rid, rec, state is ReplicaState.PENDING)

    # -- derived -------------------------------------------------------------------------------

    def new(self) -> list[ReplicaRecord]:
        """Live replicas of the current version (a pass over the live ones: only when needed)."""
        return [r for rid, r in self.live.items() if rid not in self.old]

    @property
    def new_count(self) -> int:
        return len(self.live) - len(self.old)

    def by_order(self) -> list[ReplicaRecord]:
        return sorted(self.live.values(), key=_by_order)


def _member(s: dict[str, ReplicaRecord], rid: str, rec: ReplicaRecord, belongs: bool) -> None:
    if belongs:
        s.setdefault(rid, rec)
    else:
        s.pop(rid, None)


def _by_order(r: ReplicaRecord) -> int:
    return r.order

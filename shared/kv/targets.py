"""KV `fp_targets`: one value per replica an agent must run, keyed so an agent reads only its own.

Key `{agent_id}.{app}.{deployment}.{slot}`. The slot is the replica's small integer within its
deployment (reused once free; services/controller/kv_delta.py), so the keys of a deployment are bounded by its
largest size, not by how many replicas it ever had. An agent watches `{agent_id}.>`; a controller
taking over an app reads `*.{app}.>`. A value is the whole recipe: the replica's identity, its
start order and the `ReplicaSpec` of its version, so nothing else must be read to start it.
Writer: the owning controller (revision-checked, stamped with `owner_epoch`). Readers: agents,
the controller on takeover.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from shared.errors import UsageError, WireError
from shared.kv import envelope as e
from shared.replicaspec import ReplicaSpec
from shared.subjects import validate_name
from shared.wire import reasons

UNPLACED = "_unplaced"
"""The agent token of a replica no agent was chosen for (no agents announced themselves: replicas
are run by something else that reads fp_targets). No agent may be called this."""


def target_key(agent_id: str, app: str, deployment: str, slot: int) -> str:
    return f"{agent_id or UNPLACED}.{app}.{deployment}.{slot}"


def agent_pattern(agent_id: str) -> str:
    """Every target of one agent."""
    return f"{agent_id}.>"


def app_pattern(app: str) -> str:
    """Every target of one app, on any agent."""
    return f"*.{app}.>"


@dataclass(frozen=True, slots=True)
class TargetKey:
    agent_id: str
    app: str
    deployment: str
    slot: int

    @staticmethod
    def parse(key: str) -> TargetKey:
        parts = key.split(".")
        if len(parts) != 4 or not parts[3].isdigit():
            raise WireError(
                reasons.BAD_VALUE,
                f"not a target key ({{agent}}.{{app}}.{{deployment}}.{{slot}}): {key!r}",
            )
        try:
            for part, what in zip(parts[:3], ("agent_id", "app", "deployment"), strict=True):
                validate_name(part, what)
        except UsageError as exc:
            raise WireError(reasons.BAD_VALUE, f"target key {key!r}: {exc}") from None
        return TargetKey(parts[0], parts[1], parts[2], int(parts[3]))


@dataclass(frozen=True, slots=True)
class ReplicaTarget:
    KIND: ClassVar[str] = "replica_target"
    app: str
    deployment: str
    replica_id: str
    agent_id: str
    """Empty while no agent was chosen (the key then says `_unplaced`)."""
    slot: int
    order: int
    """Start order within the deployment (older first): kept across controller restarts."""
    version: str
    rpc_subject: str
    spec: ReplicaSpec
    owner_epoch: int = 0
    devices: tuple[int, ...] = ()
    """GPU device indices on its agent assigned to it (its `CUDA_VISIBLE_DEVICES`); written only
    when not empty, so values without GPUs are what older writers wrote."""

    @property
    def key(self) -> str:
        return target_key(self.agent_id, self.app, self.deployment, self.slot)

    def to_doc(self) -> dict[str, Any]:
        return {
            "app": self.app,
            "deployment": self.deployment,
            "replica_id": self.replica_id,
            "agent_id": self.agent_id,
            "slot": self.slot,
            "order": self.order,
            "version": self.version,
            "rpc_subject": self.rpc_subject,
            "spec": self.spec.to_doc(),
            "owner_epoch": self.owner_epoch,
        } | ({"devices": list(self.devices)} if self.devices else {})

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> ReplicaTarget:
        return cls(
            app=e.name(doc, "app"),
            deployment=e.name(doc, "deployment"),
            replica_id=e.name(doc, "replica_id"),
            agent_id=e.name(doc, "agent_id", ""),
            slot=e.count(doc, "slot"),
            order=e.count(doc, "order"),
            version=e.string(doc, "version"),
            rpc_subject=e.string(doc, "rpc_subject"),
            spec=e.nested("replica_target.spec", e.required(doc, "spec"), ReplicaSpec.from_doc),
            owner_epoch=e.count(doc, "owner_epoch", 0),
            devices=_devices(doc),
        )

    def check_key(self, key: str) -> None:
        """A value must sit under its own key (WireError otherwise)."""
        e.check_key(key, self.key, "target")


MAX_DEVICES = 1024


def _devices(doc: dict[str, Any]) -> tuple[int, ...]:
    raw = e.listing(doc, "devices", default_empty=True)
    if len(raw) > MAX_DEVICES:
        raise WireError(reasons.BAD_VALUE, f"replica_target.devices has over {MAX_DEVICES}")
    devices = tuple(e.whole(d, "replica_target.devices[]") for d in raw)
    if len(set(devices)) != len(devices):
        raise WireError(reasons.BAD_VALUE, "replica_target.devices repeats a device")
    return devices

"""Values of the control KV buckets that more than one service reads.

`fp_membership` holds, per deployment (key `{app}.{deployment}`), the ordered list of replicas that
routers may send requests to, with an epoch that only grows: a router ignores a value whose epoch is
older than the one it has (a KV watch can replay an old value after a reconnect). Values are msgpack
maps with `"v": 1` and `"kind"`, like every other message; decoding validates and raises WireError.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from json.encoder import encode_basestring_ascii as _q
from typing import Any

import msgpack

from shared.errors import WireError
from shared.subjects import TOKEN_PATTERN

MAX_CONTROL_VALUE_BYTES = 4 * 1024 * 1024
MAX_MEMBERS = 1_000_000


def deployment_key(app: str, deployment: str) -> str:
    """KV key for a deployment: `{app}.{deployment}` (both valid subject tokens, see subjects.py)."""
    return f"{app}.{deployment}"


def split_deployment_key(key: str) -> tuple[str, str]:
    app, sep, deployment = key.partition(".")
    if not sep or not app or not deployment or "." in deployment:
        raise WireError(
            "bad_key", f"expected '{{app}}.{{deployment}}' ({TOKEN_PATTERN}), got {key!r}"
        )
    return app, deployment


@dataclass(frozen=True, slots=True)
class Member:
    replica_id: str
    rpc_subject: str


@dataclass(frozen=True, slots=True)
class Membership:
    app: str
    deployment: str
    epoch: int
    replicas: tuple[Member, ...]
    owner_epoch: int = 0
    """The writing controller's ownership epoch (fencing, see services/controller/fenced.py)."""

    def encode(self) -> bytes:
        return msgpack.packb(
            {
                "v": 1,
                "kind": "membership",
                "app": self.app,
                "deployment": self.deployment,
                "epoch": self.epoch,
                "replicas": [[m.replica_id, m.rpc_subject] for m in self.replicas],
                "owner_epoch": self.owner_epoch,
            },
            use_bin_type=True,
        )

    @staticmethod
    def decode(data: bytes) -> Membership:
        m = _load_map(data, "membership")
        app, deployment = _str(m, "app"), _str(m, "deployment")
        epoch = m.get("epoch")
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise WireError("wrong_type", "membership.epoch must be a non-negative integer")
        raw = m.get("replicas")
        if not isinstance(raw, list) or len(raw) > MAX_MEMBERS:
            raise WireError("wrong_type", "membership.replicas must be a list")
        members = []
        for item in raw:
            if (
                not isinstance(item, list)
                or len(item) < 2
                or not isinstance(item[0], str)
                or not isinstance(item[1], str)
            ):
                raise WireError(
                    "wrong_type", "membership.replicas items are [replica_id, rpc_subject]"
                )
            members.append(Member(item[0], item[1]))
        owner = m.get("owner_epoch", 0)
        if not isinstance(owner, int) or isinstance(owner, bool):
            raise WireError("wrong_type", "membership.owner_epoch must be an integer")
        return Membership(app, deployment, epoch, tuple(members), owner)


def _load_map(data: bytes, kind: str) -> dict[str, Any]:
    if len(data) > MAX_CONTROL_VALUE_BYTES:
        raise WireError("oversize", f"{len(data)} bytes > {MAX_CONTROL_VALUE_BYTES}")
    try:
        m = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises many types on hostile input
        raise WireError("malformed", f"{kind}: {type(exc).__name__}: {exc}") from None
    if not isinstance(m, dict):
        raise WireError("wrong_type", f"{kind}: expected a map")
    if m.get("v") != 1:
        raise WireError("unsupported_version", f"{kind}: v={m.get('v')!r}")
    if m.get("kind") != kind:
        raise WireError("unexpected_kind", f"expected {kind!r}, got {m.get('kind')!r}")
    return m


def _str(m: dict[str, Any], field: str) -> str:
    value = m.get(field)
    if not isinstance(value, str):
        raise WireError("wrong_type", f"{field} must be a string")
    return value


# -- fp_targets and fp_status (JSON: small, human-inspectable with `nats kv get`) -------------


@dataclass(frozen=True, slots=True)
class ReplicaTarget:
    """One replica an agent must run (state is the controller's view, for restart recovery)."""

    replica_id: str
    version: str
    state: str
    agent_id: str = ""
    rpc_subject: str = ""


@dataclass(frozen=True, slots=True)
class TargetSet:
    """KV `fp_targets`, key `{app}.{deployment}`: the replicas that must run, and how to run them.

    `owner_epoch` fences writes (a controller that lost ownership writes an older epoch);
    `deployment` holds the DeploymentConfig as JSON (shared.appconfig)."""

    app: str
    deployment: str
    version: str
    owner_epoch: int
    membership_epoch: int
    replicas: tuple[ReplicaTarget, ...]
    config: Mapping[str, Any]

    def encode(self) -> bytes:
        """Sorted-key JSON (`json.dumps(..., sort_keys=True)` of the whole document), with the
        replica list, most of the bytes, written by hand: a value for 16,384 replicas took 100 ms
        through `asdict` and 10 ms this way (docs/benchmarks.md, "Fleet scale")."""
        doc: dict[str, Any] = {
            "v": 1,
            "kind": "targets",
            "app": self.app,
            "deployment": self.deployment,
            "version": self.version,
            "owner_epoch": self.owner_epoch,
            "membership_epoch": self.membership_epoch,
            "replicas": None,
            "config": dict(self.config),
        }
        parts = [
            f"{_q(k)}: {_replicas_json(self.replicas) if k == 'replicas' else _dumps(doc[k])}"
            for k in sorted(doc)
        ]
        return ("{" + ", ".join(parts) + "}").encode()

    @staticmethod
    def decode(data: bytes) -> TargetSet:
        doc = _load_json(data, "targets")
        try:
            replicas = tuple(ReplicaTarget(**r) for r in doc["replicas"])
            return TargetSet(
                app=str(doc["app"]),
                deployment=str(doc["deployment"]),
                version=str(doc["version"]),
                owner_epoch=int(doc["owner_epoch"]),
                membership_epoch=int(doc["membership_epoch"]),
                replicas=replicas,
                config=dict(doc["config"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise WireError("wrong_type", f"targets: {exc}") from None


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _replicas_json(replicas: tuple[ReplicaTarget, ...]) -> str:
    """`json.dumps([asdict(r) ...], sort_keys=True)` for string fields (the field names are
    written in sorted order); anything else takes the slow path, so the bytes never differ."""
    try:
        items = [
            f'{{"agent_id": {_q(r.agent_id)}, "replica_id": {_q(r.replica_id)}, '
            f'"rpc_subject": {_q(r.rpc_subject)}, "state": {_q(r.state)}, '
            f'"version": {_q(r.version)}}}'
            for r in replicas
        ]
    except TypeError:  # a field that is not a str: let json decide how it looks
        return _dumps([asdict(r) for r in replicas])
    return "[" + ", ".join(items) + "]"


@dataclass(frozen=True, slots=True)
class DeploymentStatusView:
    status: str
    message: str
    target_replicas: int
    running_replicas: int
    demand: float
    healthy_replicas: int
    unhealthy_replicas: int
    last_decision: str


@dataclass(frozen=True, slots=True)
class AppStatusView:
    """KV `fp_status`, key `{app}`: what `fleetpulse status` and the proxy read."""

    app: str
    status: str
    route_prefix: str | None
    ingress: str | None
    updated_at: float
    owner_epoch: int
    deployments: Mapping[str, DeploymentStatusView]

    def encode(self) -> bytes:
        doc = {
            "v": 1,
            "kind": "app_status",
            "app": self.app,
            "status": self.status,
            "route_prefix": self.route_prefix,
            "ingress": self.ingress,
            "updated_at": self.updated_at,
            "owner_epoch": self.owner_epoch,
            "deployments": {k: asdict(v) for k, v in sorted(self.deployments.items())},
        }
        return json.dumps(doc, sort_keys=True).encode()

    @staticmethod
    def decode(data: bytes) -> AppStatusView:
        doc = _load_json(data, "app_status")
        try:
            return AppStatusView(
                app=str(doc["app"]),
                status=str(doc["status"]),
                route_prefix=doc.get("route_prefix"),
                ingress=doc.get("ingress"),
                updated_at=float(doc["updated_at"]),
                owner_epoch=int(doc["owner_epoch"]),
                deployments={
                    k: DeploymentStatusView(**v) for k, v in dict(doc["deployments"]).items()
                },
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise WireError("wrong_type", f"app_status: {exc}") from None


def _load_json(data: bytes, kind: str) -> dict[str, Any]:
    if len(data) > MAX_CONTROL_VALUE_BYTES:
        raise WireError("oversize", f"{len(data)} bytes > {MAX_CONTROL_VALUE_BYTES}")
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WireError("malformed", f"{kind}: {exc}") from None
    if not isinstance(doc, dict):
        raise WireError("wrong_type", f"{kind}: expected an object")
    if doc.get("v") != 1:
        raise WireError("unsupported_version", f"{kind}: v={doc.get('v')!r}")
    if doc.get("kind") != kind:
        raise WireError("unexpected_kind", f"expected {kind!r}, got {doc.get('kind')!r}")
    return doc

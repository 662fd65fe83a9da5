"""Values of the control KV buckets that more than one service reads.

`fp_membership` holds, per deployment (key `{app}.{deployment}`), the ordered list of replicas that
routers may send requests to, with an epoch that only grows: a router ignores a value whose epoch is
older than the one it has (a KV watch can replay an old value after a reconnect). Values are msgpack
maps with `"v": 1` and `"kind"`, like every other message; decoding validates and raises WireError.
"""

from __future__ import annotations

from dataclasses import dataclass
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

    def encode(self) -> bytes:
        return msgpack.packb(
            {
                "v": 1,
                "kind": "membership",
                "app": self.app,
                "deployment": self.deployment,
                "epoch": self.epoch,
                "replicas": [[m.replica_id, m.rpc_subject] for m in self.replicas],
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
        return Membership(app, deployment, epoch, tuple(members))


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

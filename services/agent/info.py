"""`AgentInfo`: an agent's entry in KV `fp_agents` (key = agent id), what placement reads.

The bucket has a TTL (`AGENT_TTL_S`); a live agent re-puts its entry every TTL/3, so an entry
that ages out means the agent is gone. Values are JSON like the other control values (readable
with `nats kv get`), a map with `"v": 1` and `"kind": "agent"`; unknown fields are ignored,
missing or ill-typed ones raise `WireError`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from shared.errors import UsageError, WireError
from shared.subjects import validate_name
from shared.wire import reasons

AGENT_TTL_S = 10.0
"""Lifetime of an fp_agents entry that is not refreshed (the bucket's TTL)."""
MAX_AGENT_VALUE_BYTES = 64 * 1024
MAX_RESOURCES = 64
MAX_HOSTNAME_CHARS = 255


@dataclass(frozen=True, slots=True)
class AgentInfo:
    """One agent: how many replicas it may run (`capacity`), how many it runs now (`running`),
    and named resources (`{"gpus": 2}`) that a replica config may ask for."""

    KIND: ClassVar[str] = "agent"
    agent_id: str
    capacity: int
    running: int
    hostname: str
    pid: int
    started_at: float
    resources: Mapping[str, float] = field(default_factory=dict)

    def encode(self) -> bytes:
        doc = {
            "v": 1,
            "kind": self.KIND,
            "agent_id": self.agent_id,
            "capacity": self.capacity,
            "running": self.running,
            "hostname": self.hostname,
            "pid": self.pid,
            "started_at": self.started_at,
            "resources": dict(self.resources),
        }
        return json.dumps(doc, sort_keys=True).encode()

    @staticmethod
    def decode(data: bytes) -> AgentInfo:
        doc = _load(data)
        agent_id = _get(doc, "agent_id", str)
        try:
            validate_name(agent_id, "agent_id")
        except UsageError as exc:
            raise WireError(reasons.BAD_VALUE, str(exc)) from None
        hostname = _get(doc, "hostname", str)
        if len(hostname) > MAX_HOSTNAME_CHARS:
            raise WireError(reasons.BAD_VALUE, "agent.hostname is too long")
        return AgentInfo(
            agent_id=agent_id,
            capacity=_count(doc, "capacity"),
            running=_count(doc, "running"),
            hostname=hostname,
            pid=_count(doc, "pid"),
            started_at=_number(doc, "started_at"),
            resources=_resources(doc.get("resources", {})),
        )


def _load(data: bytes) -> dict[str, Any]:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireError(reasons.NOT_BYTES, f"agent: got {type(data).__name__}")
    if len(data) > MAX_AGENT_VALUE_BYTES:
        raise WireError(reasons.OVERSIZE, f"agent: {len(data)} bytes > {MAX_AGENT_VALUE_BYTES}")
    try:
        doc = json.loads(bytes(data))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WireError(reasons.MALFORMED, f"agent: {exc}") from None
    if not isinstance(doc, dict):
        raise WireError(reasons.NOT_A_MAP, "agent: expected a JSON object")
    if doc.get("v") != 1:
        raise WireError(reasons.UNSUPPORTED_VERSION, f"agent: v={doc.get('v')!r}")
    if doc.get("kind") != AgentInfo.KIND:
        raise WireError(reasons.UNEXPECTED_KIND, f"expected 'agent', got {doc.get('kind')!r}")
    return doc


def _get(doc: dict[str, Any], name: str, kind: type) -> Any:
    if name not in doc:
        raise WireError(reasons.MISSING_FIELD, f"agent.{name}")
    value = doc[name]
    if not isinstance(value, kind):
        raise WireError(reasons.WRONG_TYPE, f"agent.{name} must be a {kind.__name__}")
    return value


def _count(doc: dict[str, Any], name: str) -> int:
    value = _get(doc, name, int)
    if isinstance(value, bool):  # JSON true is not a count
        raise WireError(reasons.WRONG_TYPE, f"agent.{name} must be an integer")
    if value < 0:
        raise WireError(reasons.BAD_VALUE, f"agent.{name} must be >= 0")
    return int(value)


def _finite(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise WireError(reasons.WRONG_TYPE, f"{where} must be a number")
    if not math.isfinite(value) or value < 0:
        raise WireError(reasons.BAD_VALUE, f"{where} must be finite and >= 0")
    return float(value)


def _number(doc: dict[str, Any], name: str) -> float:
    if name not in doc:
        raise WireError(reasons.MISSING_FIELD, f"agent.{name}")
    return _finite(doc[name], f"agent.{name}")


def _resources(raw: object) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise WireError(reasons.WRONG_TYPE, "agent.resources must be an object")
    if len(raw) > MAX_RESOURCES:
        raise WireError(reasons.BAD_VALUE, f"agent.resources has more than {MAX_RESOURCES} names")
    out: dict[str, float] = {}
    for name, amount in raw.items():
        try:
            validate_name(name, "resource name")
        except UsageError as exc:
            raise WireError(reasons.BAD_VALUE, str(exc)) from None
        out[name] = _finite(amount, f"agent.resources.{name}")
    return out

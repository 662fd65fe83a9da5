"""KV `fp_agents`, key `{agent_id}`: an agent's announcement, what placement reads.

The bucket has a TTL (`AGENT_TTL_S`); a live agent re-puts its entry every TTL/3, so an entry
that ages out means the agent is gone. Writer: each agent (its own key). Reader: the controller.
The value's size is bounded by `MAX_RESOURCES` and `MAX_HOSTNAME_CHARS`, not by what it runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from shared.errors import UsageError, WireError
from shared.kv import envelope as e
from shared.kv.buckets import AGENT_TTL_S
from shared.subjects import validate_name
from shared.wire import reasons

__all__ = ["AGENT_TTL_S", "MAX_HOSTNAME_CHARS", "MAX_RESOURCES", "AgentInfo"]

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
        return e.encode(self)

    @staticmethod
    def decode(data: bytes) -> AgentInfo:
        return e.decode(data, AgentInfo)

    def to_doc(self) -> dict[str, Any]:
        return {
            "agent_id": self.agent_id,
            "capacity": self.capacity,
            "running": self.running,
            "hostname": self.hostname,
            "pid": self.pid,
            "started_at": self.started_at,
            "resources": dict(sorted(self.resources.items())),
        }

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> AgentInfo:
        hostname = e.string(doc, "hostname")
        if len(hostname) > MAX_HOSTNAME_CHARS:
            raise WireError(reasons.BAD_VALUE, f"agent.hostname is over {MAX_HOSTNAME_CHARS} chars")
        return cls(
            agent_id=e.name(doc, "agent_id"),
            capacity=e.count(doc, "capacity"),
            running=e.count(doc, "running"),
            hostname=hostname,
            pid=e.count(doc, "pid"),
            started_at=e.number(doc, "started_at"),
            resources=_resources(e.mapping(doc, "resources", default_empty=True)),
        )


def _resources(raw: dict[str, Any]) -> dict[str, float]:
    if len(raw) > MAX_RESOURCES:
        raise WireError(reasons.BAD_VALUE, f"agent.resources has more than {MAX_RESOURCES} names")
    out: dict[str, float] = {}
    for name, amount in raw.items():
        try:
            validate_name(name, "resource name")
        except UsageError as exc:
            raise WireError(reasons.BAD_VALUE, f"agent.resources: {exc}") from None
        out[name] = e.finite(amount, f"agent.resources.{name}")
    return out

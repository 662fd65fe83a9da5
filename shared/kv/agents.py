"""KV `fp_agents`, key `{agent_id}`: an agent's announcement, what placement reads.

The bucket has a TTL (`AGENT_TTL_S`); a live agent re-puts its entry every TTL/3, so an entry
that ages out means the agent is gone. Writer: each agent (its own key). Readers: the controller,
`fleetpulse status` (the runtime environments the agent prepares or could not, `environments`).
The value's size is bounded by `MAX_RESOURCES` and `MAX_HOSTNAME_CHARS`, not by what it runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from shared.errors import UsageError, WireError
from shared.kv import envelope as e
from shared.kv.buckets import AGENT_TTL_S
from shared.subjects import validate_name
from shared.wire import reasons

__all__ = ["AGENT_TTL_S", "MAX_HOSTNAME_CHARS", "MAX_RESOURCES", "AgentInfo", "EnvNote"]

MAX_RESOURCES = 64
MAX_HOSTNAME_CHARS = 255
MAX_ENV_NOTES = 64
MAX_NOTE_CHARS = 500
ENV_STATES = ("preparing", "failed")


@dataclass(frozen=True, slots=True)
class EnvNote:
    """A deployment whose replicas wait on this agent for their runtime_env (`preparing`: its
    packages are fetched or its Python environment built, since `since`), or could not get it
    (`failed`, with the installer's or fetcher's own error line in `detail`)."""

    deployment: str
    """`{app}.{deployment}`."""
    state: str
    since: float
    """Unix seconds."""
    detail: str = ""

    def to_doc(self) -> dict[str, Any]:
        return {"deployment": self.deployment, "state": self.state, "since": self.since,
                "detail": self.detail}  # fmt: skip


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
    environments: tuple[EnvNote, ...] = ()
    """Runtime environments its replicas wait for or could not get (absent when none)."""

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
        } | ({"environments": [n.to_doc() for n in self.environments]} if self.environments else {})

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
            environments=_notes(doc.get("environments", [])),
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


def _notes(raw: Any) -> tuple[EnvNote, ...]:
    if not isinstance(raw, list):
        raise WireError(reasons.WRONG_TYPE, "agent.environments must be a list")
    if len(raw) > MAX_ENV_NOTES:
        raise WireError(reasons.BAD_VALUE, f"agent.environments has more than {MAX_ENV_NOTES}")
    out = []
    for i, item in enumerate(raw):
        where = f"agent.environments[{i}]"
        if not isinstance(item, dict):
            raise WireError(reasons.WRONG_TYPE, f"{where} must be an object")
        state = e.string(item, "state")
        if state not in ENV_STATES:
            raise WireError(reasons.BAD_VALUE, f"{where}.state must be one of {ENV_STATES}")
        detail = item.get("detail", "")
        if not isinstance(detail, str):
            raise WireError(reasons.WRONG_TYPE, f"{where}.detail must be a string")
        note = EnvNote(e.string(item, "deployment"), state, e.number(item, "since"), detail)
        out.append(note if len(detail) <= MAX_NOTE_CHARS else replace(note, detail=detail[:500]))
    return tuple(out)

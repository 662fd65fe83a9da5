"""KV `fp_audit`, key `{user}.{app}`: who deployed or deleted an application, when, what version.

Deploying is running code on every agent host, so every deploy and delete leaves a record
(docs/operations.md, "Deploy rights"). Writer: `fleetpulse deploy` and `fleetpulse delete`, after
their write to fp_apps. Readers: `fleetpulse audit`, `fleetpulse status`. The bucket keeps the
last `buckets.AUDIT_HISTORY` records of each key.

`user` is the NATS login the record was written with, and the key starts with it: a role may
write records under its own name only (shared/natsroles.py grants `$KV.fp_audit.{role}.>`), so
the server, not the client, vouches for who. `client` (OS user and host) is what the client said
about itself, for context only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from shared.errors import WireError
from shared.kv import envelope as e
from shared.wire import reasons

ACTIONS: Final = ("deploy", "delete")
ANONYMOUS: Final = "anonymous"
"""The user of a record written without a NATS login (`fleetpulse up` without --auth)."""


def audit_key(user: str, app: str) -> str:
    return f"{user}.{app}"


@dataclass(frozen=True, slots=True)
class AuditRecord:
    KIND: ClassVar[str] = "audit"
    action: str
    """One of ACTIONS."""
    app: str
    user: str
    """The NATS user it was written as (its key's first token), or ANONYMOUS."""
    at: float
    """When, by the writer's wall clock (unix seconds)."""
    revision: int
    """The fp_apps revision written (deploy) or deleted (delete)."""
    versions: Mapping[str, str] = field(default_factory=dict)
    """Deployment -> the version its replicas run (deploy); empty for a delete."""
    client: str = ""
    """`osuser@host` as the client reported it: not verified."""

    @property
    def key(self) -> str:
        return audit_key(self.user, self.app)

    def to_doc(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "app": self.app,
            "user": self.user,
            "at": self.at,
            "revision": self.revision,
            "versions": dict(sorted(self.versions.items())),
            "client": self.client,
        }

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> AuditRecord:
        action = e.string(doc, "action")
        if action not in ACTIONS:
            raise WireError(reasons.BAD_VALUE, f"audit.action: {action!r} not in {ACTIONS}")
        versions = e.mapping(doc, "versions")
        for deployment, version in versions.items():
            if not isinstance(version, str):
                raise WireError(reasons.WRONG_TYPE, f"audit.versions.{deployment} not a string")
        return cls(
            action=action,
            app=e.name(doc, "app"),
            user=e.name(doc, "user"),
            at=e.number(doc, "at"),
            revision=e.count(doc, "revision"),
            versions=versions,
            client=e.string(doc, "client", ""),
        )

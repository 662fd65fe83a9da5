"""Every control-state bucket, declared once: name, key shape, document, TTL, writer, readers.

Services bind buckets through `open_bucket(bus, BUCKET)` so a bucket's TTL and history come from
here and nowhere else; docs/wire.md ("Control state") and `schemas/v1/kv/` describe the same table.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.bus import KV, Bus

AUDIT_HISTORY = 64
"""Deploy/delete records kept per fp_audit key (the most NATS KV keeps)."""
AGENT_TTL_S = 10.0
"""Lifetime of an fp_agents entry that is not refreshed: a live agent re-puts every TTL/3."""


@dataclass(frozen=True, slots=True)
class Bucket:
    name: str
    key: str
    """The key shape, as documented."""
    kinds: tuple[str, ...]
    """The document kinds its values hold (shared.kv envelope `kind`)."""
    writer: str
    readers: str
    ttl_s: float | None = None
    history: int = 1


APPS = Bucket(
    "fp_apps", "{app}", ("app",), "fleetpulse deploy",
    "controller, proxy, status; replicas with reconfigure() (their app's key)",
)  # fmt: skip
TARGETS = Bucket(
    "fp_targets", "{agent}.{app}.{deployment}.{slot}", ("replica_target",),
    "controller (owner)", "agents; controller on takeover",
)  # fmt: skip
MEMBERSHIP = Bucket(
    "fp_membership", "{app}.{deployment}.{slot}", ("member",),
    "controller (owner)", "routers, proxy; controller on takeover",
)  # fmt: skip
STATUS = Bucket("fp_status", "{app}", ("app_status",), "controller (owner)", "proxy, status")
AGENTS = Bucket("fp_agents", "{agent}", ("agent",), "each agent", "controller", ttl_s=AGENT_TTL_S)
CONTROLLERS = Bucket(
    "fp_controllers", "{member}", ("controller_member",), "each controller member",
    "controllers, status", ttl_s=None,
)  # fmt: skip
LEASES = Bucket("fp_leases", "p{partition}", ("lease",), "controllers", "controllers, status")
ROUTES = Bucket("fp_routes", "{app}", ("route",), "proxy", "other proxies, status")
AUDIT = Bucket(
    "fp_audit", "{user}.{app}", ("audit",), "fleetpulse deploy/delete (under its own user)",
    "audit, status", history=AUDIT_HISTORY,
)  # fmt: skip

ALL: tuple[Bucket, ...] = (
    APPS, TARGETS, MEMBERSHIP, STATUS, AGENTS, CONTROLLERS, LEASES, ROUTES, AUDIT,
)  # fmt: skip
BY_NAME = {b.name: b for b in ALL}


async def open_bucket(
    bus: Bus, bucket: Bucket, *, create: bool = True, ttl_s: float | None = None
) -> KV:
    """Bind `bucket` (creating it when missing and `create`; BucketNotFound otherwise).
    `ttl_s` overrides the declared TTL where the owner of a bucket sets it from its own config."""
    ttl = bucket.ttl_s if ttl_s is None else ttl_s
    return await bus.kv(bucket.name, history=bucket.history, ttl=ttl, create=create)

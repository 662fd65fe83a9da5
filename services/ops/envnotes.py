"""`fleetpulse status`'s runtime environment lines: what each agent prepares, or could not.

Agents put the deployments whose runtime_env they are preparing (fetching packages, building a
Python environment), or failed to prepare (with the installer's or fetcher's own error line),
into their fp_agents registration (shared/kv/agents.py `EnvNote`); status reads them once and
prints one line per deployment and agent, with the time elapsed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from shared.bus import Bus
from shared.errors import FleetpulseError, WireError
from shared.kv.agents import AgentInfo
from shared.kvfollow import existing_kv
from shared.subjects import KV_AGENTS

log = logging.getLogger(__name__)


async def read_agents(bus: Bus) -> list[AgentInfo]:
    """Every agent's registration (none when the bucket is missing or unreadable)."""
    try:
        kv = await existing_kv(bus, KV_AGENTS)
        if kv is None:
            return []
        out = []
        for entry in await kv.snapshot([">"]):
            try:
                out.append(AgentInfo.decode(entry.value))
            except WireError as exc:
                log.debug("fp_agents/%s ignored: %s", entry.key, exc)
        return out
    except FleetpulseError as exc:
        log.debug("fp_agents not read: %s", exc)
        return []


def env_lines(agents: Iterable[AgentInfo], now: float, app: str | None = None) -> list[str]:
    from services.ops.status import format_age  # status imports this module

    out = []
    for agent in sorted(agents, key=lambda a: a.agent_id):
        for n in agent.environments:
            if app is not None and not n.deployment.startswith(f"{app}."):
                continue
            age = format_age(max(0.0, now - n.since))
            if n.state == "preparing":
                out.append(f"runtime_env of {n.deployment} on {agent.agent_id}: {n.detail} ({age})")
            else:
                out.append(
                    f"runtime_env of {n.deployment} on {agent.agent_id} FAILED {age} ago: {n.detail}"
                )
    return out


def env_json(agents: Iterable[AgentInfo], app: str | None = None) -> list[dict[str, Any]]:
    return [
        {"agent": a.agent_id, **n.to_doc()}
        for a in sorted(agents, key=lambda a: a.agent_id)
        for n in a.environments
        if app is None or n.deployment.startswith(f"{app}.")
    ]

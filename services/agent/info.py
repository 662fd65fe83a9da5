"""`AgentInfo`, an agent's entry in KV `fp_agents`: the document lives in shared.kv.agents.

Kept so that `from services.agent.info import AGENT_TTL_S, AgentInfo` goes on working.
"""

from __future__ import annotations

from shared.kv.agents import AGENT_TTL_S, MAX_HOSTNAME_CHARS, MAX_RESOURCES, AgentInfo

__all__ = ["AGENT_TTL_S", "MAX_HOSTNAME_CHARS", "MAX_RESOURCES", "AgentInfo"]

"""Which node agent runs a new replica.

How it works: agents announce themselves in KV fp_agents every few seconds; an agent not heard
from within `AGENT_TTL_S` (by local receipt time) is gone. A replica waiting for an agent goes to
the live agent with the most free capacity (ties by agent id, so placement is deterministic);
capacity counts every replica assigned to an agent, draining ones included, because a replica's
slot is free only once its process has exited. Replicas of an agent that disappears are lost with
it (their processes die with the agent) and the controller replaces them elsewhere.

Placement is off until the first agent appears: replicas then keep an empty agent id, which is
how tests and hand-run replicas work without agents.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from services.agent.info import AGENT_TTL_S, AgentInfo


@dataclass(slots=True)
class AgentView:
    agent_id: str
    capacity: int
    last_seen: float


class Placement:
    __slots__ = ("_live_before", "agents", "ever_seen")

    def __init__(self) -> None:
        self.agents: dict[str, AgentView] = {}
        self.ever_seen = False
        self._live_before: set[str] = set()

    def heard(self, info: AgentInfo, recv: float) -> None:
        self.agents[info.agent_id] = AgentView(info.agent_id, info.capacity, recv)
        self.ever_seen = True

    def gone(self, agent_id: str) -> None:
        self.agents.pop(agent_id, None)

    def live(self, now: float) -> dict[str, AgentView]:
        return {a: v for a, v in self.agents.items() if now - v.last_seen < AGENT_TTL_S}

    def lost_since_last(self, now: float) -> set[str]:
        """Agents live at the previous call and not now. When every agent went silent at once
        the likelier story is that we stopped hearing (our connection, the bus), not that all
        machines died: nothing is declared lost until some agent is heard again."""
        live = set(self.live(now))
        if not live and self._live_before:
            return set()
        lost = self._live_before - live
        self._live_before = live
        return lost

    def assign(self, waiting: Iterable[str], load: Counter[str], now: float) -> dict[str, str]:
        """replica id -> agent id for the waiting replicas that fit somewhere (in order): each
        to the agent with the most free capacity, ties to the smallest id. A heap of (free
        capacity, id), so placing a rollout's batch costs O(batch x log agents)."""
        free = [(-(a.capacity - load[a.agent_id]), a.agent_id) for a in self.live(now).values()]
        heapq.heapify(free)
        out: dict[str, str] = {}
        for rid in waiting:
            if not free or free[0][0] >= 0:
                break  # the agent with the most room has none
            room, agent_id = free[0]
            out[rid] = agent_id
            load[agent_id] += 1
            heapq.heapreplace(free, (room + 1, agent_id))
        return out

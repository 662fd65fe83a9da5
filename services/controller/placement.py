"""Which node agent runs a new replica, within what the agents offer.

How it works: agents announce themselves in KV fp_agents every few seconds with what they offer
(replica slots, cpus, gpus, memory, custom resources); an agent not heard from within
`AGENT_TTL_S` (by local receipt time) is gone. A replica waiting for an agent asks for one slot
plus its deployment's `ray_actor_options` (its version's `ReplicaSpec.resources`); it goes to the
live agent with room for all of it and the most free slots (spread; ties by agent id, so
placement is deterministic), and within that agent onto GPU devices by shared.resources'
rule (whole devices to themselves, fractions packed onto one device until it is full). At
most `max_replicas_per_node` of a deployment's replicas share an agent. What is assigned is kept
in the ledger (capacity.py) from placement until the replica's record is gone, draining
included, because a process holds its slot, memory and devices until it has exited. Replicas of
an agent that disappears are lost with it (their processes die with the agent) and the
controller replaces them elsewhere.

A replica that fits nowhere stays unplaced (fp_targets key `_unplaced`), without a start
timeout, and `place` says why for its deployment's status ("needs gpus 1: no live agent has
gpus 1 free ..."). It is tried again only once the ledger's epoch moved (something was released,
or an agent appeared or offers more), so waiting costs nothing per tick.

Placement is off until the first agent appears: replicas then keep an empty agent id, which is
how tests and hand-run replicas work without agents.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from shared.kv.agents import AGENT_TTL_S, AgentInfo

from .capacity import DepKey, Ledger, Placed, Request

__all__ = ["Placed", "Placement", "Waiting"]


@dataclass(frozen=True, slots=True)
class Waiting:
    """One replica to place."""

    replica_id: str
    dep: DepKey
    resources: Mapping[str, float]
    per_node: int | None = None


class Placement:
    __slots__ = ("_failed", "_failed_epoch", "_live_before", "_requests", "ever_seen", "last_seen",
                 "ledger")  # fmt: skip

    def __init__(self) -> None:
        self.last_seen: dict[str, float] = {}
        self.ever_seen = False
        self.ledger = Ledger()
        self._live_before: set[str] = set()
        self._requests: dict[tuple[tuple[str, float], ...], Request] = {}
        self._failed: dict[tuple[Request, DepKey | None, int | None], str] = {}
        self._failed_epoch = -1

    def heard(self, info: AgentInfo, recv: float) -> None:
        self.last_seen[info.agent_id] = recv
        self.ledger.offer_from(info.agent_id, info.capacity, info.resources, recv)
        self.ever_seen = True

    def gone(self, agent_id: str) -> None:
        self.last_seen.pop(agent_id, None)
        self.ledger.forget_agent(agent_id)

    def live(self, now: float) -> set[str]:
        return {a for a, seen in self.last_seen.items() if now - seen < AGENT_TTL_S}

    def lost_since_last(self, now: float) -> set[str]:
        """Agents live at the previous call and not now. When every agent went silent at once
        the likelier story is that we stopped hearing (our connection, the bus), not that all
        machines died: nothing is declared lost until some agent is heard again."""
        live = self.live(now)
        if not live and self._live_before:
            return set()
        lost = self._live_before - live
        self._live_before = live
        return lost

    def request(self, resources: Mapping[str, float]) -> Request:
        key = tuple(sorted(resources.items()))
        req = self._requests.get(key)
        if req is None:
            req = self._requests[key] = Request.of(resources)
        return req

    def place(
        self, waiting: Iterable[Waiting], now: float
    ) -> tuple[dict[str, Placed], dict[DepKey, str]]:
        """Where each waiting replica goes, in order (those that fit), and for each deployment
        with a replica that fits nowhere, why."""
        ledger = self.ledger
        if ledger.epoch != self._failed_epoch:
            self._failed.clear()
            self._failed_epoch = ledger.epoch
        placed: dict[str, Placed] = {}
        why: dict[DepKey, str] = {}
        for w in waiting:
            req = self.request(w.resources)
            memo = (req, w.dep if w.per_node is not None else None, w.per_node)
            reason = self._failed.get(memo)
            if reason is None:
                spot = ledger.choose(req, w.dep, w.per_node, now)
                if spot is not None:
                    ledger.assign(w.replica_id, w.dep, req, spot)
                    placed[w.replica_id] = spot
                    continue
                reason = ledger.why_not(req, w.resources, w.dep, w.per_node, now)
                self._failed[memo] = reason
            why.setdefault(w.dep, reason)
        # an assignment does not move the epoch (it only takes room), so the memo stays valid
        return placed, why

    def restore(
        self, rid: str, dep: DepKey, resources: Mapping[str, float], placed: Placed
    ) -> None:
        """A replica found in fp_targets on an agent: what it holds there."""
        self.ledger.assign(rid, dep, self.request(resources), placed)

    def release(self, rid: str) -> None:
        """The replica's record is gone: what it held is free (O(1); a no-op if unplaced)."""
        self.ledger.release(rid)

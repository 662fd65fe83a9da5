"""What agents offer and what is assigned on them: the ledger placement fits replicas into.

How it works: one row per agent, one column per resource (column 0 is `replicas`, the agent's
`--max-replicas` slots; then `cpus`, `gpus`, `memory` and custom names as they appear), in
integer units (shared.resources.UNIT). `offer` is what each agent announced, `used` the sum of
what is assigned to it. Fitting one replica is a few numpy comparisons over all agents at once,
one per resource it asks for, so placing costs O(agents x its resources) in C, never a Python
pass over replicas. GPUs are also tracked per device (free units per device index): a request
must fit a device (or whole devices), not only the agent's sum (shared.resources.fit_devices).

An assignment lives from `assign` until `release` (the replica's record is gone: its process
exited or its agent was lost), draining included, because devices and memory are held until the
process is gone. `epoch` grows whenever something may have made room (a release, an agent
heard anew or offering more); a request that did not fit is not tried again until it grows, so
a replica that fits nowhere costs nothing per tick while it waits.

Pure: no I/O, no clock (times are arguments).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shared import resources as res
from shared.kv.agents import AGENT_TTL_S

REPLICAS = "replicas"
Int64Array = npt.NDArray[np.int64]
DepKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Request:
    """One replica's needs, as ledger columns: a slot plus its resources."""

    names: tuple[str, ...]
    units: tuple[int, ...]
    gpu_units: int

    @staticmethod
    def of(resources: Mapping[str, float]) -> Request:
        items = sorted((n, res.to_units(v)) for n, v in resources.items() if v > 0)
        return Request(
            tuple(n for n, _ in items),
            tuple(u for _, u in items),
            dict(items).get(res.GPUS, 0),
        )


@dataclass(frozen=True, slots=True)
class Assignment:
    row: int
    dep: DepKey
    request: Request
    devices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Placed:
    agent_id: str
    devices: tuple[int, ...]


class Ledger:
    __slots__ = (
        "_devices", "_id_rank", "_per_dep", "assigned", "cols", "epoch", "ids", "last_seen",
        "offer", "rows", "used",
    )  # fmt: skip

    def __init__(self) -> None:
        self.cols: dict[str, int] = {REPLICAS: 0}
        self.rows: dict[str, int] = {}
        self.ids: list[str] = []
        self.offer: Int64Array = np.zeros((0, 1), np.int64)
        self.used: Int64Array = np.zeros((0, 1), np.int64)
        self.last_seen = np.zeros(0, np.float64)
        self._id_rank = np.zeros(0, np.int64)
        self._devices: list[Int64Array] = []
        """Per row: free units of each GPU device."""
        self._per_dep: dict[DepKey, Int64Array] = {}
        """Replicas of a deployment per row (for max_replicas_per_node)."""
        self.assigned: dict[str, Assignment] = {}
        self.epoch = 0

    # -- agents --------------------------------------------------------------------------------

    def offer_from(
        self, agent_id: str, capacity: int, offered: Mapping[str, float], recv: float
    ) -> None:
        """An agent announced itself: its offer replaces the last one."""
        row = self._row(agent_id, recv)
        cols = {name: self._col(name) for name in offered}
        vector = np.zeros(self.offer.shape[1], np.int64)
        vector[0] = capacity * res.UNIT
        for name, amount in offered.items():
            vector[cols[name]] = res.to_units(amount)
        was_live = recv - self.last_seen[row] < AGENT_TTL_S
        more = bool(np.any(vector > self.offer[row]))
        gpus = res.device_count(offered.get(res.GPUS, 0.0))
        if gpus != self._devices[row].size:
            self._resize_devices(row, gpus)
            more = True
        self.offer[row] = vector
        self.last_seen[row] = recv
        if more or not was_live:
            self.epoch += 1

    def forget_agent(self, agent_id: str) -> None:
        """The agent left cleanly: it offers nothing (its replicas are released one by one)."""
        row = self.rows.get(agent_id)
        if row is not None:
            self.offer[row] = 0
            self.last_seen[row] = -np.inf

    def live_rows(self, now: float) -> npt.NDArray[np.bool_]:
        live: npt.NDArray[np.bool_] = (now - self.last_seen) < AGENT_TTL_S
        return live

    def _row(self, agent_id: str, recv: float) -> int:
        row = self.rows.get(agent_id)
        if row is not None:
            return row
        idle = np.flatnonzero(~self.live_rows(recv) & (self.used[:, 0] == 0))
        if idle.size:  # an agent that left and holds nothing: its row is reused
            row = int(idle[0])
            del self.rows[self.ids[row]]
            self.ids[row] = agent_id
        else:
            row = len(self.ids)
            self.ids.append(agent_id)
            self.offer = np.vstack([self.offer, np.zeros((1, self.offer.shape[1]), np.int64)])
            self.used = np.vstack([self.used, np.zeros((1, self.used.shape[1]), np.int64)])
            self.last_seen = np.append(self.last_seen, -np.inf)
            self._devices.append(np.zeros(0, np.int64))
            for dep, counts in self._per_dep.items():
                self._per_dep[dep] = np.append(counts, 0)
        self.rows[agent_id] = row
        self.offer[row] = 0
        self.used[row] = 0
        self._devices[row] = np.zeros(0, np.int64)
        order = sorted(range(len(self.ids)), key=self.ids.__getitem__)
        self._id_rank = np.empty(len(self.ids), np.int64)
        self._id_rank[order] = np.arange(len(self.ids))
        return row

    def _col(self, name: str) -> int:
        col = self.cols.get(name)
        if col is None:
            col = self.cols[name] = len(self.cols)
            self.offer = np.pad(self.offer, ((0, 0), (0, 1)))
            self.used = np.pad(self.used, ((0, 0), (0, 1)))
        return col

    def _resize_devices(self, row: int, count: int) -> None:
        old = self._devices[row]
        new = np.full(count, res.UNIT, np.int64)
        keep = min(count, old.size)
        new[:keep] = old[:keep]
        self._devices[row] = new

    # -- fitting -------------------------------------------------------------------------------

    def fits(
        self, request: Request, dep: DepKey, per_node: int | None, now: float
    ) -> npt.NDArray[np.bool_]:
        """Which rows could take one more replica of `dep` asking `request` (sums only)."""
        ok = self.live_rows(now) & (self.offer[:, 0] - self.used[:, 0] >= res.UNIT)
        for name, units in zip(request.names, request.units, strict=True):
            col = self.cols.get(name)
            if col is None:
                return np.zeros(len(self.ids), np.bool_)
            ok &= self.offer[:, col] - self.used[:, col] >= units
        if per_node is not None:
            counts = self._per_dep.get(dep)
            if counts is not None:
                ok &= counts < per_node
        return ok

    def choose(
        self, request: Request, dep: DepKey, per_node: int | None, now: float
    ) -> Placed | None:
        """The agent (and GPU devices) for one replica, or None if none has room. Spread: the
        agent with the most free replica slots, ties to the smallest agent id."""
        ok = self.fits(request, dep, per_node, now)
        if not ok.any():
            return None
        free_slots = self.offer[:, 0] - self.used[:, 0]
        score = free_slots * (len(self.ids) + 1) - self._id_rank
        rows = np.flatnonzero(ok)
        for row in rows[np.argsort(-score[rows], kind="stable")].tolist():
            devices = res.fit_devices(self._devices[row].tolist(), request.gpu_units)
            if devices is not None:
                return Placed(self.ids[row], devices)
        return None  # every candidate's GPUs are too fragmented for this request

    def assign(self, rid: str, dep: DepKey, request: Request, placed: Placed) -> None:
        self.release(rid)
        row = self.rows.get(placed.agent_id)
        if row is None:  # a replica restored onto an agent not heard from yet
            row = self._row(placed.agent_id, -np.inf)
        self.used[row, 0] += res.UNIT
        for name, units in zip(request.names, request.units, strict=True):
            col = self._col(name)  # (may widen the arrays: index them after)
            self.used[row, col] += units
        devices = self._devices[row]
        share = request.gpu_units if request.gpu_units < res.UNIT else res.UNIT
        kept = tuple(d for d in placed.devices if d < devices.size)
        for d in kept:
            devices[d] -= share
        counts = self._per_dep.get(dep)
        if counts is None:
            counts = self._per_dep[dep] = np.zeros(len(self.ids), np.int64)
        counts[row] += 1
        self.assigned[rid] = Assignment(row, dep, request, kept)

    def release(self, rid: str) -> None:
        a = self.assigned.pop(rid, None)
        if a is None:
            return
        self.used[a.row, 0] -= res.UNIT
        for name, units in zip(a.request.names, a.request.units, strict=True):
            self.used[a.row, self.cols[name]] -= units
        share = a.request.gpu_units if a.request.gpu_units < res.UNIT else res.UNIT
        devices = self._devices[a.row]
        for d in a.devices:
            if d < devices.size:  # (the agent may have come back offering fewer)
                devices[d] = min(devices[d] + share, res.UNIT)
        counts = self._per_dep[a.dep]
        counts[a.row] -= 1
        if not counts.any():
            del self._per_dep[a.dep]
        self.epoch += 1

    # -- why a request does not fit ------------------------------------------------------------

    def why_not(
        self, request: Request, resources: Mapping[str, float], dep: DepKey,
        per_node: int | None, now: float,
    ) -> str:  # fmt: skip
        """What stops a replica asking `resources` from being placed, and what to do."""
        live = self.live_rows(now)
        n = int(live.sum())
        if n == 0:
            return (
                "no live agent (start one: `fleetpulse agent`, or wait for it to announce itself)"
            )
        asked = res.describe(resources)
        for name, units in zip(request.names, request.units, strict=True):
            col = self.cols.get(name)
            offered = 0 if col is None else int((live & (self.offer[:, col] > 0)).sum())
            if offered == 0:
                return (
                    f"needs {asked}, and no live agent offers {name!r} (of {n}); start agents "
                    f"with --resource {name}=AMOUNT, or ask for less"
                )
            assert col is not None
            free = np.where(live, self.offer[:, col] - self.used[:, col], -1)
            if not (free >= units).any():
                best = int(np.argmax(free))
                amount = res.show_amount(name, res.from_units(int(free[best])))
                return (
                    f"needs {asked}: no live agent has {name} "
                    f"{res.show_amount(name, res.from_units(units))} free (most: {amount} on "
                    f"{self.ids[best]}; {offered} of {n} agents offer {name}); it waits for "
                    f"room (scale something down, add agents, or ask for less)"
                )
        if not (live & (self.offer[:, 0] - self.used[:, 0] >= res.UNIT)).any():
            return (
                f"every live agent ({n}) runs as many replicas as its --max-replicas allows; "
                "it waits for a free slot"
            )
        if per_node is not None:
            without = self.fits(request, dep, None, now)
            if without.any() and not self.fits(request, dep, per_node, now).any():
                return (
                    f"max_replicas_per_node {per_node} reached on every agent with room; "
                    "it waits for another agent (or raise max_replicas_per_node)"
                )
        if request.gpu_units and self.fits(request, dep, per_node, now).any():
            return (
                f"needs {asked}: the agents with that much GPU free have it split over "
                "devices already shared; it waits for a device to free up"
            )
        return f"needs {asked}: no live agent has all of it free at once; it waits for room"

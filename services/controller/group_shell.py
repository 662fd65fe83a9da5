"""The group's I/O: member heartbeats, lease watches, compare-and-set takes and hand-overs.

See group.py for the rules. This shell only moves KV entries in and out of `GroupCore` and tells
the controller service when a partition starts or stops being its own (`on_take`, `on_drop`).
A member that cannot refresh its own entry for a whole member TTL stops processing everything
(self-fencing): by then the others may have taken over.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from shared.bus import Bus
from shared.clock import SYSTEM_CLOCK, Clock
from shared.errors import BusError, KVConflict, WireError
from shared.subjects import KV_CONTROLLERS

from .group import GroupCore, Lease, Lose, Release, Take, lease_key, lease_partition

log = logging.getLogger(__name__)

KV_LEASES = "fp_leases"

OnTake = Callable[[int, int], Awaitable[None]]
OnDrop = Callable[[int], Awaitable[None]]


class GroupRunner:
    def __init__(
        self,
        bus: Bus,
        core: GroupCore,
        on_take: OnTake,
        on_drop: OnDrop,
        *,
        heartbeat_s: float,
        describe: Callable[[], dict[str, Any]],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.bus = bus
        self.core = core
        self.on_take = on_take
        self.on_drop = on_drop
        self.heartbeat_s = heartbeat_s
        self.describe = describe
        self.clock = clock
        self._tasks: list[asyncio.Task[None]] = []
        self._last_beat_ok = clock.monotonic()
        self._ready = (asyncio.Event(), asyncio.Event())

    async def start(self) -> None:
        self.members_kv = await self.bus.kv(KV_CONTROLLERS, ttl=self.core.member_ttl_s * 2)
        self.leases_kv = await self.bus.kv(KV_LEASES)
        await self._beat()
        self._tasks = [
            asyncio.create_task(self._watch_members(), name="group-members"),
            asyncio.create_task(self._watch_leases(), name="group-leases"),
        ]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in self._ready)), 10)
        self._tasks.append(asyncio.create_task(self._loop(), name="group-loop"))

    async def _watch_members(self) -> None:
        async for entry in await self.members_kv.watch():
            if entry is None:
                self._ready[0].set()
            elif entry.op == "PUT":
                self.core.member_seen(entry.key, self.clock.monotonic())
            else:
                self.core.member_left(entry.key)

    async def _watch_leases(self) -> None:
        async for entry in await self.leases_kv.watch():
            if entry is None:
                self._ready[1].set()
                continue
            p = lease_partition(entry.key)
            if p is None:
                continue
            if entry.op != "PUT":
                self.core.lease_deleted(p)
                continue
            try:
                self.core.lease_seen(Lease.decode(p, entry.value, entry.revision))
            except WireError as exc:
                log.warning("ignoring %s/%s: %s", KV_LEASES, entry.key, exc)

    async def _loop(self) -> None:
        while True:
            await self._beat()
            now = self.clock.monotonic()
            if now - self._last_beat_ok > self.core.member_ttl_s:
                for p in sorted(self.core.owned):  # the others may have taken over by now
                    log.warning("cannot refresh membership: dropping partition %d", p)
                    await self.on_drop(p)
                    self.core.released(p)
            else:
                await self._apply(self.core.plan(now))
            await asyncio.sleep(self.heartbeat_s)

    async def _beat(self) -> None:
        doc = {"v": 1, "kind": "controller", "member_id": self.core.member_id, **self.describe()}
        try:
            await self.members_kv.put(self.core.member_id, json.dumps(doc).encode())
            self._last_beat_ok = self.clock.monotonic()
            self.core.member_seen(self.core.member_id, self._last_beat_ok)
        except BusError as exc:
            log.warning("membership refresh failed: %s", exc)

    async def _apply(self, actions: list[Take | Release | Lose]) -> None:
        for a in actions:
            if isinstance(a, Take):
                lease = await self._cas(a.partition, self.core.member_id, a.lease, bump=True)
                if lease is not None:
                    self.core.took(lease)
                    log.info("took partition %d at epoch %d", a.partition, lease.epoch)
                    await self.on_take(a.partition, lease.epoch)
            elif isinstance(a, Release):
                await self.on_drop(a.partition)  # stop processing before letting go
                self.core.released(a.partition)
                await self._cas(a.partition, "", a.lease, bump=False)
                log.info("handed over partition %d", a.partition)
            else:
                log.warning("lost partition %d to another member: stopping it", a.partition)
                await self.on_drop(a.partition)
                self.core.released(a.partition)

    async def _cas(self, p: int, owner: str, read: Lease | None, *, bump: bool) -> Lease | None:
        epoch = (read.epoch if read else 0) + (1 if bump else 0)
        value = Lease(p, owner, epoch, 0).encode()
        try:
            if read is None:
                rev = await self.leases_kv.create(lease_key(p), value)
            else:
                rev = await self.leases_kv.update(lease_key(p), value, read.revision)
        except KVConflict:
            return None  # someone else moved first; the watch shows who
        except BusError as exc:
            log.warning("lease write for partition %d failed: %s", p, exc)
            return None
        return Lease(p, owner, epoch, rev)

    async def step_down(self) -> None:
        """SIGTERM: hand every partition over and leave, so successors take over at once."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for p in sorted(self.core.owned):
            await self.on_drop(p)
            lease = self.core.leases.get(p)
            self.core.released(p)
            if lease is not None and lease.owner == self.core.member_id:
                await self._cas(p, "", lease, bump=False)
        with contextlib.suppress(BusError):
            await self.members_kv.delete(self.core.member_id)

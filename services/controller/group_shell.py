"""The group's I/O: member heartbeats, lease watches, compare-and-set takes and hand-overs.

See group.py for the rules. This shell only moves KV entries in and out of `GroupCore` and tells
the controller service when a partition starts or stops being its own (`on_take`, `on_drop`).
A member that cannot refresh its own entry for a whole member TTL stops processing everything
(self-fencing): by then the others may have taken over.

A watch can go quiet without an error: it is an R1 consumer on one node of the bucket's stream,
and when that node dies nats-py notices only after 10-20 s. A quiet membership watch would make
every other member look dead after one TTL, and this member would take every partition. So each
heartbeat put must come back on our own watch: when one has not within half a TTL, the watch is
reopened and nothing is taken until it echoes again (a reopened watch repeats old entries, so
only a newer revision counts as a sign of life). Leases are re-read every `LEASE_RESYNC_S` with
gets (served by any replica), so a quiet lease watch neither hides a successor nor keeps a
compare-and-set retrying a revision long gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from shared.bus import Bus, KVWatcher, RateLimiter
from shared.clock import SYSTEM_CLOCK, Clock
from shared.errors import BusError, KVConflict, WireError
from shared.kv import buckets, envelope
from shared.kv.group import ControllerMember, lease_key, lease_partition
from shared.subjects import KV_CONTROLLERS

from .group import GroupCore, Lease, Lose, Release, Take

log = logging.getLogger(__name__)

KV_LEASES = buckets.LEASES.name
LEASE_RESYNC_S = 2.0
LOOP_ERROR_LOG_INTERVAL_S = 10.0
_UNECHOED_KEPT = 64

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
        describe: Callable[[], Mapping[str, Any]],
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
        self._members_task: asyncio.Task[None] | None = None
        self._members_watch: KVWatcher | None = None
        self._member_revs: dict[str, int] = {}
        self._unechoed: deque[tuple[int, float]] = deque(maxlen=_UNECHOED_KEPT)
        """Our heartbeat puts (revision, when) that our own watch has not shown yet."""
        self._echo_timeout_s = core.member_ttl_s / 2
        self._reopened_at = clock.monotonic()
        self._stopping = False
        self.writes_ok_until = -math.inf
        """Monotonic time until which our leases are certainly still ours (see `writable`)."""
        self._last_sent_ok = -math.inf
        self._writable = asyncio.Event()
        self.loop_errors = 0
        self._loop_error_log = RateLimiter(LOOP_ERROR_LOG_INTERVAL_S, self.clock)

    async def start(self) -> None:
        self.members_kv = await self.bus.kv(KV_CONTROLLERS, ttl=self.core.member_ttl_s * 2)
        self.leases_kv = await self.bus.kv(KV_LEASES)
        await self._beat()
        self._members_task = asyncio.create_task(self._watch_members(), name="group-members")
        self._tasks = [asyncio.create_task(self._watch_leases(), name="group-leases")]
        try:
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in self._ready)), 10)
        except BaseException:
            # leave nothing running, so that the caller may simply call start() again
            await self._cancel_tasks()
            self._ready = (asyncio.Event(), asyncio.Event())
            raise
        self._tasks.append(asyncio.create_task(self._loop(), name="group-loop"))
        self._tasks.append(asyncio.create_task(self._resync_leases(), name="group-resync"))

    async def _watch_members(self) -> None:
        try:
            watcher = self._members_watch = await self.members_kv.watch()
        except BusError as exc:
            log.warning("cannot watch the group's members: %s", exc)
            return  # our heartbeats go unechoed, so the loop opens it again
        async for entry in watcher:
            if entry is None:
                self._ready[0].set()
            elif entry.op == "PUT":
                self._member_put(entry.key, entry.revision)
            else:
                self._member_revs.pop(entry.key, None)
                self.core.member_left(entry.key)

    def _member_put(self, member: str, revision: int) -> None:
        if member == self.core.member_id:
            while self._unechoed and self._unechoed[0][0] <= revision:
                self._unechoed.popleft()
        if revision > self._member_revs.get(member, 0):
            self._member_revs[member] = revision
            self.core.member_seen(member, self.clock.monotonic())

    def _members_view_stale(self, now: float) -> bool:
        return bool(self._unechoed) and now - self._unechoed[0][1] > self._echo_timeout_s

    async def _reopen_members_watch(self) -> None:
        log.warning("the group's member watch went quiet: reopening it, taking nothing meanwhile")
        if self._members_task is not None:
            self._members_task.cancel()
            await asyncio.gather(self._members_task, return_exceptions=True)
        if self._members_watch is not None:
            with contextlib.suppress(BusError):
                await self._members_watch.stop()
            self._members_watch = None
        self._members_task = asyncio.create_task(self._watch_members(), name="group-members")

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
        while not self._stopping:
            try:
                await self._step()
            except asyncio.CancelledError:
                raise
            except BusError as exc:
                # NATS trouble (a busy or restarting server, a stop under way) is expected
                # here and retried: a line, no traceback
                self.loop_errors += 1
                if self._loop_error_log.allow() and not self._stopping:
                    log.warning(
                        "group step failed (%d so far): %s; going on", self.loop_errors, exc
                    )
            except Exception:
                # a step that fails must not end the member: with the loop gone, its entry
                # would expire and it would never take a partition again, silently
                self.loop_errors += 1
                if self._loop_error_log.allow():
                    log.exception("group step failed (%d so far); going on", self.loop_errors)
            await asyncio.sleep(self.heartbeat_s)

    async def _step(self) -> None:
        """One heartbeat and, if it went through, one plan applied."""
        await self._beat()
        now = self.clock.monotonic()
        if now - self._last_beat_ok > self.core.member_ttl_s:
            # A beat that timed out while our own loop was busy (a first tick over a huge
            # fleet can take seconds) says nothing about NATS: try once more before letting
            # go. If another member took over meanwhile, its leases show up as Lose actions,
            # and its higher epoch fences our writes either way.
            await self._beat()
            now = self.clock.monotonic()
        if now - self._last_beat_ok > self.core.member_ttl_s:
            for p in sorted(self.core.owned):  # the others may have taken over by now
                log.warning("cannot refresh membership: dropping partition %d", p)
                await self.on_drop(p)
                self.core.released(p)
        else:
            actions = self.core.plan(now)
            if self._members_view_stale(now):
                # others may only look dead: stop what we lost, take nothing
                actions = [a for a in actions if isinstance(a, Lose)]
                if now - self._reopened_at > self._echo_timeout_s:
                    self._reopened_at = now
                    await self._reopen_members_watch()
            await self._apply(actions)

    async def _resync_leases(self) -> None:
        while not self._stopping:
            await asyncio.sleep(LEASE_RESYNC_S)
            for p in range(self.core.partitions):
                try:
                    entry = await self.leases_kv.get(lease_key(p))
                except BusError:
                    break  # NATS is busy recovering: next round
                if entry is None:
                    continue
                with contextlib.suppress(WireError):  # the watch logs it
                    self.core.lease_seen(Lease.decode(p, entry.value, entry.revision))

    def member_entry(self) -> ControllerMember:
        """Our fp_controllers value: `describe()` says what we do (partitions, pending, apps)."""
        d = self.describe()
        return ControllerMember(
            self.core.member_id,
            partitions=tuple(d.get("partitions", ())),
            pending=int(d.get("pending", 0)),
            apps=int(d.get("apps", 0)),
        )

    async def _beat(self) -> None:
        value = envelope.encode(self.member_entry())
        sent = self.clock.monotonic()
        try:
            rev = await self.members_kv.put(self.core.member_id, value)
            self._last_beat_ok = self.clock.monotonic()
            self._unechoed.append((rev, self._last_beat_ok))
            self.core.member_seen(self.core.member_id, self._last_beat_ok)
        except BusError as exc:
            log.warning("membership refresh failed: %s", exc)
            return
        gap = sent - self._last_sent_ok
        self._last_sent_ok = sent
        if gap > self.core.member_ttl_s / 2 and not await self._leases_still_ours():
            return  # the loop lets go of what we lost before writes may go on
        self.writes_ok_until = sent + self.core.member_ttl_s / 2
        self._writable.set()

    async def _leases_still_ours(self) -> bool:
        """After a gap in our heartbeats another member may have taken over: read our leases
        (their changes also reach the core, whose plan then drops what we lost)."""
        ok = True
        for p, epoch in sorted(self.core.owned.items()):
            try:
                entry = await self.leases_kv.get(lease_key(p))
            except BusError:
                return False
            if entry is None:
                ok = False
                continue
            with contextlib.suppress(WireError):
                lease = Lease.decode(p, entry.value, entry.revision)
                self.core.lease_seen(lease)
                ok = ok and lease.owner == self.core.member_id and lease.epoch == epoch
        return ok

    async def writable(self) -> None:
        """Return once a write may go out: our last heartbeat was sent less than half a member
        TTL ago (and, after a gap, our leases were read back as ours). Another member takes a
        partition over only after a full TTL without our heartbeats, so a write sent now lands
        before that unless it is delayed in flight by more than TTL/2. This is what keeps a
        paused owner's queued writes from landing on keys its successor took over without
        rewriting them."""
        while self.clock.monotonic() >= self.writes_ok_until and not self._stopping:
            self._writable.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._writable.wait(), self.heartbeat_s)

    async def _apply(self, actions: list[Take | Release | Lose]) -> None:
        for a in actions:
            if isinstance(a, Take):
                lease = await self._cas(a.partition, self.core.member_id, a.lease, bump=True)
                if lease is not None:
                    self.core.took(lease)
                    log.info("took partition %d at epoch %d", a.partition, lease.epoch)
                    await self._start(lease)
            elif isinstance(a, Release):
                await self.on_drop(a.partition)  # stop processing before letting go
                self.core.released(a.partition)
                await self._cas(a.partition, "", a.lease, bump=False)
                log.info("handed over partition %d", a.partition)
            else:
                log.warning("lost partition %d to another member: stopping it", a.partition)
                await self.on_drop(a.partition)
                self.core.released(a.partition)

    async def _start(self, lease: Lease) -> None:
        """Start a partition we just took; if that fails, hand it straight back: a lease held
        with nothing reading the partition would leave its apps undecided until we leave."""
        try:
            await self.on_take(lease.partition, lease.epoch)
        except BusError as exc:
            log.warning("could not start partition %d (%s): handing it back", lease.partition, exc)
            await self.on_drop(lease.partition)
            self.core.released(lease.partition)
            await self._cas(lease.partition, "", lease, bump=False)

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

    async def _cancel_tasks(self) -> None:
        tasks = [*self._tasks, *([self._members_task] if self._members_task else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks, self._members_task = [], None

    async def step_down(self) -> None:
        """SIGTERM: hand every partition over and leave, so successors take over at once."""
        # the loops also stop on this flag: Python 3.11's wait_for (inside every nats-py
        # request) can swallow a cancellation that lands as the reply arrives
        self._stopping = True
        await self._cancel_tasks()
        for p in sorted(self.core.owned):
            await self.on_drop(p)
            lease = self.core.leases.get(p)
            self.core.released(p)
            if lease is not None and lease.owner == self.core.member_id:
                await self._cas(p, "", lease, bump=False)
        with contextlib.suppress(BusError):
            await self.members_kv.delete(self.core.member_id)

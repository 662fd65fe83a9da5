"""Write-behind for the controller's KV values: the latest value per key, retried until it lands.

How it works: the control loop hands each KV write (a target set, a membership, a status, a
delete) to `KVWriter.submit` and goes on; one task carries them out in the order they were
submitted. Per (bucket, key) only the newest is kept: a newer value replaces a pending or failing
one and moves to the back of the queue, so what lands is what the core decided last, in the order
it decided it. A write that fails (a value over the server's max_payload, a timeout, a lost
connection, a revision race that kept losing) stays queued and is tried again after a backoff
that doubles from `first_retry_s` to `max_retry_s`; a newer value for the key is tried at once.
A failing key is logged when it first fails and then at most once per `warn_every_s`, and once
more when it lands; over all keys at most LOG_BURST lines a second (then a count of the rest).
Up to `concurrency` writes to different keys are in flight at once; a failed write halves that,
and writes that land grow it back by one at a time (a burst of a huge deployment's writes on a
busy server must not crowd out everything else, the member's own lease refresh included).

Why: a write awaited inside the tick made the tick wait for the KV round trip and for whatever
ingest callbacks ran meanwhile (in a quiet window the fp_status refresh every 2 s set the loop's
p99 at 16,384 replicas, docs/benchmarks.md "Fleet scale"), a slow KV stalled deciding and
probing with it, and a write that failed was dropped until the value changed again: a target set
over max_payload meant a fleet that never started. Fencing stays with the write function: it
stamps the epoch it holds at write time and drops a value for an app it no longer owns (or owns
under another epoch than the decision was made at), and `FencedWriter` refuses a key a newer
owner holds; those writes are done, not failed.

`WriteBacklog` is the bookkeeping (pure: every call takes `now`); `KVWriter` is the task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from shared.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)

T = TypeVar("T")
Key = Hashable

LOG_BURST = 10
"""KV write log lines per second at most, over all keys."""
FIRST_RETRY_S = 0.5
MAX_RETRY_S = 30.0
WARN_EVERY_S = 60.0


@dataclass(slots=True)
class _Entry(Generic[T]):
    item: T
    gen: int
    due: float
    failures: int = 0
    warned_at: float = -math.inf
    in_flight: bool = False


@dataclass(frozen=True, slots=True)
class Failure:
    failures: int
    """Failed attempts in a row for this key (this one included)."""
    retry_in: float
    warn: bool
    """Log this one (the first of a streak, then at most once per `warn_every_s`)."""


class WriteBacklog(Generic[T]):
    """Queued writes by key, newest value only, with a per-key retry schedule."""

    def __init__(
        self,
        first_retry_s: float = FIRST_RETRY_S,
        max_retry_s: float = MAX_RETRY_S,
        warn_every_s: float = WARN_EVERY_S,
    ) -> None:
        self.first_retry_s = first_retry_s
        self.max_retry_s = max_retry_s
        self.warn_every_s = warn_every_s
        # ordered by a linked list: a dict used as a queue leaves the slots of removed keys in
        # front, and `next` walked them all (after a start's 40,000 writes, ~8 µs a call, 8%
        # of a 10,000-app controller's CPU in its steady state)
        self._entries: OrderedDict[Key, _Entry[T]] = OrderedDict()
        self._gen = 0

    def __len__(self) -> int:
        return len(self._entries)

    def submit(self, key: Key, item: T, now: float) -> None:
        """Queue `item` for `key`, replacing whatever was queued for it; due at once."""
        self._gen += 1
        e = self._entries.pop(key, None)
        if e is None:
            e = _Entry(item, self._gen, now)
        else:
            # keeps its failure streak (backoff, warnings) but the new value is tried now
            e.item, e.gen, e.due = item, self._gen, now
        self._entries[key] = e  # to the back: the order is that of the latest submits

    def next(self, now: float) -> tuple[Key, T, int] | None:
        """The first queued write that is due and not being written; marks it in flight."""
        for key, e in self._entries.items():
            if not e.in_flight and e.due <= now:
                e.in_flight = True
                return key, e.item, e.gen
        return None

    def landed(self, key: Key, gen: int) -> int:
        """The write of `gen` is done (written, or dropped by fencing). Returns the failures
        before it. A newer value submitted meanwhile stays queued."""
        e = self._entries[key]
        e.in_flight = False
        failures, e.failures = e.failures, 0
        if e.gen == gen:
            del self._entries[key]
        return failures

    def failed(self, key: Key, gen: int, now: float) -> Failure:
        """The write of `gen` failed: try again after the backoff (a newer value: at once)."""
        e = self._entries[key]
        e.in_flight = False
        e.failures += 1
        retry_in = min(self.max_retry_s, self.first_retry_s * 2 ** (e.failures - 1))
        if e.gen == gen:
            e.due = now + retry_in
        warn = e.failures == 1 or now - e.warned_at >= self.warn_every_s
        if warn:
            e.warned_at = now
        return Failure(e.failures, retry_in, warn)

    def wake_at(self) -> float | None:
        """When the next queued write falls due (None: nothing waits)."""
        dues = [e.due for e in self._entries.values() if not e.in_flight]
        return min(dues) if dues else None


Write = Callable[[T], Awaitable[None]]


class KVWriter(Generic[T]):
    """Runs a `WriteBacklog`: `submit` from the control loop, `run` as a task."""

    def __init__(
        self,
        write: Write[T],
        *,
        describe: Callable[[Key], str] = str,
        backlog: WriteBacklog[T] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        on_done: Callable[[T, float, bool], None] | None = None,
        concurrency: int = 1,
    ) -> None:
        self._write = write
        self._describe = describe
        self.backlog: WriteBacklog[T] = WriteBacklog() if backlog is None else backlog
        self._clock = clock
        self._on_done = on_done
        """Called after each attempt with its item, duration and whether it landed."""
        self._concurrency = concurrency
        """Most writes in flight at once, each to another key (a key's writes never overlap)."""
        self.limit = concurrency
        """Writes allowed in flight now: halved by a failed write, grown by one after `limit`
        writes in a row land (a burst of a huge deployment's writes must not crowd out the
        member's own lease refresh on a busy server)."""
        self._in_flight = 0
        self._landed_streak = 0
        self._slot_free = asyncio.Event()
        self._log_window = (-math.inf, 0)
        """(start, lines) of the current one-second log window."""
        self._suppressed = 0
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self.written = 0
        self.failures = 0

    def submit(self, key: Key, item: T) -> None:
        self.backlog.submit(key, item, self._clock.monotonic())
        self._idle.clear()
        self._wake.set()

    async def flush(self, timeout_s: float) -> bool:
        """Wait until nothing is queued (True) or `timeout_s` passed (False)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        return self._idle.is_set()

    async def run(self) -> None:
        if self._concurrency == 1:
            await self._worker()
            return
        workers = [asyncio.create_task(self._worker()) for _ in range(self._concurrency)]
        try:
            await asyncio.gather(*workers)
        finally:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    async def _worker(self) -> None:
        while True:
            if self._in_flight >= self.limit:
                self._slot_free.clear()
                await self._slot_free.wait()
                continue
            now = self._clock.monotonic()
            nxt = self.backlog.next(now)
            if nxt is None:
                await self._sleep(now)
                continue
            key, item, gen = nxt
            started = time.perf_counter()
            self._in_flight += 1
            try:
                await self._write(item)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # whatever it was, the value must still land
                self._failed(key, item, gen, exc, time.perf_counter() - started)
            else:
                self._landed(key, item, gen, time.perf_counter() - started)
            finally:
                self._in_flight -= 1
                self._slot_free.set()

    async def _sleep(self, now: float) -> None:
        if not len(self.backlog):
            self._idle.set()
        wake = self.backlog.wake_at()
        self._wake.clear()
        timeout = None if wake is None else max(0.0, wake - now)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    def _landed(self, key: Key, item: T, gen: int, took: float) -> None:
        self.written += 1
        self._landed_streak += 1
        if self._landed_streak >= self.limit and self.limit < self._concurrency:
            self.limit += 1
            self._landed_streak = 0
        before = self.backlog.landed(key, gen)
        if before and self._may_log():
            log.warning("wrote %s after %d failed attempt(s)", self._describe(key), before)
        if self._on_done is not None:
            self._on_done(item, took, True)

    def _failed(self, key: Key, item: T, gen: int, exc: Exception, took: float) -> None:
        self.failures += 1
        self.limit = max(1, self.limit // 2)
        self._landed_streak = 0
        f = self.backlog.failed(key, gen, self._clock.monotonic())
        if f.warn and self._may_log():
            log.warning(
                "writing %s failed (%d in a row): %s: %s; retrying in %.3g s",
                self._describe(key), f.failures, type(exc).__name__, exc, f.retry_in,
            )  # fmt: skip
        if self._on_done is not None:
            self._on_done(item, took, False)

    def _may_log(self) -> bool:
        """At most LOG_BURST lines per second over all keys (a burst of many failing keys must
        not flood the log); the next line after a pause says how many were left out."""
        now = self._clock.monotonic()
        start, lines = self._log_window
        if now - start >= 1.0:
            start, lines = now, 0
        if lines >= LOG_BURST:
            self._suppressed += 1
            return False
        self._log_window = (start, lines + 1)
        if self._suppressed:
            log.warning("(%d more KV write messages since the last one)", self._suppressed)
            self._suppressed = 0
        return True

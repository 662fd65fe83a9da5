"""An in-memory Bus for unit tests: no sockets, same semantics as `NatsBus`.

How it works: a `FakeServer` plays nats-server. It holds every subscription of every `FakeBus`
connection made with `server.connect()`, so a test can put a replica and a router on separate
connections. `publish` routes at once into each matching subscription's queue (a queue group
gets each message on one member, round-robin per subject and group); each subscription drains
its queue on its own task, so delivery is asynchronous and ordered per subscription, as with
NATS. A message with a reply subject and no subscriber makes the server answer the reply inbox
with a 503 status, which is how requests fail with `NoResponders`.

`flush()` is stronger than NATS: it returns once every message published so far has been handled
(handler returned) by every subscription, except the one whose handler calls it. Unit tests rely
on that instead of sleeping.

KV buckets keep one revision counter each and up to `history` revisions per key; `ttl` expires
entries lazily against the server's clock (pass a `FakeClock` to test it). Watchers get their
initial values, `None`, then live changes, all queued synchronously at write time.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

from shared.bus import (
    DEFAULT_MAX_PAYLOAD,
    KV,
    NO_RESPONDERS_STATUS,
    STATUS_HEADER,
    Bus,
    Handler,
    HandlerGuard,
    InlineHandler,
    KVEntry,
    KVWatcher,
    MaxPayloadExceeded,
    Msg,
    QueueResponseStream,
    ResponseStream,
    Subscription,
    subject_matches,
    validate_bucket,
    validate_key,
    validate_subject,
)
from shared.clock import SYSTEM_CLOCK, Clock
from shared.errors import BucketNotFound, BusError, BusTimeout, KVConflict, UsageError

CLOSE_GRACE_S = 1.0

_current_sub: contextvars.ContextVar[_FakeSub | None] = contextvars.ContextVar(
    "fakebus_current_sub", default=None
)


class FakeServer:
    """The shared in-memory 'nats-server' that FakeBus connections talk through."""

    def __init__(self, *, max_payload: int = DEFAULT_MAX_PAYLOAD, clock: Clock = SYSTEM_CLOCK):
        self.max_payload = max_payload
        self.clock = clock
        self._subs: list[_FakeSub] = []
        self._round_robin: dict[tuple[str, str], int] = {}
        self._buckets: dict[str, _Bucket] = {}
        self._conn_ids = itertools.count(1)
        self.lose: Callable[[Msg], bool] | None = None
        """Tests: a message for which this returns True is lost in transit, as when a NATS node
        restarts between sender and receiver (what is sent after it still arrives)."""

    def connect(self, name: str = "fake") -> FakeBus:
        return FakeBus(self, name, next(self._conn_ids))

    def interest(self, subject: str) -> int:
        """How many subscriptions a message on `subject` would match (for test assertions)."""
        return sum(1 for s in self._subs if subject_matches(s.subject, subject))

    def route(self, msg: Msg) -> None:
        if self.lose is not None and self.lose(msg):
            return
        matched = [s for s in self._subs if subject_matches(s.subject, msg.subject)]
        if not matched:
            if msg.reply:
                self.route(Msg(msg.reply, b"", None, {STATUS_HEADER: NO_RESPONDERS_STATUS}))
            return
        groups: dict[tuple[str, str], list[_FakeSub]] = {}
        for sub in matched:
            if sub.queue is None:
                sub.deliver(msg)
            else:
                groups.setdefault((sub.subject, sub.queue), []).append(sub)
        for group, members in groups.items():
            turn = self._round_robin.get(group, 0)
            self._round_robin[group] = turn + 1
            members[turn % len(members)].deliver(msg)

    def _add(self, sub: _FakeSub) -> None:
        self._subs.append(sub)

    def _remove(self, sub: _FakeSub) -> None:
        with contextlib.suppress(ValueError):
            self._subs.remove(sub)

    def _targets(self) -> list[tuple[_FakeSub, int]]:
        me = _current_sub.get()
        return [(s, s.enqueued) for s in self._subs if s is not me]

    def _bucket(self, name: str, history: int, ttl: float | None, create: bool) -> _Bucket:
        bucket = self._buckets.get(name)
        if bucket is None:
            if not create:
                raise BucketNotFound(name)
            bucket = self._buckets[name] = _Bucket(name, history, ttl, self.clock)
        return bucket


class _FakeSub:
    """One subscription: a queue drained by its own task, one handler call at a time."""

    def __init__(self, conn: FakeBus, subject: str, queue: str | None, guard: HandlerGuard):
        self.conn = conn
        self.subject = subject
        self.queue = queue
        self._guard = guard
        self._inbox: asyncio.Queue[Msg | None] = asyncio.Queue()
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self.enqueued = 0
        self.processed = 0
        self.closed = False
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"fakebus:{subject}")

    @property
    def handler_errors(self) -> int:
        return self._guard.errors

    def deliver(self, msg: Msg) -> None:
        if not self.closed:
            self.enqueued += 1
            self._inbox.put_nowait(msg)

    async def _run(self) -> None:
        _current_sub.set(self)
        while (msg := await self._inbox.get()) is not None:
            try:
                if not self.closed:  # NATS drops what is pending at unsubscribe
                    await self._guard(msg)
            finally:
                self.processed += 1
                self._wake(self.processed)

    def _wake(self, upto: int) -> None:
        still: list[tuple[int, asyncio.Future[None]]] = []
        for count, fut in self._waiters:
            if count > upto:
                still.append((count, fut))
            elif not fut.done():
                fut.set_result(None)
        self._waiters = still

    async def wait_processed(self, count: int) -> None:
        """Return once `count` messages were handled, or the subscription closed."""
        if self.closed or self.processed >= count:
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((count, fut))
        await fut

    async def unsubscribe(self) -> None:
        """Stop delivery; a handler running now finishes (it may be the one calling this)."""
        if not self.closed:
            self.closed = True
            self.conn.server._remove(self)
            self.conn._subs.discard(self)
            self._inbox.put_nowait(None)
            self._wake(self.enqueued)

    async def cancel(self) -> None:
        """Unsubscribe and cancel the task (the connection is closing)."""
        await self.unsubscribe()
        if self.task is not asyncio.current_task() and not self.task.done():
            self.task.cancel()
            # bounded: a handler that swallows the cancellation must not hang close()
            await asyncio.wait({self.task}, timeout=CLOSE_GRACE_S)


class FakeBus:
    """One connection to a FakeServer. Implements `shared.bus.Bus`."""

    def __init__(self, server: FakeServer, name: str, conn_id: int) -> None:
        self.server = server
        self.name = name
        self._id = conn_id
        self._inboxes = itertools.count(1)
        self._subs: set[_FakeSub] = set()
        self._watchers: set[_FakeWatcher] = set()
        self._streams: set[QueueResponseStream] = set()
        self._closed = False

    def interrupt_streams(self) -> None:
        """Tests: as if the connection dropped and came back, losing what was in flight."""
        for stream in list(self._streams):
            stream.interrupt()

    @property
    def max_payload(self) -> int:
        return self.server.max_payload

    def new_inbox(self) -> str:
        return f"_INBOX.c{self._id}n{next(self._inboxes)}"

    def _check_open(self) -> None:
        if self._closed:
            raise BusError(f"fake connection {self.name!r} is closed")

    async def publish(
        self,
        subject: str,
        data: bytes,
        *,
        reply: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.publish_nowait(subject, data, reply=reply, headers=headers)

    def publish_nowait(
        self,
        subject: str,
        data: bytes,
        *,
        reply: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        # the fake routes at once, for both: its subscriptions' tasks deliver in order
        self._check_open()
        validate_subject(subject, wildcards=False)
        if reply:
            validate_subject(reply, wildcards=False)
        if len(data) > self.max_payload:
            raise MaxPayloadExceeded(subject, len(data), self.max_payload)
        hdrs = dict(headers) if headers else None
        self.server.route(Msg(subject, bytes(data), reply or None, hdrs))

    async def subscribe(
        self, subject: str, handler: Handler, *, queue: str | None = None
    ) -> Subscription:
        return self._subscribe(subject, handler, queue)

    async def subscribe_inline(
        self, subject: str, handler: InlineHandler, *, queue: str | None = None
    ) -> Subscription:
        # the fake runs it on the subscription's task: same order, same guard, one turn later
        async def run(msg: Msg) -> None:
            handler(msg)

        return self._subscribe(subject, run, queue)

    def _subscribe(self, subject: str, handler: Handler, queue: str | None) -> _FakeSub:
        self._check_open()
        validate_subject(subject, wildcards=True)
        if queue is not None and (not queue or any(c.isspace() for c in queue)):
            raise UsageError(f"invalid queue group name {queue!r}")
        sub = _FakeSub(self, subject, queue, HandlerGuard(subject, handler, self.server.clock))
        self.server._add(sub)
        self._subs.add(sub)
        return sub

    async def request(
        self,
        subject: str,
        data: bytes,
        *,
        timeout: float,  # noqa: ASYNC109 - NATS-style API: the timeout is the request's
        headers: Mapping[str, str] | None = None,
    ) -> Msg:
        stream = await self.request_stream(subject, data, headers=headers)
        try:
            return await stream.next(timeout)
        finally:
            await stream.close()

    async def request_stream(
        self, subject: str, data: bytes, *, headers: Mapping[str, str] | None = None
    ) -> ResponseStream:
        validate_subject(subject, wildcards=False)
        inbox = self.new_inbox()
        stream = QueueResponseStream(subject)
        sub = self._subscribe(inbox, stream.push, None)
        self._streams.add(stream)

        async def close() -> None:
            self._streams.discard(stream)
            await sub.unsubscribe()

        stream.attach(close)
        try:
            await self.publish(subject, data, reply=inbox, headers=headers)
        except BaseException:
            await stream.close()
            raise
        return stream

    async def kv(
        self, bucket: str, *, history: int = 1, ttl: float | None = None, create: bool = True
    ) -> KV:
        self._check_open()
        validate_bucket(bucket, history, ttl)
        return _FakeKV(self, self.server._bucket(bucket, history, ttl, create))

    async def flush(self, timeout: float = 5.0) -> None:  # noqa: ASYNC109
        self._check_open()
        waits = [sub.wait_processed(count) for sub, count in self.server._targets()]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), timeout)
        except TimeoutError:
            raise BusTimeout(f"flush: messages still being handled after {timeout:g}s") from None

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for watcher in list(self._watchers):
            await watcher.stop()
        for sub in list(self._subs):
            await sub.cancel()


@dataclass(frozen=True, slots=True)
class _Stored:
    entry: KVEntry
    stored_at: float


class _Bucket:
    def __init__(self, name: str, history: int, ttl: float | None, clock: Clock) -> None:
        self.name = name
        self.history = history
        self.ttl = ttl
        self._clock = clock
        self.revision = 0
        self._keys: dict[str, list[_Stored]] = {}
        self.watchers: list[_FakeWatcher] = []

    def _expire(self) -> None:
        if self.ttl is None:
            return
        cutoff = self._clock.monotonic() - self.ttl
        for key, revs in list(self._keys.items()):
            kept = [r for r in revs if r.stored_at > cutoff]
            if kept:
                self._keys[key] = kept
            else:
                del self._keys[key]

    def last(self, key: str) -> KVEntry | None:
        """The key's newest revision, a delete marker included."""
        self._expire()
        revs = self._keys.get(key)
        return revs[-1].entry if revs else None

    def append(self, key: str, value: bytes, op: Literal["PUT", "DEL"]) -> int:
        self._expire()
        self.revision += 1
        entry = KVEntry(self.name, key, bytes(value), self.revision, op)
        revs = self._keys.setdefault(key, [])
        revs.append(_Stored(entry, self._clock.monotonic()))
        del revs[: -self.history]
        for watcher in list(self.watchers):
            watcher.offer(entry)
        return entry.revision

    def snapshot(self, pattern: str | Sequence[str], include_history: bool) -> list[KVEntry]:
        self._expire()
        patterns = [pattern] if isinstance(pattern, str) else pattern
        entries: list[KVEntry] = []
        for key, revs in self._keys.items():
            if not any(subject_matches(p, key) for p in patterns):
                continue
            if include_history:
                entries.extend(r.entry for r in revs)
            elif revs[-1].entry.op == "PUT":
                entries.append(revs[-1].entry)
        return sorted(entries, key=lambda e: e.revision)


class _FakeKV:
    __slots__ = ("_bucket", "_conn")

    def __init__(self, conn: FakeBus, bucket: _Bucket) -> None:
        self._conn = conn
        self._bucket = bucket

    def _check(self, key: str) -> None:
        self._conn._check_open()
        validate_key(key)

    def _last_revision(self, key: str) -> int:
        last = self._bucket.last(key)
        return last.revision if last is not None else 0

    async def get(self, key: str) -> KVEntry | None:
        self._check(key)
        last = self._bucket.last(key)
        return last if last is not None and last.op == "PUT" else None

    async def put(self, key: str, value: bytes) -> int:
        self._check(key)
        return self._bucket.append(key, value, "PUT")

    async def create(self, key: str, value: bytes) -> int:
        self._check(key)
        if await self.get(key) is not None:
            raise KVConflict(key, 0, "the key already exists")
        return self._bucket.append(key, value, "PUT")

    async def update(self, key: str, value: bytes, last_revision: int) -> int:
        self._check(key)
        current = self._last_revision(key)
        if current != last_revision:
            raise KVConflict(key, last_revision, f"its last revision is {current}")
        return self._bucket.append(key, value, "PUT")

    async def delete(self, key: str, last_revision: int | None = None) -> None:
        self._check(key)
        current = self._last_revision(key)
        if last_revision and current != last_revision:
            raise KVConflict(key, last_revision, f"its last revision is {current}")
        self._bucket.append(key, b"", "DEL")

    async def keys(self) -> list[str]:
        self._conn._check_open()
        return sorted(e.key for e in self._bucket.snapshot(">", include_history=False))

    async def watch(self, keys: str = ">", *, include_history: bool = False) -> KVWatcher:
        self._conn._check_open()
        validate_key(keys, pattern=True)
        watcher = _FakeWatcher(self._conn, self._bucket, keys)
        for entry in self._bucket.snapshot(keys, include_history):
            watcher.offer(entry)
        watcher.initial_done()
        return watcher

    async def snapshot(self, patterns: Sequence[str]) -> list[KVEntry]:
        self._conn._check_open()
        for pattern in patterns:
            validate_key(pattern, pattern=True)
        return self._bucket.snapshot(patterns, include_history=False)


_STOP: Final = object()


class _FakeWatcher:
    def __init__(self, conn: FakeBus, bucket: _Bucket, pattern: str) -> None:
        self._conn = conn
        self._bucket = bucket
        self._pattern = pattern
        self._queue: asyncio.Queue[KVEntry | object | None] = asyncio.Queue()
        self._stopped = False
        bucket.watchers.append(self)
        conn._watchers.add(self)

    def offer(self, entry: KVEntry) -> None:
        if subject_matches(self._pattern, entry.key):
            self._queue.put_nowait(entry)

    def initial_done(self) -> None:
        self._queue.put_nowait(None)

    def __aiter__(self) -> _FakeWatcher:
        return self

    async def __anext__(self) -> KVEntry | None:
        item = _STOP if self._stopped else await self._queue.get()
        if item is _STOP:
            self._stopped = True
            raise StopAsyncIteration
        assert item is None or isinstance(item, KVEntry)
        return item

    async def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            with contextlib.suppress(ValueError):
                self._bucket.watchers.remove(self)
            self._conn._watchers.discard(self)
            self._queue.put_nowait(_STOP)


if TYPE_CHECKING:  # mypy proves the fake satisfies the protocols
    _BUS: type[Bus] = FakeBus
    _KV: type[KV] = _FakeKV
    _WATCHER: type[KVWatcher] = _FakeWatcher
    _SUBSCRIPTION: type[Subscription] = _FakeSub

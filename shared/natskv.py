"""KV over JetStream for `NatsBus`: the `shared.bus.KV` protocol and a restart-proof watcher.

How it works: reads and writes go through nats-py's KeyValue, with its errors mapped to ours.
Watching does not: nats-py's watcher can emit its "initial values done" marker before the initial
values (it compares the server's pending count with what the client has *read* so far), and it
goes silent when a restarted server forgets its consumer. `NatsKVWatcher` runs its own ordered
push consumer instead:

- The initial values end at the first message whose `num_pending` is 0, or at once when the
  consumer info shows the server had nothing to deliver at all (server-side counts, no race).
- After a reconnect (`resume_soon`) the watch is opened again and the new snapshot is filtered
  by revision: what was already delivered is skipped, what changed meanwhile arrives as a live
  change, and no second `None` is emitted. Messages from a replaced consumer are ignored.
- Deleted keys are left out of the initial values (the snapshot holds their delete markers)
  unless this watcher already delivered them.

A one-off read of many keys (`snapshot`) is a pull consumer instead, with the patterns as its
filter subjects, read to its end and deleted: a watch per pattern would leave one consumer per
pattern on the server until its inactivity threshold (and a stream takes only so many).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Final, Literal, Protocol, TypeVar

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg as NatsMsg
from nats.js import JetStreamContext, api
from nats.js.kv import KeyValue

from shared.bus import KV, KVEntry, KVWatcher, RateLimiter, validate_key
from shared.clock import Clock
from shared.errors import BusError, BusTimeout, KVConflict, NoResponders

logger = logging.getLogger(__name__)

WATCH_RETRY_S = 0.25
WATCH_LOG_INTERVAL_S = 1.0
# a watcher's consumer outlives a lost client by this long before the server drops it
WATCH_INACTIVE_THRESHOLD_S = 300.0
# JetStream error codes for a failed expected-last-subject-sequence check
_WRONG_LAST_SEQUENCE_CODES = (10071, 10164)
_KV_OPERATION = "KV-Operation"
_DELETE_OPERATIONS = frozenset({"DEL", "PURGE"})
# nats-server >= 2.11 marks TTL and purge removals with this header instead of KV-Operation
_MARKER_REASON = "Nats-Marker-Reason"
_DELETE_MARKER_REASONS = frozenset({"MaxAge", "Purge", "Remove"})
_STOP: Final = object()
# filter subjects per snapshot consumer: the create request stays a few tens of KB
SNAPSHOT_FILTERS_PER_READ = 512
SNAPSHOT_FETCH = 1000
# one fetch waits this long; then the consumer is asked what is still pending, since an entry
# counted when the consumer was made can expire (the bucket's max age) before it is delivered
SNAPSHOT_FETCH_WAIT_S = 1.0
SNAPSHOT_FETCH_WAITS = 10
# a snapshot consumer its reader never deleted (the reader died) is dropped this soon
SNAPSHOT_INACTIVE_S = 30.0
# JetStream answering 503 ("temporarily unavailable": a stream or meta leader being elected, as
# in a cluster just formed) or nobody answering did not act on the request, so a one-off caller
# (the operator's CLI) retries it with backoff for this long (`NatsBus.unavailable_retry_s`);
# services keep 0 and retry in their own loops, where a lease renewal must not wait 15 s
UNAVAILABLE_RETRY_S = 15.0
UNAVAILABLE_FIRST_DELAY_S = 0.1
UNAVAILABLE_MAX_DELAY_S = 1.0
_UNAVAILABLE = (nats.js.errors.ServiceUnavailableError, nats.errors.NoRespondersError)
_unavailable_log = RateLimiter(5.0)
T = TypeVar("T")


@contextlib.contextmanager
def nats_errors(what: str) -> Iterator[None]:
    """Turn nats-py errors into ours; `what` names the operation for the message."""
    try:
        yield
    except nats.errors.NoRespondersError as exc:
        raise NoResponders(f"{what}: no responders") from exc
    except (nats.errors.TimeoutError, TimeoutError) as exc:
        raise BusTimeout(f"{what}: timed out") from exc
    except nats.errors.Error as exc:  # nats.js.errors.Error derives from it
        raise BusError(f"{what}: {type(exc).__name__}: {exc}") from exc


async def while_unavailable(what: str, host: KVHost, op: Callable[[], Awaitable[T]]) -> T:
    """`await op()`, again while JetStream says it is unavailable, for `host.unavailable_retry_s`.

    Only a 503 or no responders is retried: neither acted on the request, so a write is not
    applied twice. A timeout is not retried here: the write may have landed."""
    clock = host.clock
    deadline = clock.monotonic() + host.unavailable_retry_s
    delay = UNAVAILABLE_FIRST_DELAY_S
    while True:
        try:
            return await op()
        except _UNAVAILABLE as exc:
            if clock.monotonic() + delay > deadline:
                raise
            if _unavailable_log.allow():
                logger.warning("%s: %r; retrying until it answers", what, exc)
        await asyncio.sleep(delay)
        delay = min(delay * 2, UNAVAILABLE_MAX_DELAY_S)


class KVHost(Protocol):
    """What a bucket needs of its bus (`shared.natsbus.NatsBus`, which imports this module): the
    JetStream context, the clock, and the watchers it closes with its connection."""

    js: JetStreamContext
    clock: Clock
    unavailable_retry_s: float

    def remember(self, watcher: NatsKVWatcher) -> None: ...

    def forget(self, watcher: NatsKVWatcher) -> None: ...


class NatsKV:
    """One bound bucket."""

    __slots__ = ("bucket", "bus", "raw")

    def __init__(self, bus: KVHost, bucket: str, raw: KeyValue) -> None:
        self.bus = bus
        self.bucket = bucket
        self.raw = raw

    @property
    def js(self) -> JetStreamContext:
        return self.bus.js

    @property
    def clock(self) -> Clock:
        return self.bus.clock

    def _what(self, op: str, key: str) -> str:
        return f"KV {op} {self.bucket}/{key}"

    async def get(self, key: str) -> KVEntry | None:
        validate_key(key)
        what = self._what("get", key)
        with nats_errors(what):
            try:
                entry = await while_unavailable(what, self.bus, lambda: self.raw.get(key))
            except nats.js.errors.KeyNotFoundError:  # also what a deleted key raises
                return None
        return KVEntry(self.bucket, key, entry.value or b"", entry.revision or 0, "PUT")

    async def put(self, key: str, value: bytes) -> int:
        validate_key(key)
        what = self._what("put", key)
        with nats_errors(what):
            return await while_unavailable(what, self.bus, lambda: self.raw.put(key, value))

    async def create(self, key: str, value: bytes) -> int:
        validate_key(key)
        what = self._what("create", key)
        with nats_errors(what):
            try:
                return await while_unavailable(what, self.bus, lambda: self.raw.create(key, value))
            except nats.js.errors.KeyWrongLastSequenceError:
                raise KVConflict(key, 0, "the key already exists") from None

    async def update(self, key: str, value: bytes, last_revision: int) -> int:
        validate_key(key)
        what = self._what("update", key)
        with nats_errors(what):
            try:
                return await while_unavailable(
                    what, self.bus, lambda: self.raw.update(key, value, last=last_revision)
                )
            except nats.js.errors.KeyWrongLastSequenceError:
                raise KVConflict(key, last_revision, "the key was written since") from None

    async def delete(self, key: str, last_revision: int | None = None) -> None:
        validate_key(key)
        what = self._what("delete", key)
        with nats_errors(what):
            try:
                await while_unavailable(
                    what, self.bus, lambda: self.raw.delete(key, last=last_revision)
                )
            except nats.js.errors.APIError as exc:
                if exc.err_code in _WRONG_LAST_SEQUENCE_CODES:
                    raise KVConflict(key, last_revision, "the key was written since") from None
                raise

    async def keys(self) -> list[str]:
        watcher = NatsKVWatcher(self, ">", include_history=False, headers_only=True)
        with nats_errors(f"KV keys {self.bucket}"):
            await watcher.open()
        try:
            keys = []
            async for entry in watcher:
                if entry is None:
                    break
                keys.append(entry.key)
        finally:
            await watcher.stop()
        return sorted(keys)

    async def watch(self, keys: str = ">", *, include_history: bool = False) -> KVWatcher:
        validate_key(keys, pattern=True)
        watcher = NatsKVWatcher(self, keys, include_history)
        with nats_errors(f"KV watch {self.bucket}/{keys}"):
            await watcher.open()
        self.bus.remember(watcher)
        return watcher

    async def snapshot(self, patterns: Sequence[str]) -> list[KVEntry]:
        for pattern in patterns:
            validate_key(pattern, pattern=True)
        unique = sorted(set(patterns))
        entries: list[KVEntry] = []
        what = f"KV snapshot {self.bucket} ({len(unique)} patterns)"
        with nats_errors(what):
            for i in range(0, len(unique), SNAPSHOT_FILTERS_PER_READ):
                chunk = unique[i : i + SNAPSHOT_FILTERS_PER_READ]
                read = functools.partial(self._read_last, chunk)
                entries += await while_unavailable(what, self.bus, read)
        entries.sort(key=lambda e: e.revision)
        return entries

    async def _read_last(self, patterns: list[str]) -> list[KVEntry]:
        """The last value of each key under `patterns`, through one consumer deleted after."""
        stream, prefix = f"KV_{self.bucket}", f"$KV.{self.bucket}."
        config = api.ConsumerConfig(
            filter_subjects=[prefix + p for p in patterns],
            deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT,
            ack_policy=api.AckPolicy.NONE,
            inactive_threshold=SNAPSHOT_INACTIVE_S,
            mem_storage=True,
            num_replicas=1,
        )
        info = await self.js.add_consumer(stream, config=config)
        out: list[KVEntry] = []
        try:
            left = info.num_pending
            if not left:
                return out
            sub = await self.js.pull_subscribe_bind(consumer=info.name, stream=stream)
            try:
                waits = 0
                while left:
                    try:
                        batch = await sub.fetch(min(left, SNAPSHOT_FETCH), SNAPSHOT_FETCH_WAIT_S)
                    except nats.errors.TimeoutError:
                        waits += 1
                        left = (await self.js.consumer_info(stream, info.name)).num_pending
                        if left and waits >= SNAPSHOT_FETCH_WAITS:
                            raise
                        continue
                    for msg in batch:
                        meta = msg.metadata
                        left = meta.num_pending
                        if _operation(msg.headers) == "PUT":
                            key = msg.subject[len(prefix) :]
                            out.append(
                                KVEntry(self.bucket, key, msg.data, meta.sequence.stream, "PUT")
                            )
            finally:
                with contextlib.suppress(nats.errors.Error):
                    await sub.unsubscribe()
        finally:
            with contextlib.suppress(nats.errors.Error, nats.js.errors.Error):
                await self.js.delete_consumer(stream, info.name)
        return out


class NatsKVWatcher:
    """Current values (or history), then None, then live changes; survives reconnects."""

    def __init__(
        self, kv: NatsKV, keys: str, include_history: bool, *, headers_only: bool = False
    ) -> None:
        self._kv = kv
        self._keys = keys
        self._history = include_history
        self._headers_only = headers_only
        self._prefix = f"$KV.{kv.bucket}."
        self._queue: asyncio.Queue[KVEntry | object | None] = asyncio.Queue()
        self._sub: JetStreamContext.PushSubscription | None = None
        self._generation = 0
        self._initial = True
        self._initial_keys: set[str] = set()
        self._last = 0
        self._stopped = False
        self._resume_task: asyncio.Task[None] | None = None
        self._resume_pending = False

    async def open(self) -> None:
        """Open (or reopen) the consumer; a previous one is dropped."""
        self._generation += 1
        generation = self._generation
        snapshot_done = False

        def end_of_snapshot() -> None:
            nonlocal snapshot_done
            if not snapshot_done:
                snapshot_done = True
                self._snapshot_done()

        async def on_msg(msg: NatsMsg) -> None:
            if generation != self._generation or self._stopped:
                return  # a replaced consumer still draining
            meta = msg.metadata
            self._offer(msg, meta.sequence.stream)
            if meta.num_pending == 0:
                end_of_snapshot()

        policy = api.DeliverPolicy.ALL if self._history else api.DeliverPolicy.LAST_PER_SUBJECT
        sub = await self._kv.js.subscribe(
            self._prefix + self._keys,
            stream=f"KV_{self._kv.bucket}",
            cb=on_msg,
            ordered_consumer=True,
            deliver_policy=policy,
            headers_only=self._headers_only or None,
            inactive_threshold=WATCH_INACTIVE_THRESHOLD_S,
        )
        old, self._sub = self._sub, sub
        if old is not None:
            await _unsubscribe(old)
        if self._stopped:
            await _unsubscribe(sub)
            return
        info = await sub.consumer_info()
        delivered = info.delivered.consumer_seq if info.delivered is not None else 0
        if not info.num_pending and not delivered:
            end_of_snapshot()  # nothing to deliver: no message will carry num_pending == 0

    def _offer(self, msg: NatsMsg, revision: int) -> None:
        op = _operation(msg.headers)
        if op is None:
            return
        if revision <= self._last:
            return
        self._last = revision
        key = msg.subject[len(self._prefix) :]
        if self._initial and not self._history:
            if op == "DEL" and key not in self._initial_keys:
                return
            self._initial_keys.add(key)
        value = b"" if op == "DEL" or self._headers_only else msg.data
        self._queue.put_nowait(KVEntry(self._kv.bucket, key, value, revision, op))

    def _snapshot_done(self) -> None:
        if self._initial:
            self._initial = False
            self._initial_keys.clear()
            self._queue.put_nowait(None)

    def resume_soon(self) -> None:
        """Reopen after a reconnect (once more if a reopen is already under way)."""
        if self._stopped:
            return
        self._resume_pending = True
        if self._resume_task is None or self._resume_task.done():
            self._resume_task = asyncio.get_running_loop().create_task(self._resume())

    async def _resume(self) -> None:
        limiter = RateLimiter(WATCH_LOG_INTERVAL_S, self._kv.clock)
        while self._resume_pending and not self._stopped:
            self._resume_pending = False
            try:
                await self.open()
            except (nats.errors.Error, TimeoutError) as exc:  # JetStream may not be back yet
                self._resume_pending = True
                if limiter.allow():
                    where = f"{self._kv.bucket}/{self._keys}"
                    logger.warning("KV watch %s: reopening failed: %r", where, exc)
                await asyncio.sleep(WATCH_RETRY_S)

    def __aiter__(self) -> NatsKVWatcher:
        return self

    async def __anext__(self) -> KVEntry | None:
        item = _STOP if self._stopped else await self._queue.get()
        if item is _STOP:
            raise StopAsyncIteration
        assert item is None or isinstance(item, KVEntry)
        return item

    async def stop(self) -> None:
        """Stop; entries still queued are dropped and iteration ends."""
        if self._stopped:
            return
        self._stopped = True
        self._kv.bus.forget(self)
        if self._resume_task is not None:
            self._resume_task.cancel()
        self._queue.put_nowait(_STOP)
        if self._sub is not None:
            await _unsubscribe(self._sub)


def _operation(headers: dict[str, str] | None) -> Literal["PUT", "DEL"] | None:
    """What a KV stream message is; None for a marker of a kind this version does not know."""
    if not headers:
        return "PUT"
    if headers.get(_KV_OPERATION) in _DELETE_OPERATIONS:
        return "DEL"
    if _MARKER_REASON in headers:
        return "DEL" if headers[_MARKER_REASON] in _DELETE_MARKER_REASONS else None
    return "PUT"


async def _unsubscribe(sub: JetStreamContext.PushSubscription) -> None:
    # the consumer may already be gone with its server, or the connection closed
    with contextlib.suppress(nats.errors.Error):
        await sub.unsubscribe()


if TYPE_CHECKING:  # mypy proves the adapters satisfy the protocols
    _KV: type[KV] = NatsKV
    _WATCHER: type[KVWatcher] = NatsKVWatcher

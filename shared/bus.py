"""The message bus behind a small protocol, and its NATS implementation.

How it works: services talk to a `Bus` (publish, subscribe, request, a response stream on a
private inbox, KV buckets). `NatsBus` (shared.natsbus, KV in shared.natskv) maps it onto nats-py
and turns nats-py's errors into ours (`BusTimeout`, `NoResponders`, `KVConflict`,
`MaxPayloadExceeded`, else `BusError`); `FakeBus` (shared.fakebus) is an in-memory twin with the
same semantics for unit tests. One contract test suite runs against both. This module holds the
protocols and what both share; it imports neither implementation (they import it): take
`NatsBus` from shared.natsbus, `FakeBus` and `FakeServer` from shared.fakebus.

Semantics both implementations keep:
- Delivery is asynchronous and ordered per subscription; each subscription runs its handler on one
  task, one message at a time. A handler that raises is counted and logged (at most one line per
  second per subscription) and the subscription keeps running. `subscribe_inline` handlers are
  plain functions run where the message is read (no task hand-over: the request path's
  receives), and `publish_nowait` queues a message that leaves at the end of the loop turn with
  the others published in it, in order with `publish` (the request path's sends).
- A request to a subject with no subscriber fails fast with `NoResponders` (the server answers
  the reply inbox with a 503 status message); a request nobody answers in time is `BusTimeout`.
- KV revisions are one counter per bucket. `create` conflicts when the key holds a value (a
  deleted key may be re-created); `update` and `delete(last_revision=...)` conflict when the key's
  last revision (including a delete marker) differs. A watcher yields the current values (deleted
  keys left out; with `include_history`, every retained revision including deletes) in revision
  order, then `None`, then live changes, where a delete arrives as `op="DEL"`.
- Subjects, KV keys and bucket names are validated the same way (`UsageError`), and a payload
  above `max_payload` raises `MaxPayloadExceeded` before anything is sent.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from shared.clock import SYSTEM_CLOCK, Clock
from shared.errors import BusError, BusTimeout, NoResponders, UsageError

__all__ = [
    "KV",
    "Bus",
    "Handler",
    "HandlerGuard",
    "InlineGuard",
    "InlineHandler",
    "KVEntry",
    "KVWatcher",
    "MaxPayloadExceeded",
    "Msg",
    "QueueResponseStream",
    "RateLimiter",
    "ResponseStream",
    "Subscription",
    "is_no_responders",
    "subject_matches",
    "validate_bucket",
    "validate_key",
    "validate_subject",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_PAYLOAD = 1024 * 1024  # nats-server's default max_payload
HANDLER_ERROR_LOG_INTERVAL_S = 1.0
KV_MAX_HISTORY = 64  # JetStream's limit on retained revisions per key
STATUS_HEADER = "Status"
NO_RESPONDERS_STATUS = "503"

_KEY_RE = re.compile(r"^[-/_=.a-zA-Z0-9]+$")
_KEY_PATTERN_RE = re.compile(r"^[-/_=.a-zA-Z0-9*>]+$")
_BUCKET_RE = re.compile(r"^[a-zA-Z0-9_-]+$")
_WHITESPACE_RE = re.compile(r"\s")


class MaxPayloadExceeded(BusError):
    """A payload is larger than the server accepts (`max_payload`); nothing was sent."""

    def __init__(self, subject: str, size: int, max_payload: int) -> None:
        self.subject = subject
        self.size = size
        self.max_payload = max_payload
        super().__init__(
            f"payload of {size} bytes for {subject!r} exceeds the server's max_payload of "
            f"{max_payload} bytes"
        )


@dataclass(frozen=True, slots=True)
class Msg:
    subject: str
    data: bytes
    reply: str | None = None
    headers: Mapping[str, str] | None = None


Handler = Callable[[Msg], Awaitable[None]]
InlineHandler = Callable[[Msg], None]
"""A handler run where the message is read (`Bus.subscribe_inline`): plain code that must not
block; it may start tasks and `publish_nowait`."""


class Subscription(Protocol):
    @property
    def handler_errors(self) -> int:
        """How many times the handler raised (each was logged, rate-limited, and dropped)."""
        ...

    async def unsubscribe(self) -> None: ...


@dataclass(frozen=True, slots=True)
class KVEntry:
    bucket: str
    key: str
    value: bytes
    revision: int
    op: Literal["PUT", "DEL"]


class KVWatcher(Protocol):
    """Async iterator of KVEntry, with one `None` once the initial values are delivered."""

    def __aiter__(self) -> AsyncIterator[KVEntry | None]: ...

    async def stop(self) -> None: ...


class KV(Protocol):
    async def get(self, key: str) -> KVEntry | None: ...

    async def put(self, key: str, value: bytes) -> int: ...

    async def create(self, key: str, value: bytes) -> int: ...

    async def update(self, key: str, value: bytes, last_revision: int) -> int: ...

    async def delete(self, key: str, last_revision: int | None = None) -> None: ...

    async def keys(self) -> list[str]: ...

    async def watch(self, keys: str = ">", *, include_history: bool = False) -> KVWatcher: ...

    async def snapshot(self, patterns: Sequence[str]) -> list[KVEntry]:
        """The current values (no deletes) of every key matching one of `patterns`, in revision
        order, read with nothing left behind on the server: one read however many patterns, so
        taking over a thousand apps costs one read, not a thousand watches."""
        ...


class ResponseStream(Protocol):
    """The replies to one request on a private inbox, in order."""

    interruptions: int
    """Times the connection dropped while the stream was open: replies sent meanwhile are lost."""

    async def next(self, timeout: float) -> Msg: ...  # noqa: ASYNC109 - NATS-style API

    async def close(self) -> None: ...


class Bus(Protocol):
    async def publish(
        self,
        subject: str,
        data: bytes,
        *,
        reply: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None: ...

    def publish_nowait(self, subject: str, data: bytes, *, reply: str | None = None) -> None:
        """`publish` without awaiting: the message leaves with everything else published in
        this turn of the event loop, in the order published (the request path's sends)."""
        ...

    async def subscribe(
        self, subject: str, handler: Handler, *, queue: str | None = None
    ) -> Subscription: ...

    async def subscribe_inline(
        self, subject: str, handler: InlineHandler, *, queue: str | None = None
    ) -> Subscription:
        """`subscribe` whose handler is plain code run where the message is read, with no task
        of its own (the request path's receives); guarded like any handler. Order holds among
        the messages it reads inline; an implementation may hand some others (with headers,
        or arriving while it subscribes) to a task (shared.natsbus)."""
        ...

    async def request(
        self,
        subject: str,
        data: bytes,
        *,
        timeout: float,  # noqa: ASYNC109 - NATS-style API: the timeout is the request's
        headers: Mapping[str, str] | None = None,
    ) -> Msg: ...

    async def request_stream(
        self, subject: str, data: bytes, *, headers: Mapping[str, str] | None = None
    ) -> ResponseStream: ...

    async def kv(
        self, bucket: str, *, history: int = 1, ttl: float | None = None, create: bool = True
    ) -> KV: ...

    async def flush(self, timeout: float = 5.0) -> None: ...  # noqa: ASYNC109

    async def close(self) -> None: ...

    def new_inbox(self) -> str: ...

    @property
    def max_payload(self) -> int: ...


# -- helpers shared by both implementations -------------------------------------------------


def validate_subject(subject: str, *, wildcards: bool) -> None:
    """Raise UsageError unless `subject` is a valid subject (a pattern if `wildcards`)."""
    tokens = subject.split(".")
    if not subject or _WHITESPACE_RE.search(subject) or "" in tokens:
        raise UsageError(f"invalid subject {subject!r}: empty token or whitespace")
    if not wildcards and ("*" in tokens or ">" in tokens):
        raise UsageError(f"cannot publish to wildcard subject {subject!r}")
    if ">" in tokens[:-1]:
        raise UsageError(f"invalid subject {subject!r}: '>' must be the last token")


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS matching: `*` is one token, a trailing `>` is one or more tokens."""
    pat = pattern.split(".")
    sub = subject.split(".")
    for i, token in enumerate(pat):
        if token == ">":
            return len(sub) > i
        if i >= len(sub) or (token != "*" and token != sub[i]):
            return False
    return len(pat) == len(sub)


def validate_key(key: str, *, pattern: bool = False) -> None:
    """Raise UsageError unless `key` is a valid KV key (or key pattern, for watch)."""
    allowed = _KEY_PATTERN_RE if pattern else _KEY_RE
    if not allowed.match(key) or key.startswith(".") or key.endswith("."):
        raise UsageError(f"invalid KV key {key!r}: use letters, digits and -/_=. between tokens")
    if pattern:
        validate_subject(key, wildcards=True)


def validate_bucket(bucket: str, history: int = 1, ttl: float | None = None) -> None:
    if not _BUCKET_RE.match(bucket):
        raise UsageError(f"invalid KV bucket name {bucket!r}: use letters, digits, - and _")
    if not 1 <= history <= KV_MAX_HISTORY:
        raise UsageError(f"KV history must be in [1, {KV_MAX_HISTORY}], not {history}")
    if ttl is not None and not ttl > 0:
        raise UsageError(f"KV ttl must be positive seconds, not {ttl}")


def is_no_responders(msg: Msg) -> bool:
    """The server's answer to a request nobody subscribes to: a 503 status, no payload."""
    headers = msg.headers
    return (
        not msg.data and headers is not None and headers.get(STATUS_HEADER) == NO_RESPONDERS_STATUS
    )


class RateLimiter:
    """True at most once per `interval` seconds of `clock` (for log lines)."""

    __slots__ = ("_clock", "_interval", "_last")

    def __init__(self, interval: float, clock: Clock = SYSTEM_CLOCK) -> None:
        self._interval = interval
        self._clock = clock
        self._last = -math.inf

    def allow(self) -> bool:
        now = self._clock.monotonic()
        if now - self._last < self._interval:
            return False
        self._last = now
        return True


class HandlerGuard:
    """Runs a subscription's handler; counts and logs (rate-limited) what it raises."""

    __slots__ = ("_handler", "_limiter", "errors", "subject")

    def __init__(self, subject: str, handler: Handler, clock: Clock = SYSTEM_CLOCK) -> None:
        self.subject = subject
        self._handler = handler
        self._limiter = RateLimiter(HANDLER_ERROR_LOG_INTERVAL_S, clock)
        self.errors = 0

    async def __call__(self, msg: Msg) -> None:
        try:
            await self._handler(msg)
        except Exception:
            self.failed(msg)

    def failed(self, msg: Msg) -> None:
        """Count and log (rate-limited) what the handler raised on `msg`; call from `except`."""
        self.errors += 1
        if self._limiter.allow():
            logger.exception(
                "handler for subscription %r failed on %r (%d failures so far)",
                self.subject,
                msg.subject,
                self.errors,
            )


class InlineGuard(HandlerGuard):
    """A HandlerGuard around an `InlineHandler`: call it for messages read inline, await it
    for the ones that take the subscription's task (the implementation decides which)."""

    __slots__ = ("_inline",)

    def __init__(self, subject: str, handler: InlineHandler, clock: Clock = SYSTEM_CLOCK) -> None:
        super().__init__(subject, self._deferred, clock)
        self._inline = handler

    def now(self, msg: Msg) -> None:
        try:
            self._inline(msg)
        except Exception:
            self.failed(msg)

    async def _deferred(self, msg: Msg) -> None:
        self._inline(msg)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class QueueResponseStream:
    """A ResponseStream fed by a subscription callback (`push` / `push_nowait`).

    `next()` takes a queued message without suspending when one is there (the second and later
    replies of a stream) and otherwise waits on one future with one timer: the reply of a
    request/reply, so it is leaner than an asyncio.Queue under `asyncio.timeout` (that pair was
    a tenth of a handle call's own time). One reader at a time, as a stream has."""

    __slots__ = ("_closed", "_closer", "_items", "_subject", "_waiter", "interruptions")

    def __init__(self, subject: str) -> None:
        self._subject = subject
        self._items: deque[Msg] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._closer: Callable[[], Awaitable[None]] | None = None
        self._closed = False
        self.interruptions = 0

    def attach(self, closer: Callable[[], Awaitable[None]]) -> None:
        self._closer = closer

    def interrupt(self) -> None:
        """The connection dropped: whatever was sent to this inbox until it is back is lost."""
        self.interruptions += 1

    def push_nowait(self, msg: Msg) -> None:
        self._items.append(msg)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def push(self, msg: Msg) -> None:
        self.push_nowait(msg)

    async def next(self, timeout: float) -> Msg:  # noqa: ASYNC109 - NATS-style API
        if self._closed:
            raise UsageError(f"the response stream for {self._subject!r} is closed")
        items = self._items
        if not items:
            if self._waiter is not None:
                raise UsageError(f"the response stream for {self._subject!r} has a reader")
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            timer = loop.call_later(timeout, _wake, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
            if not items:
                raise BusTimeout(f"no reply on {self._subject!r} within {timeout:g}s")
        msg = items.popleft()
        if msg.headers is not None and is_no_responders(msg):
            raise NoResponders(f"no responders on {self._subject!r}")
        return msg

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._closer is not None:
                await self._closer()

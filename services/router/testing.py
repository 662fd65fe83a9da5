"""Test helpers: a scriptable fake replica that speaks docs/dataplane.md, and membership writes.

`FakeReplica` answers on its rpc subject (and its probe subject) over any `Bus`: admission first,
then optional health frames, chunks and `End` or an `ErrorReply`. Its attributes script the
behaviour of the next requests (reject, stay silent, hang after admitting, fail, ...). `stop()`
unsubscribes both subjects, which is what a killed replica looks like to NATS.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from shared.bus import Bus, Msg, Subscription
from shared.clock import SYSTEM_CLOCK, Clock
from shared.errors import BusError, WireError
from shared.kv import buckets
from shared.kv.membership import Member, deployment_pattern
from shared.kv.view import DocKV
from shared.probes import not_held
from shared.subjects import DEFAULT_SUBJECTS, Subjects
from shared.wire.codec import decode, decode_as, decode_body, encode
from shared.wire.messages import (
    Admission,
    CallArgs,
    Chunk,
    End,
    ErrorReply,
    HealthFrame,
    HealthStatus,
    HttpRequest,
    HttpResponse,
    ProbeRequest,
    Request,
    WireMessage,
)


def echo(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return {"method": method, "args": list(args), "kwargs": kwargs}


def http_echo(req: HttpRequest) -> HttpResponse:
    return HttpResponse(200, (("x-path", req.path), ("x-method", req.method)), req.body)


class FakeReplica:
    def __init__(
        self,
        bus: Bus,
        app: str,
        deployment: str,
        replica_id: str,
        *,
        subjects: Subjects = DEFAULT_SUBJECTS,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.bus = bus
        self.replica_id = replica_id
        self.subjects = subjects
        self.clock = clock
        self.rpc_subject = subjects.rpc(app, deployment, replica_id)
        # -- script (change between requests) --
        self.fn: Callable[[str, tuple[Any, ...], dict[str, Any]], Any] = echo
        self.http_fn: Callable[[HttpRequest], HttpResponse] = http_echo
        self.reject = False
        self.max_ongoing: int | None = None  # refuse beyond this many at once (members carry it)
        self.release: asyncio.Semaphore | None = None  # each request takes one before answering
        self.silent = False  # never admit (the router's admission timeout fires)
        self.hang = False  # admit, then say nothing more
        self.lose_reply = False  # admit, finish, and send nothing more (the reply went astray)
        self.frames = 0  # health frames before each chunk (when the request supports them)
        self.delay_s = 0.0  # before the first chunk (after frames)
        self.item_delay_s = 0.0  # between stream items
        self.error: ErrorReply | None = None
        self.garbage_after_admission = False
        self.count_chunks = True  # End says how many chunks went out (False: an older replica)
        self.healthy = True
        self.answer_probes = True
        # -- observations --
        self.requests: list[Request] = []
        self.admitted = 0
        self.rejected = 0
        self.probes = 0
        self.asks = 0  # probes naming a request (included in `probes`)
        self.asked_not_held = 0  # of those, naming a request it did not hold
        self.held: set[str] = set()  # ids of the requests it admitted and still runs
        self.ongoing = 0
        self._checks = 0
        self._subs: list[Subscription] = []
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def member(self) -> Seat:
        return Seat(self.replica_id, self.rpc_subject, self.max_ongoing)

    def health(self) -> HealthStatus:
        self._checks += 1
        return HealthStatus(
            self.replica_id, self.healthy, self.clock.wall() + self._checks * 1e-3, 0
        )

    async def start(self) -> FakeReplica:
        self._subs = [
            await self.bus.subscribe(self.rpc_subject, self._on_rpc),
            await self.bus.subscribe(self.subjects.probe(self.replica_id), self._on_probe),
        ]
        await self.bus.flush()  # NATS knows the interest only once it has the SUBs
        return self

    async def stop(self) -> None:
        """Vanish like a killed process: no more answers, on any subject."""
        for sub in self._subs:
            with contextlib.suppress(BusError):  # the connection may be closed already
                await sub.unsubscribe()
        self._subs = []
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _on_probe(self, msg: Msg) -> None:
        self.probes += 1
        if self.answer_probes and msg.reply:
            named = bool(msg.data) and decode_as(msg.data, ProbeRequest).request_id is not None
            gone = not_held(msg.data, self.held)  # the replica runtime's own answer
            self.asks += named
            self.asked_not_held += gone is not None
            await self._send(msg.reply, gone or self.health())

    async def _on_rpc(self, msg: Msg) -> None:
        req = decode_as(msg.data, Request)
        self.requests.append(req)
        if self.silent or not msg.reply:
            return
        reply = msg.reply
        if self.reject or (self.max_ongoing is not None and self.ongoing >= self.max_ongoing):
            self.rejected += 1
            await self._send(reply, Admission(False, self.ongoing, self.health(), False))
            return
        self.admitted += 1
        self.ongoing += 1
        self.held.add(req.request_id)
        frames = req.supports_health_frames and self.frames > 0
        await self._send(reply, Admission(True, self.ongoing, self.health(), frames))
        task = asyncio.get_running_loop().create_task(self._serve(req, reply, frames))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, req: Request, reply: str, frames: bool) -> None:
        try:
            if self.hang:
                await asyncio.Event().wait()
            if self.release is not None:
                await self.release.acquire()
            if self.lose_reply:
                return
            if self.garbage_after_admission:
                await self.bus.publish(reply, b"\xc1garbage")
                return
            for _ in range(self.frames if frames else 0):
                await self._send(reply, HealthFrame(self.health()))
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if self.error is not None:
                await self._send(reply, self.error)
                return
            results = self._results(req)
            for seq, data in enumerate(results):
                if seq and self.item_delay_s:
                    await asyncio.sleep(self.item_delay_s)
                if seq and frames:
                    await self._send(reply, HealthFrame(self.health()))
                await self._send(reply, Chunk(seq, data))
            await self._send(reply, End(len(results) if self.count_chunks else None))
        finally:
            self.ongoing -= 1
            self.held.discard(req.request_id)

    def _results(self, req: Request) -> list[bytes]:
        body = decode_body(req)
        if isinstance(body, HttpRequest):
            return [encode(self.http_fn(body))]
        assert isinstance(body, CallArgs)
        value = self.fn(req.method, body.args, body.kwargs)
        items = list(value) if req.stream else [value]
        return [msgpack.packb(v, use_bin_type=True) for v in items]

    async def _send(self, reply: str, message: WireMessage) -> None:
        await self.bus.publish(reply, encode(message))


def lose_in_transit(
    matches: Callable[[WireMessage], bool], times: int = 1
) -> Callable[[Msg], bool]:
    """A `FakeServer.lose` that loses the first `times` replies to an inbox whose message
    `matches`, as a NATS node restarted between a replica and its router would."""
    left = times

    def lose(msg: Msg) -> bool:
        nonlocal left
        if left <= 0 or not msg.subject.startswith("_INBOX."):
            return False
        try:
            hit = matches(decode(msg.data))
        except WireError:
            return False
        left -= hit
        return hit

    return lose


@dataclass(frozen=True, slots=True)
class Seat:
    """A replica as a test lists it in a membership: its id, rpc subject and limit (if told)."""

    replica_id: str
    rpc_subject: str
    max_ongoing: int | None = None


def members_of(
    app: str, deployment: str, epoch: int, seats: Sequence[Seat], max_queued: int | None = None
) -> list[Member]:
    """The membership documents of `seats`, in slots 0.. and start order as given (carrying the
    deployment's `max_queued_requests` when given)."""
    return [
        Member(
            app,
            deployment,
            slot,
            s.replica_id,
            s.rpc_subject,
            slot + 1,
            epoch,
            max_queued_requests=max_queued,
            max_ongoing_requests=s.max_ongoing,
        )
        for slot, s in enumerate(seats)
    ]


async def put_membership(
    bus: Bus,
    app: str,
    deployment: str,
    epoch: int,
    seats: Sequence[Seat],
    *,
    max_queued: int | None = None,
) -> None:
    """Make `seats` the whole membership of the deployment (what the controller's writes add up
    to): slot keys 0.. are written, any further slot keys deleted; creates the bucket if needed."""
    kv = await buckets.open_bucket(bus, buckets.MEMBERSHIP)
    docs = DocKV(kv, Member)
    for m in members_of(app, deployment, epoch, seats, max_queued):
        await docs.put(m.key, m)
    for change in await docs.snapshot(deployment_pattern(app, deployment)):
        if change.doc is not None and change.doc.slot >= len(seats):
            await docs.delete(change.key)

"""One request from a router to a replica (docs/dataplane.md): admission, retries, the response.

How it works:
- `open_call` encodes the `Request` once, then loops: take a replica from the router (or wait in
  its queue), send on the replica's rpc subject with `request_stream`, and wait for the admission
  up to `admission_timeout_s`. No admission in time, or "no responders", means the request was
  never admitted: back that replica off, exclude it for this request and try another. A rejected
  admission backs off too. An accepted admission returns a `ResponseReader`.
- `ResponseReader.next_chunk` reads the stream in order. Health frames are folded into the
  router's carried health and never returned; chunks must count from 0 without gaps; `End`
  returns None; `ErrorReply` raises `RequestFailed`.
- Lost in transit: NATS keeps order but loses what was in flight through a node that restarted,
  while what was sent after the reconnect still arrives. So a chunk whose `seq` skips ahead, an
  `End` counting more chunks (`End.chunks`) than arrived, or, from a replica that does not count,
  an `End` before chunk 0 of a call that always has one (unary or HTTP) means part of the
  response was lost: `ResponseLostError` (retryable, and the request ran). The checks cost one
  int compare per chunk and one per `End`. A first message that is a later part of the stream
  means the admission was lost: the replica admitted the request, so the reader reads on from
  that message instead of sending the request to another replica (which would run it twice).
- Liveness: every read waits at most `liveness_interval_s`. Silence that long asks the router's
  `Liveness` (liveness.py) whether the replica is still connected: not when it was heard from on
  another request meanwhile; else by a probe to `fp.v1.probe.{replica}`, one per replica shared
  by every request waiting on it. "No responders" means the replica's connection is gone and the
  caller gets `ReplicaLostError` (retryable); a probe that times out means the replica is alive
  but busy, so reading continues. After `ASK_FIRST` silent intervals (then 2x, 4x, ... as long,
  at most `ASK_MAX_GAP` apart) the probe names the request instead, unshared: a live replica
  that no longer holds it answers `not_held`, its reply was lost on the way, and the caller gets
  `ReplicaLostError` too. The request's deadline bounds every wait (`DeadlineExceeded`). When
  to probe, and what the answer means for the request, is decided by silence.py's `SilentRead`
  (pure, with the constants); this reader sends the probes and raises.
- Lazy frame pump: a caller that reads a stream slowly would leave health frames sitting in the
  inbox while it works. When the admission declared `will_send_health_frames` on a streaming
  request, the reader arms a timer each time it hands a chunk to the caller; if the request is
  still pending after `frame_pump_delay_s` and the caller is not awaiting the next message at
  that moment, a pump task takes over reading: it drains the inbox into a local queue, folding
  frames as they arrive, and the caller reads from that queue. A unary call never arms the pump
  (its caller is always reading and folds frames inline), and a fast stream consumer never
  triggers it, so the common paths create no task.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
from typing import Final

from services.router.errors import (
    DeadlineExceeded,
    ReplicaLostError,
    RequestFailed,
    ResponseLostError,
    RouterError,
)
from services.router.metrics import OK, outcome_of
from services.router.router import Router
from services.router.silence import LOST_GRACE_S, After, SilentRead, Step
from shared.bus import Msg, ResponseStream
from shared.errors import BusTimeout, NoResponders, WireError
from shared.wire.codec import decode, decode_as, encode_request
from shared.wire.messages import (
    Admission,
    Chunk,
    End,
    ErrorReply,
    HealthFrame,
)

BAD_RESPONSE: Final = "bad_response"
"""`RequestFailed.code` when a replica's response stream breaks the protocol."""
MIN_TIMEOUT_S: Final = 0.001

_id_prefix = os.urandom(8).hex()
_id_seq = itertools.count(1)


def new_request_id() -> str:
    """Unique: 64 random bits per process, then a counter (a uuid4 cost 2.5 us per call)."""
    return f"{_id_prefix}{next(_id_seq):x}"


def _reseed_request_ids() -> None:  # a forked child must not repeat its parent's ids
    global _id_prefix, _id_seq
    _id_prefix, _id_seq = os.urandom(8).hex(), itertools.count(1)


os.register_at_fork(after_in_child=_reseed_request_ids)


async def open_call(
    router: Router,
    *,
    method: str,
    body: bytes,
    body_kind: str,
    stream: bool,
    deadline_s: float | None,
    model_id: str | None = None,
) -> ResponseReader:
    """Send one request and return its reader once a replica admitted it. The request's
    latency is observed when it fails here, else when its reader closes. `model_id`: the
    multiplexed model the request is for (routed to a replica holding it when one has room)."""
    start = router.clock.monotonic()
    router.counters.arrived += 1
    try:
        return await _open_call(
            router, start, method, body, body_kind, stream, deadline_s, model_id or None
        )
    except BaseException as exc:
        outcome = outcome_of(exc)
        router.counters.failed(outcome)
        router.metrics.observe(outcome, router.clock.monotonic() - start)
        raise


async def _open_call(
    router: Router,
    start: float,
    method: str,
    body: bytes,
    body_kind: str,
    stream: bool,
    deadline_s: float | None,
    model_id: str | None,
) -> ResponseReader:
    clock = router.clock
    if deadline_s is None:
        deadline_mono, deadline_wall = math.inf, None
    else:
        deadline_mono, deadline_wall = start + deadline_s, clock.wall() + deadline_s
    request_id = new_request_id()
    inline = not stream and body_kind == "args"  # a unary result may ride on the admission
    payload = encode_request(
        request_id, method, True, stream, deadline_wall, body, body_kind, model_id, inline
    )
    exclude: set[str] = set()
    retry = False
    while True:
        if deadline_mono != math.inf and clock.monotonic() >= deadline_mono:
            raise DeadlineExceeded(f"no replica of {router.key} admitted the request in time")
        chosen = router.acquire_soon(deadline_mono, exclude, retry=retry, model_id=model_id)
        rid = chosen if isinstance(chosen, str) else await chosen  # a coroutine only to wait
        retry = True
        member = router.members.get(rid)
        if member is None:  # left the membership while we waited
            continue
        now = clock.monotonic()
        router.dispatched(rid, now, model_id)
        dispatch = router.chooser.dispatches  # orders its admission's model list (choice.py)
        try:
            response = await router.bus.request_stream(member.rpc_subject, payload)
        except BaseException:
            router.finished(rid, clock.monotonic())
            raise
        admission = await _await_admission(router, rid, response, deadline_mono, model_id, dispatch)
        if isinstance(admission, _AdmissionLost):  # admitted all the same: read on
            return ResponseReader(
                router,
                rid,
                request_id,
                _Replay(admission.first, response),
                deadline_mono,
                pump=False,  # frames unknown; a reader folds them inline anyway
                started=start,
                dispatched=now,
                first_due=not stream or body_kind == "http",
            )
        if admission is not None and admission.accepted:
            return ResponseReader(
                router,
                rid,
                request_id,
                response,
                deadline_mono,
                pump=stream and admission.will_send_health_frames,
                started=start,
                dispatched=now,
                concurrency=admission.num_ongoing,
                first_due=not stream or body_kind == "http",
                inline=admission.inline_result,
            )
        await response.close()
        router.finished(rid, clock.monotonic())
        if admission is None:
            exclude.add(rid)


class _AdmissionLost:
    """The first message of a response stream was a later part of it: the admission was lost
    in transit, and the replica admitted the request (it sends nothing else before)."""

    __slots__ = ("first",)

    def __init__(self, first: Msg) -> None:
        self.first = first


_AFTER_ADMISSION: Final = (Chunk, HealthFrame, End, ErrorReply)


class _Replay:
    """A response stream whose first message was read already (`_AdmissionLost`)."""

    __slots__ = ("_first", "_stream")

    def __init__(self, first: Msg, stream: ResponseStream) -> None:
        self._first: Msg | None = first
        self._stream = stream

    @property
    def interruptions(self) -> int:
        return self._stream.interruptions

    @interruptions.setter
    def interruptions(self, value: int) -> None:
        self._stream.interruptions = value

    async def next(self, timeout: float) -> Msg:  # noqa: ASYNC109 - NATS-style API
        first, self._first = self._first, None
        return first if first is not None else await self._stream.next(timeout)

    async def close(self) -> None:
        await self._stream.close()


async def _await_admission(
    router: Router,
    rid: str,
    response: ResponseStream,
    deadline_mono: float,
    model_id: str | None = None,
    dispatch: int | None = None,
) -> Admission | _AdmissionLost | None:
    """The admission; `_AdmissionLost` when the stream went on without it; None when the
    request was never admitted (the replica is backed off)."""
    clock = router.clock
    timeout = router.config.admission_timeout_s
    if deadline_mono != math.inf:  # no clock read for a call without a deadline
        timeout = min(timeout, deadline_mono - clock.monotonic())
    try:
        msg = await response.next(max(timeout, MIN_TIMEOUT_S))
        admission = decode_as(msg.data, Admission)
    except NoResponders:
        router.unreachable(rid, clock.monotonic())
        return None
    except BusTimeout:
        now = clock.monotonic()
        if now < deadline_mono:  # a deadline cut short is not the replica's fault
            router.unreachable(rid, now)
        return None
    except WireError as exc:
        if _later_part(msg.data):
            router.liveness.heard(rid)
            return _AdmissionLost(msg)
        router.bad_input.drop(exc.reason, f"admission from {rid}: {exc.detail}")
        router.unreachable(rid, clock.monotonic())
        return None
    except BaseException:
        await response.close()
        router.finished(rid, clock.monotonic())
        raise
    router.admitted(rid, admission, clock.monotonic(), model_id, dispatch)
    return admission


def _later_part(data: bytes) -> bool:
    """A valid response-stream message that only ever follows an accepted admission."""
    try:
        return isinstance(decode(data), _AFTER_ADMISSION)
    except WireError:
        return False


class _Failure:
    """An exception the pump hands over to the caller through the queue."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class ResponseReader:
    """The response stream of one admitted request. Always `close()` it (idempotent)."""

    __slots__ = (
        "_concurrency",
        "_deadline",
        "_dispatched",
        "_done",
        "_expected_seq",
        "_first_due",
        "_inline",
        "_interruptions_seen",
        "_outcome",
        "_pump_armed",
        "_pump_queue",
        "_pump_task",
        "_request_id",
        "_response",
        "_router",
        "_started",
        "_timer",
        "_waiting",
        "replica_id",
    )

    def __init__(
        self,
        router: Router,
        replica_id: str,
        request_id: str,
        response: ResponseStream,
        deadline_mono: float,
        *,
        pump: bool,
        started: float,
        dispatched: float,
        concurrency: int = 0,
        first_due: bool = False,
        inline: bytes | None = None,
    ) -> None:
        self._router = router
        self._started = started
        self._dispatched = dispatched  # of the admitted attempt: service time starts here
        self._concurrency = concurrency  # the replica's requests in flight when it admitted
        self._outcome = OK
        """What the caller saw: the first error a read raised (closing early is no failure)."""
        self.replica_id = replica_id
        self._request_id = request_id
        self._response: ResponseStream | None = response
        self._deadline = deadline_mono
        self._expected_seq = 0
        self._first_due = first_due
        """The call always has a chunk 0 (unary, or HTTP): an `End` before it, from a replica
        that does not count its chunks, means chunk 0 was lost."""
        self._inline = inline
        """A unary result that rode on the admission (nothing follows it on the stream)."""
        self._interruptions_seen = response.interruptions
        self._done = False  # End or an error was read (or the reader was closed)
        self._waiting = False
        self._pump_armed = pump
        self._pump_task: asyncio.Task[None] | None = None
        self._pump_queue: asyncio.Queue[Chunk | _Failure | None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        if pump:
            self._arm()

    @property
    def pumping(self) -> bool:
        return self._pump_task is not None

    async def next_chunk(self) -> Chunk | None:
        """The next chunk, or None after `End`. Raises RequestFailed, ReplicaLostError or
        DeadlineExceeded (the reader is finished afterwards)."""
        queue = self._pump_queue
        self._waiting = True
        try:
            if queue is not None:
                item = await queue.get()
                if isinstance(item, _Failure):
                    raise item.exc
            else:
                item = await self._read()
        except BaseException as exc:
            self.failed(exc)
            raise
        finally:
            self._waiting = False
        if item is None:
            await self.close()
        elif self._pump_armed:
            self._arm()
        return item

    async def unary_result(self) -> bytes | None:
        """A unary call's whole result, chunk 0's data (None: the stream ended without one);
        the reader is closed afterwards. A result that rode on the admission is taken as is."""
        try:
            inline = self._inline
            if inline is not None and not self._expected_seq and not self._done:
                self._expected_seq, self._done = 1, True  # nothing follows it on the stream
                return inline
            chunk = await self.next_chunk()
            return None if chunk is None else chunk.data
        finally:
            await self.close()

    def failed(self, exc: BaseException) -> None:
        """The request failed with `exc` (also for a response its caller could not use)."""
        if self._outcome == OK:
            self._outcome = outcome_of(exc)

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task = self._pump_task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._response is not None:
            response, self._response = self._response, None
            self._done = True
            await response.close()
            now = self._router.clock.monotonic()
            self._router.finished(self.replica_id, now)
            self._router.metrics.observe(self._outcome, now - self._started)
            if self._outcome == OK:
                self._router.counters.completed(
                    self._dispatched - self._started, now - self._dispatched, self._concurrency
                )
            else:
                self._router.counters.failed(self._outcome)

    # -- reading ------------------------------------------------------------------------------
    async def _read(self) -> Chunk | None:
        router, clock = self._router, self._router.clock
        response = self._response
        if response is None or self._done:
            raise RequestFailed(BAD_RESPONSE, "the response was already read to its end", False)
        if self._inline is not None:  # the result rode on the admission: chunk 0, then the end
            if self._expected_seq:
                self._done = True
                return None
            self._expected_seq = 1
            return Chunk(0, self._inline)
        liveness = router.liveness
        seen = liveness.mark(self.replica_id)
        silence: SilentRead | None = None  # made at the first silent interval, dropped on a message
        while True:
            remaining = self._deadline - clock.monotonic()
            if remaining <= 0:
                self._fail()
                raise DeadlineExceeded(f"waiting for {self.replica_id}")
            try:
                msg = await response.next(max(min(liveness.interval_s, remaining), MIN_TIMEOUT_S))
            except BusTimeout:
                if silence is None:
                    silence = SilentRead(
                        deadline=self._deadline,
                        seen=seen,
                        interruptions_seen=self._interruptions_seen,
                    )
                step = silence.timed_out(clock.monotonic(), liveness.mark(self.replica_id))
                if step is Step.DEADLINE:
                    continue
                if step is Step.ASK:
                    lost = not await liveness.holds(self.replica_id, self._request_id)
                    why = "it no longer holds the request: its reply was lost"
                else:
                    lost = step is Step.PROBE and await liveness.gone(self.replica_id)
                    why = "its connection is gone"
                after = silence.answered(
                    lost, liveness.mark(self.replica_id), response.interruptions
                )
                if after is After.INTERRUPTED:
                    self._fail()
                    raise ReplicaLostError(
                        self.replica_id,
                        "the connection to NATS dropped mid-request: its reply was lost",
                    ) from None
                if after is After.READ_ON:
                    continue
                # gone: but a replica that finished and then exited sent its result before it
                # unsubscribed, so the result may be on its way to us right behind the probe
                try:
                    msg = await response.next(LOST_GRACE_S)
                except (BusTimeout, NoResponders):
                    self._fail()
                    raise ReplicaLostError(self.replica_id, why) from None
            except NoResponders:
                self._fail()
                raise ReplicaLostError(self.replica_id, "no responders") from None
            # a message after a reconnect: replies flow again (a lost chunk shows as a gap)
            self._interruptions_seen, silence = response.interruptions, None
            liveness.heard(self.replica_id)
            seen = liveness.mark(self.replica_id)
            try:
                item = decode(msg.data)
            except WireError as exc:
                router.bad_input.drop(exc.reason, f"response from {self.replica_id}")
                self._fail()
                raise RequestFailed(
                    BAD_RESPONSE, f"{exc.reason}: {exc.detail}", False, self.replica_id
                ) from None
            if isinstance(item, Chunk):
                if item.seq != self._expected_seq:
                    self._fail()
                    raise self._skipped(item.seq)
                self._expected_seq += 1
                return item
            if isinstance(item, HealthFrame):
                router.fold_health(item.health, clock.monotonic())
                continue
            if isinstance(item, End):
                self._done = True
                sent = item.chunks
                # a count that differs; or no count, no chunk 0, and the call always has one
                if sent != self._expected_seq and (
                    sent is not None or (self._first_due and not self._expected_seq)
                ):
                    self._fail()
                    raise self._short(sent)
                return None
            self._fail()
            if isinstance(item, ErrorReply):
                raise RequestFailed(item.code, item.message, item.retryable, self.replica_id)
            raise RequestFailed(
                BAD_RESPONSE, f"unexpected {item.KIND!r} message", False, self.replica_id
            )

    def _fail(self) -> None:
        self._done = True
        self._pump_armed = False

    def _skipped(self, seq: int) -> RouterError:
        """Chunk `seq` where another was due: ahead, the ones between were lost in transit;
        behind, the replica broke the protocol (NATS never delivers twice)."""
        due = self._expected_seq
        if seq < due:
            why = f"chunk {seq} where {due} was due"
            return RequestFailed(BAD_RESPONSE, why, False, self.replica_id)
        missing = f"chunk {due}" if seq == due + 1 else f"chunks {due}-{seq - 1}"
        return ResponseLostError(self.replica_id, f"{missing} never arrived, chunk {seq} did")

    def _short(self, sent: int | None) -> RouterError:
        """`End` after `_expected_seq` chunks, when the replica sent `sent` (None: the replica
        does not count, and chunk 0 is missing)."""
        got = self._expected_seq
        if sent is None:
            return ResponseLostError(self.replica_id, "the end arrived, chunk 0 never did")
        if sent < got:
            why = f"the end counts {sent} chunks where {got} arrived"
            return RequestFailed(BAD_RESPONSE, why, False, self.replica_id)
        missing = f"chunk {got}" if sent == got + 1 else f"chunks {got}-{sent - 1}"
        return ResponseLostError(self.replica_id, f"{missing} of {sent} never arrived")

    # -- the lazy frame pump ----------------------------------------------------------------
    def _arm(self) -> None:
        if self._timer is None and self._pump_task is None and not self._done:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(
                self._router.config.frame_pump_delay_s, self._maybe_start_pump
            )

    def _maybe_start_pump(self) -> None:
        self._timer = None
        if self._waiting or self._done or self._pump_task is not None:
            return
        self._pump_queue = asyncio.Queue()
        self._pump_task = asyncio.get_running_loop().create_task(
            self._pump(self._pump_queue), name=f"frame-pump:{self.replica_id}"
        )

    async def _pump(self, queue: asyncio.Queue[Chunk | _Failure | None]) -> None:
        try:
            while True:
                item = await self._read()
                queue.put_nowait(item)
                if item is None:
                    return
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            queue.put_nowait(_Failure(exc))

"""The replica's I/O shell: rpc subject, probes, health loop, heartbeats, reports, lifecycle, drain.

Decisions live in small pure pieces (admission.py, health.py, suppression.py, window.py); this
module only moves messages between them and the bus. See docs/dataplane.md for the protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from fleetpulse.serve.multiplex import held_models, set_request_model_id
from shared.badinput import BadInput
from shared.bus import Bus, Msg, Subscription
from shared.clock import SYSTEM_CLOCK, Clock
from shared.errors import WireError
from shared.freshness import freshness_window
from shared.localhealth import DEFAULT_PROVIDERS, LocalHealthProviders
from shared.probes import not_held
from shared.subjects import Subjects
from shared.transitions import RefusalLog
from shared.wire import decode_as, encode, uservalues
from shared.wire.messages import (
    MAX_MODELS,
    Admission,
    CallArgs,
    Chunk,
    End,
    ErrorReply,
    HealthFrame,
    HealthStatus,
    Heartbeat,
    HttpRequest,
    Lifecycle,
    LifecycleState,
    ReplicaReport,
    Request,
)

from .admission import Admission as AdmissionControl
from .asgi import ReplicaAsgi, build_asgi_app, serve_carried
from .config import ReplicaConfig
from .custom_stats import TIMEOUT_S as STATS_TIMEOUT_S
from .custom_stats import CustomStats
from .health import HealthTracker, next_check_delay
from .inline import PendingAdmission
from .lifecycle import PROCESS_LIFECYCLE, ProcessState, Step
from .logsetup import ACCESS_LOGGER, access_enabled
from .metrics import OK, ReplicaMetrics
from .suppression import HealthCarriage, Via
from .usercode import MethodNotFound, UserDeployment, invoke, is_stream
from .window import LevelAverage

log = logging.getLogger(__name__)

TICK_MAX_S = 1.0


@dataclass(slots=True)
class _Held:
    reply: str
    frames: bool
    sent_checked_at: float
    pending: PendingAdmission | None = None
    """An admission waiting one loop turn for a unary result to ride on it (inline.py)."""


@dataclass(slots=True)
class ReplicaStats:
    admitted: int = 0
    rejected: int = 0
    completed: int = 0
    failed: int = 0
    heartbeats: int = 0
    frames: int = 0
    reports: int = 0
    probes: int = 0


class _RequestError(Exception):
    def __init__(self, code: str, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable


class ReplicaRuntime:
    def __init__(
        self,
        cfg: ReplicaConfig,
        bus: Bus,
        user: UserDeployment,
        *,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
        providers: LocalHealthProviders = DEFAULT_PROVIDERS,
        serves_http: bool = False,
    ) -> None:
        self.cfg = cfg
        self._providers = providers
        self._unregister_provider: Callable[[], None] | None = None
        self.bus = bus
        self.user = user
        self.clock = clock
        self.rng = rng or random.Random()
        self.subjects = Subjects(cfg.namespace)
        self.rpc_subject = self.subjects.rpc(cfg.app, cfg.deployment, cfg.replica_id)
        self.admission = AdmissionControl(cfg.spec.max_ongoing_requests)
        self.tracker = HealthTracker(cfg.replica_id)
        # custom metrics exist only in the replica's own reports: a deployment with them pushes;
        # so does a replica serving HTTP itself (no router sees that load, http_server.py)
        self.push_metrics = (
            cfg.spec.push_metrics or user.autoscaling_stats is not None or serves_http
        )
        # own reports carry every check only when they come at least once a period
        every_check = (
            self.push_metrics and cfg.spec.metrics_interval_s <= cfg.spec.health_check_period_s
        )
        self.carriage = HealthCarriage(
            freshness_window(cfg.spec.health_check_period_s), reports_carry_health=every_check
        )
        self.running = LevelAverage(clock.monotonic())
        self.stats = ReplicaStats()
        self.prom = ReplicaMetrics(cfg.app, cfg.deployment, self.admission, self.stats)
        self.bad = BadInput(f"replica {cfg.replica_id}", log, clock=clock)
        self.state: ProcessState = PROCESS_LIFECYCLE.initial
        """Where this process is in its lifecycle (lifecycle.py): moved only by `_step`."""
        self.refusals = RefusalLog(
            f"replica {cfg.replica_id}", log, self.prom.transition_refused, clock=clock
        )
        self.custom = CustomStats(
            user.autoscaling_stats,
            min(STATS_TIMEOUT_S, cfg.spec.metrics_interval_s / 2),
            self.bad,
            self.prom.autoscaling_stats,
        )
        self._held: dict[str, _Held] = {}
        self._wanted: dict[str, int] = {}
        """Admitted requests in flight by multiplexed model: those models are as good as held
        (each request loads its model), so admissions list them before their loads begin."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._subs: list[Subscription] = []
        self._report_seq = 0
        self._stopping = asyncio.Event()
        self.access = (
            logging.getLogger(ACCESS_LOGGER) if access_enabled(cfg.spec.logging_config) else None
        )
        """The access log (logging_config.enable_access_log): one line per request."""
        self.http_address: str | None = None
        """Where this replica serves HTTP itself (http_server.py), announced on "ready"."""
        self.drain_also: list[Callable[[], Coroutine[Any, Any, None]]] = []
        """Run alongside the in-flight requests while draining, each bounding itself by the
        grace timeout (the HTTP server's drain: no new connections, in-flight requests end)."""

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, serve_http: Callable[[], Awaitable[str]] | None = None) -> None:
        """Announce "starting", check health, serve; `serve_http` starts the HTTP server and
        returns its address, announced with "ready" (it raises: the start fails)."""
        if not self._step(Step.START):
            return
        await self._lifecycle(LifecycleState.STARTING)
        # an @serve.ingress app's lifespan runs before anything is served (asgi.py)
        await build_asgi_app(self.user).startup()
        await self._check_once()
        # inline: admission runs where the request is read, no task hand-over (natsdirect.py)
        self._subs.append(await self.bus.subscribe_inline(self.rpc_subject, self._on_rpc))
        self._subs.append(
            await self.bus.subscribe(self.subjects.probe(self.cfg.replica_id), self._on_probe)
        )
        self._loops.append(asyncio.create_task(self._health_loop(), name="health"))
        self._loops.append(asyncio.create_task(self._tick_loop(), name="tick"))
        if self.push_metrics:
            self._loops.append(asyncio.create_task(self._report_loop(), name="reports"))
        # composition: routers in this process to our app carry our health in their handle
        # reports; not when our own reports carry it already (it would go out twice)
        if not self.push_metrics:
            self._unregister_provider = self._providers.register(
                self.local_health, app=self.cfg.app
            )
        if serve_http is not None:
            self.http_address = await serve_http()
        if self._step(Step.READY):  # refused when a drain came while it started
            await self._lifecycle(LifecycleState.READY)
            log.info("replica %s ready on %s", self.cfg.replica_id, self.rpc_subject)

    async def drain(self) -> None:
        """Stop admitting, let in-flight work finish up to the grace timeout, then stop."""
        if not self._step(Step.DRAIN):  # a second drain, or one after the stop: nothing to do
            return
        self.admission.draining = True
        await self._lifecycle(LifecycleState.DRAINING)
        also = [asyncio.create_task(fn()) for fn in self.drain_also]
        pending = set(self._tasks)
        if pending:
            log.info("draining %d in-flight request(s)", len(pending))
            _, still = await asyncio.wait(
                pending, timeout=self.cfg.spec.graceful_shutdown_timeout_s
            )
            for task in still:
                task.cancel()
            if still:
                await asyncio.wait(still)
        await asyncio.gather(*also, return_exceptions=True)
        await self.stop(exit_code=0)

    async def stop(self, exit_code: int | None = 0) -> None:
        self._stopping.set()
        if self._unregister_provider is not None:
            self._unregister_provider()
            self._unregister_provider = None
        for task in self._loops:
            task.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._loops, *self._tasks, return_exceptions=True)
        with contextlib.suppress(Exception):  # the app's lifespan shutdown, after the requests
            await build_asgi_app(self.user).shutdown()
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._subs.clear()
        with contextlib.suppress(Exception):
            if self._step(Step.STOP):  # "exited" goes out once, however often stop() runs
                await self._lifecycle(LifecycleState.EXITED, exit_code=exit_code)
            await self.bus.flush()

    def _step(self, step: Step) -> bool:
        """Move through lifecycle.py's table; a refused step is counted and logged, and the
        caller announces nothing."""
        self.state, refused = PROCESS_LIFECYCLE.step(self.state, step)
        if refused is not None:
            self.refusals.refused(refused)
            return False
        return True

    async def _lifecycle(self, state: LifecycleState, exit_code: int | None = None) -> None:
        msg = Lifecycle(
            replica_id=self.cfg.replica_id,
            agent_id=self.cfg.agent_id,
            state=state.value,
            at=self.clock.wall(),
            rpc_subject=self.rpc_subject,
            version=self.cfg.version,
            exit_code=exit_code,
            app=self.cfg.app,
            deployment=self.cfg.deployment,
            # what the what-if model needs of this replica's capacity (docs/recording.md)
            max_ongoing_requests=self.cfg.spec.max_ongoing_requests if state == "ready" else None,
            http_address=self.http_address if state == "ready" else None,
        )
        subject = self.subjects.report(
            "lifecycle", self.cfg.app, self.cfg.deployment, self.cfg.replica_id
        )
        await self.bus.publish(subject, encode(msg))

    # -- health ------------------------------------------------------------------------------

    async def _check_once(self) -> HealthStatus:
        ok = await self.user.check_health(self.cfg.spec.health_check_timeout_s)
        status = self.tracker.record(ok, self.clock.wall())
        (self.prom.healthy if ok else self.prom.unhealthy).inc()
        self.carriage.on_check(status)
        if not ok:
            log.warning("health check failed (%d in a row)", status.consecutive_failures)
        return status

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(next_check_delay(self.cfg.spec.health_check_period_s, self.rng))
            status = await self._check_once()
            if not status.healthy:
                await self._maybe_heartbeat()  # bad news first, by the direct channel
            await self._frame_tick()
            await self._maybe_heartbeat()

    async def _frame_tick(self) -> None:
        for held in list(self._held.values()):
            if not held.frames or (held.pending is not None and not held.pending.gone):
                continue
            status = self.carriage.frame_due(held.sent_checked_at, self.clock.monotonic())
            if status is None:
                continue
            held.sent_checked_at = status.checked_at
            self.carriage.carried(status, self.clock.monotonic(), Via.FRAME)
            self.stats.frames += 1
            self.prom.frames.inc()
            await self.bus.publish(held.reply, encode(HealthFrame(status)))

    async def _maybe_heartbeat(self) -> None:
        latest = self.carriage.latest
        if latest is None or not self.carriage.heartbeat_due(self.clock.monotonic()):
            return
        self.carriage.carried(latest, self.clock.monotonic(), Via.HEARTBEAT)
        self.stats.heartbeats += 1
        self.prom.heartbeats.inc()
        subject = self.subjects.report(
            "heartbeat", self.cfg.app, self.cfg.deployment, self.cfg.replica_id
        )
        await self.bus.publish(subject, encode(Heartbeat(latest, self.clock.wall())))

    async def _tick_loop(self) -> None:
        tick = min(TICK_MAX_S, self.carriage.freshness_s / 4)
        while True:
            await asyncio.sleep(tick)
            try:
                # frames first: while a request is held they take over from riding channels
                await self._frame_tick()
                await self._maybe_heartbeat()
            except Exception:
                log.exception("heartbeat failed; will retry next tick")

    async def _report_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.spec.metrics_interval_s)
            try:
                await self._publish_report()
            except Exception:
                log.exception("report failed; will retry next interval")

    async def _publish_report(self) -> None:
        custom = await self.custom.collect()
        now = self.clock.monotonic()
        self._report_seq += 1
        latest = self.carriage.latest
        report = ReplicaReport(
            replica_id=self.cfg.replica_id,
            sent_at=self.clock.wall(),
            seq=self._report_seq,
            running_requests=self.running.take(now),
            custom=custom,
            health=latest,
        )
        if latest is not None:
            self.carriage.carried(latest, now, Via.REPORT)
        self.stats.reports += 1
        self.prom.reports.inc()
        subject = self.subjects.report(
            "replica", self.cfg.app, self.cfg.deployment, self.cfg.replica_id
        )
        await self.bus.publish(subject, encode(report))

    def local_health(self) -> HealthStatus | None:
        """For in-process routers (composition): they carry this replica's health in their reports."""
        latest = self.carriage.latest
        if latest is not None:
            self.carriage.carried(latest, self.clock.monotonic(), Via.HOST)
        return latest

    async def _on_probe(self, msg: Msg) -> None:
        latest = self.carriage.latest
        if msg.reply is None or latest is None:
            return
        try:
            gone = not_held(msg.data, self._held)
        except WireError as exc:
            self.bad.drop(exc.reason, f"probe: {exc.detail}")
            return
        if gone is not None:  # a router's reply for that request was lost on the way
            await self._send(msg.reply, gone)
            return
        self.stats.probes += 1
        self.prom.probes.inc()
        self.carriage.carried(latest, self.clock.monotonic(), Via.PROBE)
        await self.bus.publish(msg.reply, encode(latest))

    # -- requests ----------------------------------------------------------------------------

    def _on_rpc(self, msg: Msg) -> None:
        if msg.reply is None:
            self.bad.drop("no_reply", f"on {msg.subject}")
            return
        latest = self.carriage.latest
        assert latest is not None  # the first check runs before we subscribe
        now = self.clock.monotonic()
        try:
            req = decode_as(msg.data, Request)
        except WireError as exc:
            self.bad.drop(exc.reason, exc.detail)
            # every stream starts with one admission (docs/wire.md); the answer to this request
            # is the error, so the router surfaces it instead of trying another replica
            self.carriage.carried(latest, now, Via.ADMISSION)
            self._send_now(msg.reply, Admission(True, self.admission.ongoing, latest, False))
            self._send_now(msg.reply, ErrorReply("bad_request", str(exc), False))
            return
        if not self.admission.try_admit():
            self.stats.rejected += 1
            self.carriage.carried(latest, now, Via.ADMISSION)
            models = self._models()  # multiplexing: what it holds rides along
            rejected = Admission(False, self.admission.ongoing, latest, False, models)
            self._send_now(msg.reply, rejected)
            return
        self.stats.admitted += 1
        ongoing = self.admission.ongoing
        frames = req.supports_health_frames and not self.carriage.reports_carry_health
        self.carriage.carried(latest, now, Via.ADMISSION)
        self.running.set(ongoing, now)
        # the models held here ride along (multiplexing): routers send a model's requests here
        if req.multiplexed_model_id is not None:
            self._wanted[req.multiplexed_model_id] = (
                self._wanted.get(req.multiplexed_model_id, 0) + 1
            )
        models = self._models()
        held = self._held[req.request_id] = _Held(msg.reply, frames, latest.checked_at)
        admitted: Admission | None = None
        if req.accepts_inline_result and not req.stream and req.body_kind == "args":
            # built once it is known whether the result rides on it (inline.py)
            held.pending = PendingAdmission(ongoing, latest, frames, models)
        else:
            admitted = Admission(True, ongoing, latest, frames, models)
        # the task sends the admission itself: a quick result then leaves in the same socket
        # write (one syscall, not two), and the admission can never trail the first chunk
        task = asyncio.get_running_loop().create_task(self._serve(req, held, admitted, now))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- HTTP requests (http_server.py): counted exactly as requests over NATS --------------------

    def admit_http(self) -> bool:
        """An HTTP request asks to run: admitted under the same `max_ongoing_requests` as NATS
        requests (a draining replica still runs what reaches it: its server takes no new
        connections and closes idle ones, so only requests already on their way arrive)."""
        if not self.admission.try_admit(while_draining=True):
            self.stats.rejected += 1
            return False
        self.stats.admitted += 1
        self.running.set(self.admission.ongoing, self.clock.monotonic())
        return True

    def release_http(self, started: float, outcome: str, scope: Mapping[str, Any]) -> None:
        """An admitted HTTP request (or WebSocket: its ASGI `scope`) ended (`started`: this
        clock's monotonic time)."""
        self.admission.release()
        now = self.clock.monotonic()
        self.running.set(self.admission.ongoing, now)
        self.prom.observe(outcome, now - started)
        if outcome == OK:
            self.stats.completed += 1
        else:
            self.stats.failed += 1
        if self.access is not None:
            what = f"{scope.get('method', 'WS')} {scope.get('path', '')}"
            ms = round((now - started) * 1000.0, 3)
            self.access.info(
                "%s %s %.1f ms", what, outcome, ms,
                extra={"method": what, "outcome": outcome, "duration_ms": ms, "request_id": ""},
            )  # fmt: skip

    def _models(self) -> tuple[str, ...] | None:
        """The models an admission lists: wanted by requests in flight, then held (newest
        first); None when this deployment multiplexes nothing."""
        held = held_models(self.user.instance)
        if not self._wanted:
            return held
        return tuple(dict.fromkeys((*self._wanted, *(held or ()))))[:MAX_MODELS]

    def _unwant(self, model_id: str) -> None:
        left = self._wanted.get(model_id, 0) - 1
        if left > 0:
            self._wanted[model_id] = left
        else:
            self._wanted.pop(model_id, None)

    async def _send(self, reply: str, message: Any) -> None:
        """Stream parts and errors: `publish` waits when the write buffer is full."""
        await self.bus.publish(reply, encode(message))

    def _send_now(self, reply: str, message: Any) -> None:
        """Admissions and unary results: out at once (or with the rest of this loop turn's, at
        its end), in order with `_send` (shared/natsdirect.py)."""
        self.bus.publish_nowait(reply, encode(message))

    async def _serve(
        self, req: Request, held: _Held, admitted: Admission | None, started: float
    ) -> None:
        """`admitted`: the admission to send first, or None when it waits for the result
        (`held.pending`); `started`: when the request was admitted (this clock)."""
        outcome = OK
        reply = held.reply
        if req.multiplexed_model_id is not None:  # serve.get_multiplexed_model_id(), this task
            set_request_model_id(req.multiplexed_model_id)
        try:
            if admitted is None:
                asyncio.get_running_loop().call_soon(self._admission_due, reply, held)
            else:
                self._send_now(reply, admitted)
            timeout = None if req.deadline is None else req.deadline - self.clock.wall()
            if timeout is not None and timeout <= 0:
                raise _RequestError("deadline_exceeded", "deadline passed before the request ran")
            if timeout is None:  # no deadline: no timer (a tenth of a fast call's own cost)
                await self._execute(req, reply, held)
            else:
                try:
                    async with asyncio.timeout(timeout):  # not wait_for: usercode.check_health
                        await self._execute(req, reply, held)
                except TimeoutError:
                    msg = "request deadline exceeded"
                    raise _RequestError("deadline_exceeded", msg) from None
            self.stats.completed += 1
        except _RequestError as exc:
            self.stats.failed += 1
            outcome = exc.code
            self._admitted(reply, held)
            await self._send(reply, ErrorReply(exc.code, str(exc), exc.retryable))
        except asyncio.CancelledError:
            self.stats.failed += 1
            outcome = "replica_shutdown"
            with contextlib.suppress(Exception):
                self._admitted(reply, held)
                msg = "replica stopped before the request finished"
                await self._send(reply, ErrorReply("replica_shutdown", msg, True))
            raise
        except Exception as exc:
            self.stats.failed += 1
            outcome = "user_error"
            log.debug("user code raised", exc_info=True)
            self._admitted(reply, held)
            await self._send(reply, ErrorReply("user_error", f"{type(exc).__name__}: {exc}", False))
        finally:
            self._held.pop(req.request_id, None)
            if req.multiplexed_model_id is not None:
                self._unwant(req.multiplexed_model_id)
            self.admission.release()
            now = self.clock.monotonic()
            self.running.set(self.admission.ongoing, now)
            self.prom.observe(outcome, now - started)
            if self.access is not None:
                ms = round((now - started) * 1000.0, 3)
                self.access.info(
                    "%s %s %.1f ms", req.method, outcome, ms,
                    extra={"method": req.method, "outcome": outcome, "duration_ms": ms,
                           "request_id": req.request_id},
                )  # fmt: skip

    def _admission_due(self, reply: str, held: _Held) -> None:
        """One loop turn after admitting: a call still running sends its admission on its own."""
        pending = held.pending
        if pending is not None and pending.due():
            self._send_admission(reply, pending)

    def _send_admission(self, reply: str, pending: PendingAdmission) -> None:
        self._send_now(reply, pending.admission)
        pending.sent()

    def _admitted(self, reply: str, held: _Held | None) -> None:
        """The admission has left (or rode): anything else may follow it on the stream now."""
        pending = None if held is None else held.pending
        if pending is not None and pending.due():
            self._send_admission(reply, pending)

    async def _unary(self, reply: str, data: bytes, held: _Held | None) -> None:
        """A whole result: on the admission when it has not left, else as chunk 0 and end."""
        pending = None if held is None else held.pending
        rider = None if pending is None else pending.ride(data)
        if rider is not None:
            self._send_now(reply, rider)
            return
        self._admitted(reply, held)
        self._send_now(reply, Chunk(0, data))
        self._send_now(reply, End(1))

    async def _execute(self, req: Request, reply: str, held: _Held | None = None) -> None:
        if req.body_kind == "http":
            await self._execute_http(req, reply)
            return
        try:
            fn = self.user.resolve(req.method)
        except MethodNotFound as exc:
            raise _RequestError("method_not_found", str(exc)) from None
        try:
            if req.body_kind != "args":
                raise _RequestError("bad_request", f"unknown body_kind {req.body_kind!r}")
            call = decode_as(req.body, CallArgs)  # fresh: a tuple and a dict of its own
            args, kwargs = call.args, call.kwargs
        except WireError as exc:
            raise _RequestError("bad_request", str(exc)) from None
        result = await invoke(fn, args, kwargs)
        if is_stream(result):
            self._admitted(reply, held)
            sent = await self._stream(result, reply, collect=not req.stream)
        else:
            await self._unary(reply, _pack(result), held)
            return
        # the count lets the router tell a chunk lost in transit from a short result
        await self._send(reply, End(sent))

    async def _execute_http(self, req: Request, reply: str) -> None:
        """An HTTP request carried over NATS (the Python proxy, the gateway) goes through the
        same ASGI app as the replica's HTTP server (asgi.py): user code sees one request model."""
        try:
            app = self._asgi_for(req.method)
        except MethodNotFound as exc:
            raise _RequestError("method_not_found", str(exc)) from None
        seq = 0

        async def emit(data: bytes) -> None:
            nonlocal seq
            await self._send(reply, Chunk(seq, data))
            seq += 1

        try:
            http = decode_as(req.body, HttpRequest)
            await app.startup()  # once (the lifespan of an ingress app); then a no-op
            sent = await serve_carried(app, http, emit=emit, collect=not req.stream)
        except WireError as exc:  # ScopeError too: no HTTP server would have taken it
            raise _RequestError("bad_request", str(exc)) from None
        await self._send(reply, End(sent))

    def _asgi_for(self, method: str) -> ReplicaAsgi:
        """The replica's app for `__call__`; a gateway call naming another method (Fp-Method)
        gets that method served the same way."""
        if method == "__call__":
            app = build_asgi_app(self.user)
            if not app.is_ingress:
                self.user.resolve(method)  # none (served by handle only): method_not_found
            return app
        return build_asgi_app(self.user.resolve(method))

    async def _stream(self, items: Any, reply: str, *, collect: bool) -> int:
        """Send the items as chunks; returns how many chunks went out."""
        if collect:
            values = [item async for item in items]
            await self._send(reply, Chunk(0, _pack(values)))
            return 1
        seq = 0
        async for item in items:
            await self._send(reply, Chunk(seq, _pack(item)))
            seq += 1
        return seq


def _pack(value: Any) -> bytes:
    try:
        return uservalues.pack(value)
    except Exception as exc:
        raise _RequestError(
            "user_error", f"result is not msgpack-serialisable: {type(exc).__name__}: {exc}"
        ) from None

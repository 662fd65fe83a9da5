"""`Router`: the asyncio/NATS shell of one deployment's router, shared by every handle in a process.

How it works: one `Router` per (bus, namespace, app, deployment). Every decision is made by its
pure core (core.py: the choice of replica, the queue and its bound, carried health, membership,
when a report is due and what it says); this shell feeds the core events with the clock's `now`
and carries out the actions it returns:
- it watches KV `fp_membership` keys `{app}.{deployment}.>` (one key per slot; shared.kv.membership)
  and hands each change to the core; a re-established watch reads into a fresh view that the core
  installs whole, so no half-read member set is ever used; `RefreshSoon` is run on the next loop
  turn, so a burst of changes refreshes the chooser once;
- a request that finds no replica waits here on an `asyncio.Event`, its token in the core's line,
  for as long as the core says (`Wait`), until woken (`WakeHead`) or its deadline; the core's
  `Refuse` and `Expired` become BackPressureError and DeadlineExceeded;
- the reports task sleeps until the core says a report is due (or `WakeReporter`), then takes it
  from the core and publishes it to `fp.v1.report.handle.{app}.{deployment}` (reports.py picks
  msgpack or columnar); a failed publish is logged and never stops the next;
- liveness (liveness.py) probes replicas for the response readers; the core's `MembersChanged`
  prunes it.

Nothing here runs per request except O(1) bookkeeping (`dispatched`, `admitted`, `finished`);
report work happens on the reports task only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import uuid
from collections.abc import Coroutine, Mapping
from typing import Any, Final

from services.router.carried_health import CarriedHealthMap
from services.router.choice import ReplicaChooser
from services.router.config import RouterConfig, default_router_config
from services.router.core import (
    MIN_WAIT_S,
    Actions,
    CheckRise,
    Expired,
    MembersChanged,
    RefreshSoon,
    Refuse,
    RouterCore,
    Take,
    WakeHead,
    WakeReporter,
    view_of,
)
from services.router.errors import BackPressureError, DeadlineExceeded, RouterClosedError
from services.router.liveness import Liveness
from services.router.metrics import RouterMetrics
from services.router.reports import RequestCounters, encode_handle_report
from services.router.rise import RiseDetector
from services.router.window import TimeWeightedCounts, TimeWeightedGauge
from shared.badinput import BadInput
from shared.bus import Bus, RateLimiter
from shared.clock import SYSTEM_CLOCK, Clock
from shared.errors import BusError, WireError
from shared.kv import buckets
from shared.kv.membership import Member, MembershipView, deployment_pattern
from shared.kv.view import DocKV, DocWatch
from shared.localhealth import DEFAULT_PROVIDERS, LocalHealthProviders
from shared.subjects import DEFAULT_SUBJECTS, Subjects, deployment_key
from shared.wire.limits import REPORT_PART_MAX_BYTES
from shared.wire.messages import Admission, HandleReport, HealthStatus

logger = logging.getLogger(__name__)

WATCH_RETRY_S: Final = 1.0
"""Pause before re-establishing a membership watch that failed or ended."""
REPORT_ERROR_LOG_INTERVAL_S: Final = 10.0
WATCH_ERROR_LOG_INTERVAL_S: Final = 60.0


class Router:
    def __init__(
        self,
        app: str,
        deployment: str,
        *,
        bus: Bus,
        config: RouterConfig | None = None,
        clock: Clock = SYSTEM_CLOCK,
        subjects: Subjects = DEFAULT_SUBJECTS,
        rng: random.Random | None = None,
        providers: LocalHealthProviders = DEFAULT_PROVIDERS,
        handle_id: str | None = None,
    ) -> None:
        self.app = app
        self.deployment = deployment
        self.bus = bus
        self.config = config = config if config is not None else default_router_config()
        self.clock = clock
        self.subjects = subjects
        self.handle_id = handle_id or uuid.uuid4().hex
        self.providers = providers
        self.report_subject = subjects.report("handle", app, deployment)
        self.key = deployment_key(app, deployment)
        self.core: RouterCore[asyncio.Event] = RouterCore(
            app, deployment, handle_id=self.handle_id, config=config, subjects=subjects,
            now=clock.monotonic(), rng=rng,
        )  # fmt: skip
        self.reports_sent = 0
        self.bad_input = BadInput(f"router {self.key}", logger, clock=clock)
        self.metrics = RouterMetrics(app, deployment)
        self.liveness = Liveness(
            bus, clock, subjects,
            interval_s=config.liveness_interval_s, probe_timeout_s=config.probe_timeout_s,
            fold=self.fold_health, bad_input=self.bad_input,
        )  # fmt: skip
        self._ready = asyncio.Event()
        self._report_wake = asyncio.Event()
        """Set on the core's `WakeReporter`: the next report is due earlier (re-arm the wait)."""
        self._report_errors = RateLimiter(REPORT_ERROR_LOG_INTERVAL_S, clock)
        self._watch_errors = RateLimiter(WATCH_ERROR_LOG_INTERVAL_S, clock)
        self._tasks: list[asyncio.Task[None]] = []
        self._watcher: DocWatch[Member] | None = None
        self._started = False
        self.closed = False

    # -- the core's state, read through (tests, tools, call.py) -----------------------------------
    @property
    def chooser(self) -> ReplicaChooser:
        return self.core.chooser

    @property
    def health(self) -> CarriedHealthMap:
        return self.core.health

    @property
    def running(self) -> TimeWeightedCounts:
        return self.core.running

    @property
    def queued(self) -> TimeWeightedGauge:
        return self.core.queued

    @property
    def counters(self) -> RequestCounters:
        return self.core.counters

    @property
    def rise(self) -> RiseDetector:
        return self.core.rise

    @property
    def members(self) -> dict[str, Member]:
        return self.core.members

    @property
    def probe_subjects(self) -> dict[str, str]:
        return self.core.probe_subjects

    @property
    def view(self) -> MembershipView:
        return self.core.view

    @property
    def epoch(self) -> int:
        return self.core.epoch

    @property
    def seq(self) -> int:
        return self.core.seq

    @property
    def queued_now(self) -> int:
        return self.core.queued_now

    @property
    def in_flight_now(self) -> int:
        return self.core.in_flight_now

    @property
    def queue_bound(self) -> tuple[int, str]:
        return self.core.queue_bound

    @property
    def report_interval_s(self) -> float:
        return self.core.report_interval_s

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        if self._started:
            return
        if self.closed:
            raise RouterClosedError(f"router for {self.key} is closed")
        self._started = True
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._watch_membership(), name=f"router-watch:{self.key}"),
            loop.create_task(self._report_loop(), name=f"router-reports:{self.key}"),
        ]

    async def wait_ready(self, timeout_s: float | None = None) -> None:
        """Wait until the initial membership is known (or known to be absent)."""
        await self.start()
        async with asyncio.timeout(timeout_s):
            await self._ready.wait()

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for waiter in self.core.line:
            waiter.set()  # every waiter looks, and finds the router closed
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._watcher is not None:
            with contextlib.suppress(Exception):
                await self._watcher.stop()

    # -- carrying out the core's actions ------------------------------------------------------------
    def _perform(self, actions: Actions, now: float) -> None:
        for action in actions:
            if isinstance(action, WakeHead):
                self._notify()
            elif isinstance(action, WakeReporter):
                self._report_wake.set()
            elif isinstance(action, RefreshSoon):
                asyncio.get_running_loop().call_soon(self._refresh)
            elif isinstance(action, CheckRise):
                asyncio.get_running_loop().call_later(action.at - now, self._rise_check)
            elif isinstance(action, MembersChanged):
                self.liveness.probe_subjects = action.probe_subjects
                self.liveness.prune_to(action.members)
                self._notify()
                logger.debug(
                    "router %s: membership epoch %d, %d replicas",
                    self.key,
                    action.epoch,
                    len(action.members),
                )

    def _notify(self) -> None:
        """Something may have freed capacity: the oldest waiter looks (and hands on)."""
        head = self.core.line.head()
        if head is not None:
            head.set()

    def _rise_check(self) -> None:
        if not self.closed:
            now = self.clock.monotonic()
            self._perform(self.core.rise_check(now), now)

    # -- membership ---------------------------------------------------------------------------
    def apply_members(self, epoch: int, members: list[Member]) -> bool:
        """Replace the whole view (tests and tools; the watch applies changes one by one); True
        if the member set changed."""
        actions = self.core.install_view(view_of(self.app, self.deployment, epoch, members))
        self._perform(actions, self.clock.monotonic())
        return any(isinstance(a, MembersChanged) for a in actions)

    def _refresh(self) -> None:
        changed = self.core.refresh()
        if changed is not None:
            self._perform((changed,), self.clock.monotonic())

    async def _watch_membership(self) -> None:
        while not self.closed:
            try:
                await self._watch_once()
            except asyncio.CancelledError:
                raise
            except BusError as exc:
                # no bucket yet (no controller has run): a deployment nobody created has no replicas
                if self._watch_errors.allow():
                    logger.info("router %s: membership not available (%s); retrying", self.key, exc)
            except Exception:
                if self._watch_errors.allow():
                    logger.exception("router %s: membership watch failed; retrying", self.key)
            self._ready.set()
            await asyncio.sleep(WATCH_RETRY_S)

    async def _watch_once(self) -> None:
        kv = await buckets.open_bucket(self.bus, buckets.MEMBERSHIP, create=False)
        docs = DocKV(kv, Member, self.bad_input)
        watch = await docs.watch(deployment_pattern(self.app, self.deployment))
        self._watcher = watch
        view = MembershipView(self.app, self.deployment)  # the core installs it once complete
        core = self.core
        try:
            async for change in watch:
                if change is None:
                    self._perform(core.install_view(view), self.clock.monotonic())
                    self._ready.set()
                    continue
                try:
                    actions = core.member_changed(view, change.key, change.doc or None)
                except WireError as exc:
                    self.bad_input.drop(exc.reason, exc.detail)
                    continue
                if actions:
                    self._perform(actions, self.clock.monotonic())
        finally:
            with contextlib.suppress(Exception):
                await watch.stop()

    # -- per-request bookkeeping (the fast path: O(1), no awaits) ------------------------------
    def dispatched(self, replica_id: str, now: float, model_id: str | None = None) -> None:
        actions = self.core.dispatched(replica_id, now, model_id)
        if actions:
            self._perform(actions, now)

    def admitted(
        self,
        replica_id: str,
        admission: Admission,
        now: float,
        model_id: str | None = None,
        dispatch: int | None = None,
    ) -> None:
        self.core.admitted(replica_id, admission, now, model_id, dispatch)
        self.liveness.heard(replica_id)
        if not admission.accepted:
            self.metrics.rejected.inc()

    def unreachable(self, replica_id: str, now: float) -> None:
        self.metrics.unreachable.inc()
        self.core.unreachable(replica_id, now)

    def finished(self, replica_id: str, now: float) -> None:
        actions = self.core.finished(replica_id, now)
        if actions:
            self._perform(actions, now)

    def fold_health(self, status: HealthStatus, now: float) -> None:
        self.core.fold_health(status, now)

    # -- choosing, or waiting in the queue ------------------------------------------------------
    async def acquire(
        self,
        deadline_mono: float,
        exclude: set[str],
        *,
        retry: bool = False,
        model_id: str | None = None,
    ) -> str:
        """A replica to send to now; waits in the queue when none is available or others wait
        already. `retry`: a replica refused this request, which is older than the waiters.
        `model_id`: its multiplexed model (a replica holding it first)."""
        chosen = self.acquire_soon(deadline_mono, exclude, retry=retry, model_id=model_id)
        return chosen if isinstance(chosen, str) else await chosen

    def acquire_soon(
        self,
        deadline_mono: float,
        exclude: set[str],
        *,
        retry: bool = False,
        model_id: str | None = None,
    ) -> str | Coroutine[Any, Any, str]:
        """`acquire` that is no coroutine when a replica is free now (the usual call): the
        replica, else a coroutine to await for it (waiting for the membership or in the
        queue). Raises RouterClosedError as `acquire` does."""
        if not self._ready.is_set():
            return self._acquire_when_ready(deadline_mono, exclude, retry, model_id)
        if self.closed:
            raise RouterClosedError(f"router for {self.key} is closed")
        rid = self.core.choose(self.clock.monotonic(), exclude, retry=retry, model_id=model_id)
        if rid is not None:
            return rid
        return self._wait_in_queue(deadline_mono, exclude, front=retry, model_id=model_id)

    async def _acquire_when_ready(
        self, deadline_mono: float, exclude: set[str], retry: bool, model_id: str | None
    ) -> str:
        await self._wait_ready_until(deadline_mono)
        if self.closed:
            raise RouterClosedError(f"router for {self.key} is closed")
        rid = self.core.choose(self.clock.monotonic(), exclude, retry=retry, model_id=model_id)
        if rid is not None:
            return rid
        return await self._wait_in_queue(deadline_mono, exclude, front=retry, model_id=model_id)

    async def _wait_ready_until(self, deadline_mono: float) -> None:
        await self.start()
        remaining = deadline_mono - self.clock.monotonic()
        try:
            async with asyncio.timeout(None if math.isinf(remaining) else max(remaining, 0)):
                await self._ready.wait()
        except TimeoutError:
            raise DeadlineExceeded("waiting for the deployment's membership") from None

    async def _wait_in_queue(
        self, deadline_mono: float, exclude: set[str], *, front: bool, model_id: str | None
    ) -> str:
        clock, core = self.clock, self.core
        waiter = asyncio.Event()
        joined = False
        try:
            while True:
                if self.closed:
                    raise RouterClosedError(f"router for {self.key} is closed")
                now = clock.monotonic()
                look = core.queue_step(
                    waiter, joined, now, deadline_mono, exclude, front=front, model_id=model_id
                )
                if isinstance(look, Take):
                    return look.replica_id
                if isinstance(look, Expired):
                    raise DeadlineExceeded(
                        f"no replica of {self.key} accepted the request in time "
                        f"({look.replicas} replicas)"
                    )
                if isinstance(look, Refuse):
                    raise BackPressureError(
                        look.queued, look.limit, deployment=self.key, setting=look.setting
                    )
                if look.joined:
                    joined = True
                    self.metrics.queued.inc()
                if look.actions:
                    self._perform(look.actions, now)
                wait = look.wait_s
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(None if math.isinf(wait) else max(wait, MIN_WAIT_S)):
                        await waiter.wait()
                waiter.clear()  # no await until the next look: no wake can be lost
        finally:
            if joined:
                now = clock.monotonic()
                actions = core.leave_queue(waiter, now)
                self.metrics.queued.dec()
                if actions:
                    self._perform(actions, now)

    # -- reports --------------------------------------------------------------------------------
    async def _report_loop(self) -> None:
        core, clock = self.core, self.clock
        core.start_reports(clock.monotonic())
        while not self.closed:
            wait = core.report_wait(clock.monotonic())
            if wait > 0:
                try:
                    async with asyncio.timeout(wait):
                        await self._report_wake.wait()
                except TimeoutError:
                    pass  # due
                else:
                    self._report_wake.clear()
                    continue  # due earlier now: look again
            self._report_wake.clear()
            try:
                now = clock.monotonic()
                report = core.take_report(now, clock.wall(), self.providers.collect(self.app))
                await self._publish(report)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a report failing must never stop the next one
                if self._report_errors.allow():
                    logger.warning(
                        "router %s: handle report not sent: %s: %s",
                        self.key,
                        type(exc).__name__,
                        exc,
                    )

    def make_report(self, *, cold_start: bool = False) -> HandleReport:
        """Close the windows and build the next report (seq advances by one)."""
        now = self.clock.monotonic()
        return self.core.make_report(
            now, self.clock.wall(), self.providers.collect(self.app), cold_start=cold_start
        )

    async def send_report(self, *, cold_start: bool = False) -> HandleReport:
        report = self.make_report(cold_start=cold_start)
        await self._publish(report)
        return report

    async def _publish(self, report: HandleReport) -> None:
        parts = encode_handle_report(
            report,
            columnar_min_replicas=self.config.columnar_min_replicas,
            max_payload=min(self.bus.max_payload, REPORT_PART_MAX_BYTES),
        )
        for part in parts:
            await self.bus.publish(self.report_subject, part)
        self.reports_sent += 1
        self.metrics.reports.inc()

    # -- introspection ----------------------------------------------------------------------------
    def snapshot(self) -> Mapping[str, object]:
        return {
            "app": self.app,
            "deployment": self.deployment,
            "epoch": self.epoch,
            "replicas": list(self.members),
            "queued": self.queued_now,
            "in_flight": self.chooser.in_flight_total(),
            "reports_sent": self.reports_sent,
            "bad_input": dict(self.bad_input.counts),
        }

"""`Router`: the per-deployment state every handle in a process shares.

How it works: one `Router` per (bus, namespace, app, deployment) owns
- the membership, from a watch on KV `fp_membership` keys `{app}.{deployment}.>` (one key per
  slot: a put replaces that slot's member, a delete empties it; shared.kv.membership). The initial
  values are gathered into a fresh view that replaces the old one at once when complete, so a
  re-established watch never shows a half-read member set; a burst of changes is applied to the
  chooser once (the refresh is coalesced). The view epoch is the largest member epoch applied;
- the replica chooser (choice.py), the carried-health map (carried_health.py) and the
  time-weighted windows (window.py) that feed the handle reports;
- the queue: a request that finds no available replica (none at all, all full at their
  `max_ongoing_requests`, or all backing off after rejections) waits here, oldest first
  (waitqueue.py), bounded by the deployment's `max_queued_requests` (its members carry it; else
  the router config's) (BackPressureError) and by its deadline (DeadlineExceeded). A newcomer
  does not overtake a waiter. The head wakes on membership changes, on a request finishing, on
  the earliest backoff expiry, and at least every `queue_poll_max_s`; a head that leaves wakes
  the next (the others sleep until then or their deadline). A request queued while the deployment
  has zero replicas triggers an immediate handle report (cold start), at most once per
  `cold_start_report_min_interval_s`; the regular cadence then continues;
- the reports loop: every report interval it closes the windows and publishes a handle report
  to `fp.v1.report.handle.{app}.{deployment}` (reports.py picks msgpack or columnar). The interval
  is the deployment's `metrics_interval_s`, which its members carry (`report_interval_s`); until
  a member has told it (no replica yet, or an older controller) it is the router config's
  `metrics_interval_s`. A change takes effect at once: the wait for the next report is re-armed.
  A jump in load that holds for a moment is reported at once, its averages covering only the
  jump (rise.py), so the autoscaler's delay starts then rather than up to an interval later.

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
from collections.abc import Mapping
from typing import Final

from services.router.carried_health import CarriedHealthMap
from services.router.choice import ReplicaChooser
from services.router.config import RouterConfig, default_router_config
from services.router.errors import BackPressureError, DeadlineExceeded, RouterClosedError
from services.router.liveness import Liveness
from services.router.metrics import RouterMetrics
from services.router.reports import (
    DEFAULT_PROVIDERS,
    LocalHealthProviders,
    RequestCounters,
    build_handle_report,
    encode_handle_report,
)
from services.router.rise import RISE_SETTLE_S, RiseDetector
from services.router.waitqueue import WaitQueue
from services.router.window import TimeWeightedCounts, TimeWeightedGauge
from shared.badinput import BadInput
from shared.bus import Bus, RateLimiter
from shared.clock import SYSTEM_CLOCK, Clock
from shared.errors import BusError, WireError
from shared.kv import buckets
from shared.kv.membership import Member, MembershipView, deployment_pattern
from shared.kv.view import DocKV, DocWatch
from shared.subjects import DEFAULT_SUBJECTS, Subjects, deployment_key
from shared.wire.limits import REPORT_PART_MAX_BYTES
from shared.wire.messages import Admission, HandleReport, HealthStatus

logger = logging.getLogger(__name__)

WATCH_RETRY_S: Final = 1.0
"""Pause before re-establishing a membership watch that failed or ended."""
REPORT_ERROR_LOG_INTERVAL_S: Final = 10.0
WATCH_ERROR_LOG_INTERVAL_S: Final = 60.0
MIN_WAIT_S: Final = 0.001


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
        now = clock.monotonic()
        self.chooser = ReplicaChooser(
            rng, backoff_initial_s=config.backoff_initial_s, backoff_max_s=config.backoff_max_s
        )
        self.health = CarriedHealthMap()
        self.running = TimeWeightedCounts(now)
        self.queued = TimeWeightedGauge(now)
        self.counters = RequestCounters()
        self.members: dict[str, Member] = {}
        self.probe_subjects: dict[str, str] = {}
        self.view = MembershipView(app, deployment)
        self.epoch = -1
        self._refresh_scheduled = False
        self.seq = 0
        self.queued_now = 0
        self.reports_sent = 0
        self.bad_input = BadInput(f"router {self.key}", logger, clock=clock)
        self.metrics = RouterMetrics(app, deployment)
        self.liveness = Liveness(
            bus, clock, subjects,
            interval_s=config.liveness_interval_s, probe_timeout_s=config.probe_timeout_s,
            fold=self.fold_health, bad_input=self.bad_input,
        )  # fmt: skip
        self._queue = WaitQueue()
        self._ready = asyncio.Event()
        self._report_wake = asyncio.Event()
        """Set for a cold-start report, or when the report interval changed (re-arm the wait)."""
        self._cold_report = False
        self._last_cold_report = -math.inf
        self.in_flight_now = 0
        self.rise = RiseDetector(config.cold_start_report_min_interval_s)
        self._early_report = False
        self._report_errors = RateLimiter(REPORT_ERROR_LOG_INTERVAL_S, clock)
        self._watch_errors = RateLimiter(WATCH_ERROR_LOG_INTERVAL_S, clock)
        self._tasks: list[asyncio.Task[None]] = []
        self._watcher: DocWatch[Member] | None = None
        self._started = False
        self.closed = False

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
        self._queue.wake_all()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._watcher is not None:
            with contextlib.suppress(Exception):
                await self._watcher.stop()

    # -- membership ---------------------------------------------------------------------------
    def apply_members(self, epoch: int, members: list[Member]) -> bool:
        """Replace the whole view (tests and tools; the watch applies changes one by one)."""
        view = MembershipView(self.app, self.deployment)
        for m in members:
            view.put(m.key, m)
        view.epoch = max(view.epoch, epoch)
        self.view = view
        return self._refresh()

    def _refresh(self) -> bool:
        """Hand the view to the chooser and the health map; True if the member set changed."""
        self._refresh_scheduled = False
        self.epoch = max(self.epoch, self.view.epoch)
        members = {m.replica_id: m for m in self.view.members()}
        if members.keys() == self.members.keys() and all(
            (members[r].rpc_subject, members[r].max_ongoing_requests)
            == (self.members[r].rpc_subject, self.members[r].max_ongoing_requests)
            for r in members
        ):
            self.members = members
            return False
        self.members = members
        self.probe_subjects = {rid: self.subjects.probe(rid) for rid in members}
        self.liveness.probe_subjects = self.probe_subjects
        self.chooser.set_members(
            members, {rid: m.max_ongoing_requests for rid, m in members.items()}
        )
        self.health.prune_to(members)
        self.liveness.prune_to(members)
        self._notify()
        logger.debug(
            "router %s: membership epoch %d, %d replicas", self.key, self.epoch, len(members)
        )
        return True

    def _refresh_soon(self) -> None:
        if not self._refresh_scheduled:
            self._refresh_scheduled = True
            asyncio.get_running_loop().call_soon(self._refresh)

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
        view = MembershipView(self.app, self.deployment)
        initial = True
        try:
            async for change in watch:
                if change is None:
                    initial = False
                    self.view = view
                    self._refresh()
                    self._report_wake.set()
                    self._ready.set()
                    continue
                interval = view.report_interval_s
                try:
                    changed = (
                        view.put(change.key, change.doc) if change.doc else view.delete(change.key)
                    )
                except WireError as exc:
                    self.bad_input.drop(exc.reason, exc.detail)
                    continue
                if changed and not initial:
                    self._refresh_soon()
                if view.report_interval_s != interval and not initial:
                    self._report_wake.set()
        finally:
            with contextlib.suppress(Exception):
                await watch.stop()

    # -- per-request bookkeeping (the fast path: O(1), no awaits) ------------------------------
    def dispatched(self, replica_id: str, now: float) -> None:
        self.chooser.on_dispatch(replica_id)
        self.running.add(replica_id, 1.0, now)
        self.in_flight_now += 1
        self._load_rose(now)

    def admitted(self, replica_id: str, admission: Admission, now: float) -> None:
        self.health.observe(admission.health, now)
        self.liveness.heard(replica_id)
        if not admission.accepted:
            self.metrics.rejected.inc()
        self.chooser.on_admission(replica_id, admission.accepted, admission.num_ongoing, now)

    def unreachable(self, replica_id: str, now: float) -> None:
        self.metrics.unreachable.inc()
        self.chooser.on_unreachable(replica_id, now)

    def finished(self, replica_id: str, now: float) -> None:
        self.chooser.on_finish(replica_id)
        self.running.add(replica_id, -1.0, now)
        self.in_flight_now -= 1
        if self.queued_now:
            # a slot freed there: let a waiter try that replica before its backoff runs out
            self.chooser.on_capacity_freed(replica_id)
            self._notify()

    def fold_health(self, status: HealthStatus, now: float) -> None:
        self.health.observe(status, now)

    # -- choosing, or waiting in the queue ------------------------------------------------------
    async def acquire(self, deadline_mono: float, exclude: set[str], *, retry: bool = False) -> str:
        """A replica to send to now; waits in the queue when none is available or others wait
        already. `retry`: a replica refused this request, which is older than the waiters."""
        if not self._ready.is_set():
            await self._wait_ready_until(deadline_mono)
        if self.closed:
            raise RouterClosedError(f"router for {self.key} is closed")
        if not self._queue or retry:
            rid = self.chooser.choose(self.clock.monotonic(), exclude)
            if rid is not None:
                return rid
        return await self._wait_in_queue(deadline_mono, exclude, front=retry)

    async def _wait_ready_until(self, deadline_mono: float) -> None:
        await self.start()
        remaining = deadline_mono - self.clock.monotonic()
        try:
            async with asyncio.timeout(None if math.isinf(remaining) else max(remaining, 0)):
                await self._ready.wait()
        except TimeoutError:
            raise DeadlineExceeded("waiting for the deployment's membership") from None

    async def _wait_in_queue(self, deadline_mono: float, exclude: set[str], *, front: bool) -> str:
        clock, chooser, cfg, line = self.clock, self.chooser, self.config, self._queue
        waiter: asyncio.Event | None = None
        try:
            while True:
                if self.closed:
                    raise RouterClosedError(f"router for {self.key} is closed")
                now = clock.monotonic()
                # only the oldest may take a replica (a refused request counts as the oldest)
                may_take = line.is_head(waiter) if waiter is not None else front or not line
                if may_take:
                    rid = chooser.choose(now, exclude)
                    if rid is None and exclude:
                        exclude.clear()  # everyone failed this request once: try them all again
                        rid = chooser.choose(now)
                    if rid is not None:
                        return rid
                if now >= deadline_mono:
                    raise DeadlineExceeded(
                        f"no replica of {self.key} accepted the request in time "
                        f"({len(self.members)} replicas)"
                    )
                if waiter is None:
                    limit, setting = self.queue_bound
                    if self.queued_now >= limit:
                        raise BackPressureError(
                            self.queued_now, limit, deployment=self.key, setting=setting
                        )
                    waiter = line.join(front=front)
                    self.queued_now += 1
                    self.queued.add(1.0, now)
                    self.metrics.queued.inc()
                    if not self.members:
                        self._cold_start(now)
                    else:
                        self._load_rose(now)
                wait = deadline_mono - now  # behind the head: it hands on its turn, no polling
                if line.is_head(waiter):
                    wait = min(wait, cfg.queue_poll_max_s)
                    next_at = chooser.next_available_at(now)
                    if next_at is not None and next_at > now:
                        wait = min(wait, next_at - now)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(None if math.isinf(wait) else max(wait, MIN_WAIT_S)):
                        await waiter.wait()
                waiter.clear()  # no await until the next look: no wake can be lost
        finally:
            if waiter is not None:
                line.leave(waiter)
                self.queued_now -= 1
                self.queued.add(-1.0, clock.monotonic())
                self.metrics.queued.dec()

    def _notify(self) -> None:
        """Something may have freed capacity: the oldest waiter looks (and hands on)."""
        self._queue.wake_head()

    def _cold_start(self, now: float) -> None:
        if now - self._last_cold_report >= self.config.cold_start_report_min_interval_s:
            self._last_cold_report = now
            self._cold_report = True
            self._report_wake.set()

    def _load_rose(self, now: float) -> None:
        """O(1) on the request path: a rise starting here restarts the averages (rise.py)."""
        if self.rise.begin(self.in_flight_now + self.queued_now, now):
            self.running.roll(now)
            self.queued.roll(now)
            asyncio.get_running_loop().call_later(RISE_SETTLE_S, self._rise_check)

    def _rise_check(self) -> None:
        load = self.in_flight_now + self.queued_now
        if not self.closed and self.rise.settled(load, self.clock.monotonic()):
            self._early_report = True
            self._report_wake.set()

    @property
    def queue_bound(self) -> tuple[int, str]:
        """How many requests may wait here, and which setting says so: the deployment's
        `max_queued_requests` (its members carry it), else this router's own bound."""
        carried = self.view.max_queued_requests
        if carried is not None:
            return carried, "the deployment's max_queued_requests"
        return self.config.max_queued_requests, "the router's --max-queued"

    # -- reports --------------------------------------------------------------------------------
    @property
    def report_interval_s(self) -> float:
        """The deployment's report cadence (see the module docstring)."""
        carried = self.view.report_interval_s
        return self.config.metrics_interval_s if carried is None else carried

    async def _report_loop(self) -> None:
        last = self.clock.monotonic()
        while not self.closed:
            wait = last + self.report_interval_s - self.clock.monotonic()
            if wait > MIN_WAIT_S and not (self._cold_report or self._early_report):
                try:
                    async with asyncio.timeout(wait):
                        await self._report_wake.wait()
                except TimeoutError:
                    pass  # due
                else:
                    self._report_wake.clear()
                    continue  # a cold start or a new interval: look again
            cold, self._cold_report, self._early_report = self._cold_report, False, False
            self._report_wake.clear()
            last = self.clock.monotonic()
            try:
                await self.send_report(cold_start=cold)
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
        self.health.expire(now)
        running = self.running.roll(now)
        self.running.forget_idle(self.members)
        for rid in self.members:
            running.setdefault(rid, 0.0)
        queued = self.queued.roll(now)
        if cold_start:
            # the window may be nearly empty; the controller must see the waiting request
            queued = max(queued, float(self.queued_now))
        self.seq += 1
        self.rise.reported(math.fsum(running.values()) + queued)
        return build_handle_report(
            handle_id=self.handle_id,
            app=self.app,
            deployment=self.deployment,
            seq=self.seq,
            sent_at=self.clock.wall(),
            queued_requests=queued,
            running=running,
            carried_health=self.health.snapshot(now),
            local_health=self.providers.collect(self.app),
            membership_epoch=max(self.epoch, 0),
            stats=self.counters.snapshot(),
        )

    async def send_report(self, *, cold_start: bool = False) -> HandleReport:
        report = self.make_report(cold_start=cold_start)
        parts = encode_handle_report(
            report,
            columnar_min_replicas=self.config.columnar_min_replicas,
            max_payload=min(self.bus.max_payload, REPORT_PART_MAX_BYTES),
        )
        for part in parts:
            await self.bus.publish(self.report_subject, part)
        self.reports_sent += 1
        self.metrics.reports.inc()
        return report

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

"""`Router`: the per-deployment state every handle in a process shares.

How it works: one `Router` per (bus, namespace, app, deployment) owns
- the membership, from a watch on KV `fp_membership` key `{app}.{deployment}`; a value is applied
  only when its epoch is newer than the one held (a watch replays old values after a reconnect, so
  an equal epoch is a no-op); a deleted key empties the member set but keeps the epoch;
- the replica chooser (choice.py), the carried-health map (carried_health.py) and the
  time-weighted windows (window.py) that feed the handle reports;
- the queue: a request that finds no available replica (none at all, or all backing off after
  rejections) waits here, bounded by `max_queued_requests` (BackPressureError) and by its deadline
  (DeadlineExceeded). Waiters wake on membership changes, on a request finishing, on the earliest
  backoff expiry, and at least every `queue_poll_max_s`. A request queued while the deployment
  has zero replicas triggers an immediate handle report (cold start), at most once per
  `cold_start_report_min_interval_s`; the regular cadence then continues;
- the reports loop: every `metrics_interval_s` it closes the windows and publishes a handle report
  to `fp.v1.report.handle.{app}.{deployment}` (reports.py picks msgpack or columnar).

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
from services.router.metrics import RouterMetrics
from services.router.reports import (
    DEFAULT_PROVIDERS,
    LocalHealthProviders,
    build_handle_report,
    encode_handle_report,
)
from services.router.window import TimeWeightedCounts, TimeWeightedGauge
from shared.badinput import BadInput
from shared.bus import Bus, KVWatcher, RateLimiter
from shared.clock import SYSTEM_CLOCK, Clock
from shared.control import Member, Membership, deployment_key
from shared.errors import BusError, WireError
from shared.subjects import DEFAULT_SUBJECTS, KV_MEMBERSHIP, Subjects
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
        self.members: dict[str, Member] = {}
        self.probe_subjects: dict[str, str] = {}
        self.epoch = -1
        self.seq = 0
        self.queued_now = 0
        self.reports_sent = 0
        self.bad_input = BadInput(f"router {self.key}", logger, clock=clock)
        self.metrics = RouterMetrics(app, deployment)
        self._changed = asyncio.Event()
        self._ready = asyncio.Event()
        self._report_now = asyncio.Event()
        self._last_cold_report = -math.inf
        self._report_errors = RateLimiter(REPORT_ERROR_LOG_INTERVAL_S, clock)
        self._watch_errors = RateLimiter(WATCH_ERROR_LOG_INTERVAL_S, clock)
        self._tasks: list[asyncio.Task[None]] = []
        self._watcher: KVWatcher | None = None
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
        self._notify()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._watcher is not None:
            with contextlib.suppress(Exception):
                await self._watcher.stop()

    # -- membership ---------------------------------------------------------------------------
    def apply_membership(self, membership: Membership | None) -> bool:
        """Apply a membership value (None: the key was deleted). True if anything changed."""
        if membership is None:
            if not self.members:
                return False
            members: dict[str, Member] = {}
        else:
            if membership.epoch <= self.epoch:
                return False
            self.epoch = membership.epoch
            members = {m.replica_id: m for m in membership.replicas}
        self.members = members
        self.probe_subjects = {rid: self.subjects.probe(rid) for rid in members}
        self.chooser.set_members(members)
        self.health.prune_to(members)
        self._notify()
        return True

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
        kv = await self.bus.kv(KV_MEMBERSHIP, create=False)
        self._watcher = watcher = await kv.watch(self.key)
        try:
            async for entry in watcher:
                if entry is None:
                    self._ready.set()
                elif entry.op == "DEL":
                    self.apply_membership(None)
                else:
                    self._apply_entry(entry.value)
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()

    def _apply_entry(self, value: bytes) -> None:
        try:
            membership = Membership.decode(value)
        except WireError as exc:
            self.bad_input.drop(exc.reason, exc.detail)
            return
        if (membership.app, membership.deployment) != (self.app, self.deployment):
            self.bad_input.drop("wrong_key", f"value for {membership.app}.{membership.deployment}")
            return
        if self.apply_membership(membership):
            logger.debug(
                "router %s: membership epoch %d, %d replicas",
                self.key,
                membership.epoch,
                len(membership.replicas),
            )

    # -- per-request bookkeeping (the fast path: O(1), no awaits) ------------------------------
    def dispatched(self, replica_id: str, now: float) -> None:
        self.chooser.on_dispatch(replica_id)
        self.running.add(replica_id, 1.0, now)

    def admitted(self, replica_id: str, admission: Admission, now: float) -> None:
        self.health.observe(admission.health, now)
        if not admission.accepted:
            self.metrics.rejected.inc()
        self.chooser.on_admission(replica_id, admission.accepted, admission.num_ongoing, now)

    def unreachable(self, replica_id: str, now: float) -> None:
        self.metrics.unreachable.inc()
        self.chooser.on_unreachable(replica_id, now)

    def finished(self, replica_id: str, now: float) -> None:
        self.chooser.on_finish(replica_id)
        self.running.add(replica_id, -1.0, now)
        if self.queued_now:
            # a slot freed there: let a waiter try that replica before its backoff runs out
            self.chooser.on_capacity_freed(replica_id)
            self._notify()

    def fold_health(self, status: HealthStatus, now: float) -> None:
        self.health.observe(status, now)

    # -- choosing, or waiting in the queue ------------------------------------------------------
    async def acquire(self, deadline_mono: float, exclude: set[str]) -> str:
        """A replica to send to now; waits in the queue when none is available."""
        if not self._ready.is_set():
            await self._wait_ready_until(deadline_mono)
        if self.closed:
            raise RouterClosedError(f"router for {self.key} is closed")
        rid = self.chooser.choose(self.clock.monotonic(), exclude)
        if rid is not None:
            return rid
        return await self._wait_in_queue(deadline_mono, exclude)

    async def _wait_ready_until(self, deadline_mono: float) -> None:
        await self.start()
        remaining = deadline_mono - self.clock.monotonic()
        try:
            async with asyncio.timeout(None if math.isinf(remaining) else max(remaining, 0)):
                await self._ready.wait()
        except TimeoutError:
            raise DeadlineExceeded("waiting for the deployment's membership") from None

    async def _wait_in_queue(self, deadline_mono: float, exclude: set[str]) -> str:
        clock, chooser, cfg = self.clock, self.chooser, self.config
        queued = False
        try:
            while True:
                if self.closed:
                    raise RouterClosedError(f"router for {self.key} is closed")
                now = clock.monotonic()
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
                if not queued:
                    if self.queued_now >= cfg.max_queued_requests:
                        raise BackPressureError(self.queued_now, cfg.max_queued_requests)
                    queued = True
                    self.queued_now += 1
                    self.queued.add(1.0, now)
                    self.metrics.queued.inc()
                    if not self.members:
                        self._cold_start(now)
                wait = min(deadline_mono - now, cfg.queue_poll_max_s)
                next_at = chooser.next_available_at(now)
                if next_at is not None and next_at > now:
                    wait = min(wait, next_at - now)
                changed = self._changed
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(wait, MIN_WAIT_S)):
                        await changed.wait()
        finally:
            if queued:
                self.queued_now -= 1
                self.queued.add(-1.0, clock.monotonic())
                self.metrics.queued.dec()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _cold_start(self, now: float) -> None:
        if now - self._last_cold_report >= self.config.cold_start_report_min_interval_s:
            self._last_cold_report = now
            self._report_now.set()

    # -- reports --------------------------------------------------------------------------------
    async def _report_loop(self) -> None:
        interval = self.config.metrics_interval_s
        while not self.closed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._report_now.wait()
            cold = self._report_now.is_set()
            self._report_now.clear()
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
        )

    async def send_report(self, *, cold_start: bool = False) -> HandleReport:
        report = self.make_report(cold_start=cold_start)
        parts = encode_handle_report(
            report,
            columnar_min_replicas=self.config.columnar_min_replicas,
            max_payload=self.bus.max_payload,
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

"""The controller's I/O shell: JetStream ingest, the control loop, KV writes, probes.

How it works:
1. Read the desired apps (KV fp_apps, watched) and the previous owner's targets and memberships
   (restart recovery), then subscribe an ordered consumer per owned partition of FP_REPORTS,
   starting `rebuild_s` in the past.
2. Rebuild: until the consumers have caught up, every message is fed to the core with the time it
   was stored (mapped onto the local monotonic clock) and demand samples are taken on that replayed
   timeline; nothing is decided. Missing data is not zero load: a deployment whose window is not
   full after the rebuild still may not scale down until it is.
3. Live: messages are fed with their local receipt time; every `control_interval_s` the core ticks
   and the actions are carried out (fenced KV writes in order, probes as tasks).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from nats.aio.msg import Msg as NatsMsg
from nats.js.api import ConsumerConfig, DeliverPolicy

from services.agent.info import AGENT_TTL_S, AgentInfo
from shared.appconfig import AppConfig
from shared.clock import SYSTEM_CLOCK, Clock
from shared.control import Membership, TargetSet
from shared.errors import BusTimeout, ConfigError, FleetpulseError, NoResponders, WireError
from shared.natsbus import NatsBus
from shared.subjects import KV_AGENTS, KV_APPS, KV_MEMBERSHIP, KV_STATUS, KV_TARGETS
from shared.wire.codec import decode_as
from shared.wire.messages import HealthStatus

from . import metrics as prom
from .core import (
    Action,
    ControllerConfig,
    ControllerCore,
    DeleteKey,
    Event,
    Probe,
    PutMembership,
    PutStatus,
    PutTargets,
)
from .fenced import FencedWriter
from .health_registry import ProbeOutcome
from .stream import (
    DEFAULT_PARTITIONS,
    DEFAULT_RETENTION_S,
    ensure_stream,
    partition_subject,
    report_subject,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    nats_url: str
    core: ControllerConfig
    partitions: int = DEFAULT_PARTITIONS
    retention_s: float = DEFAULT_RETENTION_S
    rebuild_s: float = 60.0
    probe_timeout_s: float = 1.0
    metrics_port: int = 0
    stream_replicas: int = 1


class ControllerService:
    def __init__(self, cfg: ServiceConfig, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.cfg = cfg
        self.clock = clock
        self.core = ControllerCore(cfg.core)
        self.bus: NatsBus | None = None
        self.live = False
        self._pending: dict[int, int | None] = {}
        self._exported: dict[tuple[str, str], int] = {}
        self._next_sample = 0.0
        self._subs: list[Any] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: dict[str, FencedWriter] = {}
        self._apps_raw: dict[str, AppConfig] = {}
        self._stop = asyncio.Event()
        self.ticks = 0
        self.stream = ""

    # -- startup -----------------------------------------------------------------------------

    async def start(self) -> None:
        bus = self.bus = await NatsBus.connect(
            self.cfg.nats_url, name=f"controller-{self.cfg.core.member_id}"
        )
        subjects = self.core.subjects
        self.stream = await ensure_stream(
            bus.js,
            subjects,
            self.cfg.partitions,
            self.cfg.retention_s,
            replicas=self.cfg.stream_replicas,
        )
        epoch = self.cfg.core.owner_epoch
        for bucket in (KV_TARGETS, KV_STATUS):
            self._writers[bucket] = FencedWriter(await bus.kv(bucket), epoch)
        self._writers[KV_MEMBERSHIP] = FencedWriter(
            await bus.kv(KV_MEMBERSHIP), epoch, lambda v: Membership.decode(v).owner_epoch
        )
        now = self.clock.monotonic()
        await self._load_apps(now)
        await self._restore(now)
        self._next_sample = now - self.cfg.rebuild_s
        await self._subscribe()
        self._spawn(self._watch_apps(), "apps")
        self._spawn(self._watch_agents(), "agents")

    async def _load_apps(self, now: float) -> None:
        assert self.bus is not None
        kv = await self.bus.kv(KV_APPS)
        for key in await kv.keys():
            entry = await kv.get(key)
            if entry is not None:
                self._apply_app(key, entry.value)
        self.core.set_apps(self._apps_raw, now)

    def _apply_app(self, key: str, value: bytes | None) -> None:
        if value is None:
            self._apps_raw.pop(key, None)
            return
        try:
            self._apps_raw[key] = AppConfig.from_json(value)
        except (ConfigError, WireError) as exc:
            prom.BAD_INPUT.labels(reason="bad_app").inc()
            log.warning("ignoring app %s in fp_apps: %s", key, exc)

    async def _watch_apps(self) -> None:
        assert self.bus is not None
        kv = await self.bus.kv(KV_APPS)
        watcher = await kv.watch()
        initial = True
        async for entry in watcher:
            if entry is None:
                initial = False
                continue
            self._apply_app(entry.key, entry.value if entry.op == "PUT" else None)
            if not initial:
                self.core.set_apps(self._apps_raw, self.clock.monotonic())
                log.info("apps changed: %s", sorted(self._apps_raw))

    async def _watch_agents(self) -> None:
        """Agents re-put their fp_agents entry every few seconds; each put is a sign of life."""
        assert self.bus is not None
        kv = await self.bus.kv(KV_AGENTS, ttl=AGENT_TTL_S)
        async for entry in await kv.watch():
            if entry is None:
                continue
            if entry.op != "PUT":
                self.core.agent_gone(entry.key)
                continue
            try:
                self.core.on_agent(AgentInfo.decode(entry.value), self.clock.monotonic())
            except WireError as exc:
                prom.BAD_INPUT.labels(reason="bad_agent").inc()
                log.warning("ignoring fp_agents/%s: %s", entry.key, exc)

    async def _restore(self, now: float) -> None:
        assert self.bus is not None
        targets: list[TargetSet] = []
        memberships: list[Membership] = []
        for bucket, sink, decode in (
            (KV_TARGETS, targets, TargetSet.decode),
            (KV_MEMBERSHIP, memberships, Membership.decode),
        ):
            kv = await self.bus.kv(bucket)
            for key in await kv.keys():
                entry = await kv.get(key)
                if entry is None:
                    continue
                try:
                    sink.append(decode(entry.value))  # type: ignore[arg-type]
                except WireError as exc:
                    log.warning("ignoring %s/%s: %s", bucket, key, exc)
        self.core.restore(targets, memberships, now)
        if targets:
            log.info("restored %d deployments' replicas from fp_targets", len(targets))

    async def _subscribe(self) -> None:
        assert self.bus is not None
        start = datetime.fromtimestamp(self.clock.wall() - self.cfg.rebuild_s).astimezone()
        for p in range(self.cfg.partitions):
            self._pending[p] = None  # unknown until its first message

            async def on_msg(msg: NatsMsg, p: int = p) -> None:
                self._on_msg(p, msg)

            sub = await self.bus.js.subscribe(
                partition_subject(self.core.subjects, p),
                stream=self.stream,
                cb=on_msg,
                ordered_consumer=True,
                config=ConsumerConfig(
                    deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=start
                ),
            )
            self._subs.append(sub)

    # -- ingest ------------------------------------------------------------------------------

    def _on_msg(self, partition: int, msg: NatsMsg) -> None:
        now = self.clock.monotonic()
        meta = msg.metadata
        self._pending[partition] = meta.num_pending
        recv = now
        if not self.live:
            # replayed history: place it on our monotonic timeline by its age in the stream
            stored = meta.timestamp.timestamp()
            recv = min(now, now - (self.clock.wall() - stored))
            while self._next_sample <= recv:
                self.core.sample(self._next_sample)
                self._next_sample += self.cfg.core.control_interval_s
        subject = report_subject(self.core.subjects, msg.subject)
        prom.INGEST_BYTES.inc(len(msg.data))
        self.core.ingest(subject, msg.data, recv)

    # -- control loop ------------------------------------------------------------------------

    async def run(self) -> None:
        await self.start()
        await self._catch_up()
        interval = self.cfg.core.control_interval_s
        next_tick = self.clock.monotonic()
        while not self._stop.is_set():
            next_tick += interval
            started = time.perf_counter()
            await self._tick()
            prom.LOOP_SECONDS.observe(time.perf_counter() - started)
            delay = next_tick - self.clock.monotonic()
            if delay < 0:
                next_tick = self.clock.monotonic()  # fell behind: do not try to catch up in a burst
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), max(0.0, delay))

    async def _catch_up(self, timeout_s: float = 30.0) -> None:
        """Let the ordered consumers deliver the retained history, then go live."""
        deadline = self.clock.monotonic() + timeout_s
        quiet_since = self.clock.monotonic()
        seen = -1
        while self.clock.monotonic() < deadline:
            await asyncio.sleep(0.05)
            total = sum(self.core.stats.ingested.values())
            if total != seen:
                seen, quiet_since = total, self.clock.monotonic()
            caught_up = all(not v for v in self._pending.values())
            if caught_up and self.clock.monotonic() - quiet_since >= 0.3:
                break
        now = self.clock.monotonic()
        while self._next_sample <= now:
            self.core.sample(self._next_sample)
            self._next_sample += self.cfg.core.control_interval_s
        self.live = True
        log.info("rebuilt from the stream (%d messages); controller is live", seen)

    async def _tick(self) -> None:
        now = self.clock.monotonic()
        pending = sum(v or 0 for v in self._pending.values())
        actions = self.core.tick(now, self.clock.wall(), pending=pending)
        self.ticks += 1
        await self._execute(actions)
        self._export_counts()

    def _export_counts(self) -> None:
        """Move the core's counters into Prometheus (the core stays free of I/O libraries)."""
        for family, counts, metric in (
            ("dropped", self.core.stats.dropped, prom.BAD_INPUT),
            ("ingested", self.core.stats.ingested, prom.INGESTED),
        ):
            for label, value in counts.items():
                last = self._exported.get((family, label), 0)
                if value > last:
                    metric.labels(label).inc(value - last)
                    self._exported[(family, label)] = value

    async def _execute(self, actions: list[Action]) -> None:
        for a in actions:
            try:
                if isinstance(a, PutMembership):
                    await self._writers[KV_MEMBERSHIP].put(a.key, a.value.encode())
                elif isinstance(a, PutTargets):
                    await self._writers[KV_TARGETS].put(a.key, a.value.encode())
                elif isinstance(a, PutStatus):
                    await self._writers[KV_STATUS].put(a.key, a.value.encode())
                elif isinstance(a, DeleteKey):
                    await self._writers[a.bucket].delete(a.key)
                elif isinstance(a, Probe):
                    prom.PROBES.inc()
                    self._spawn(self._probe(a), "probe")
                elif isinstance(a, Event):
                    prom.EVENTS.labels(kind=a.kind).inc()
                    log.info(
                        "%s app=%s deployment=%s replica=%s %s",
                        a.kind, a.app, a.deployment, a.replica_id, a.detail,
                    )  # fmt: skip
            except FleetpulseError as exc:
                log.warning("action %s failed: %s", type(a).__name__, exc)

    async def _probe(self, a: Probe) -> None:
        assert self.bus is not None
        status: HealthStatus | None = None
        try:
            reply = await self.bus.request(
                self.core.subjects.probe(a.replica_id), b"", timeout=self.cfg.probe_timeout_s
            )
            outcome = ProbeOutcome.ANSWERED
            with contextlib.suppress(WireError):
                status = decode_as(reply.data, HealthStatus)
        except NoResponders:
            outcome = ProbeOutcome.NO_RESPONDERS
        except BusTimeout:
            outcome = ProbeOutcome.TIMEOUT
        prom.PROBE_OUTCOMES.labels(outcome=outcome.value).inc()
        self.core.on_probe(
            a.app, a.deployment, a.replica_id, outcome, status, self.clock.monotonic()
        )

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        self._stop.set()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        if self.bus is not None:
            await self.bus.close()

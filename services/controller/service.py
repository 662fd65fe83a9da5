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
   and the actions are carried out (fenced KV writes queued in order and retried until they
   land, kv_writer.py; probes as tasks).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Hashable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, cast

from nats.aio.msg import Msg as NatsMsg
from nats.js.api import ConsumerConfig, DeliverPolicy

from shared import settings
from shared.appconfig import AppConfig
from shared.badinput import BadInput
from shared.bus import RateLimiter
from shared.clock import SYSTEM_CLOCK, Clock
from shared.errors import (
    BusError,
    BusTimeout,
    ConfigError,
    FleetpulseError,
    NoResponders,
    WireError,
)
from shared.kv import buckets, envelope
from shared.kv.agents import AGENT_TTL_S, AgentInfo
from shared.kv.membership import Member
from shared.kv.targets import ReplicaTarget, app_pattern
from shared.kv.view import DocKV
from shared.natsbus import NatsBus
from shared.natskv import nats_errors
from shared.startup import retrying
from shared.subjects import KV_AGENTS, KV_APPS, KV_STATUS, partition_subject, report_subject
from shared.transitions import RefusalLog
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
    PutStatus,
)
from .fenced import FencedWriter
from .group import DEFAULT_HEARTBEAT_S, DEFAULT_MEMBER_TTL_S, GroupCore, partition_of
from .group_shell import GroupRunner
from .health_registry import ProbeOutcome
from .kv_delta import DeleteDoc, PutDoc
from .machinery.collector import Collector
from .machinery.decode_pipeline import Decoded, DecodePipeline
from .machinery.kv_writer import KVWriter
from .machinery.stats import StatsDump, ingest_kind
from .policy_host import DEFAULT_TIMEOUT_S as DEFAULT_POLICY_TIMEOUT_S
from .policy_host import ProcessRunner
from .source_check import SOURCE_MISMATCH
from .stream import (
    DEFAULT_PARTITIONS,
    DEFAULT_RETENTION_S,
    delivery_position,
    ensure_stream,
)

log = logging.getLogger(__name__)

KVAction = PutDoc | DeleteDoc | PutStatus | DeleteKey
KVWrite = tuple[KVAction, int]
"""A queued KV action and the partition epoch it was decided under."""
KV_WRITERS = 16
"""KV writes in flight at once (different keys; one key's writes stay in order): a deployment of
65,536 replicas starts with as many target writes, and one at a time they took minutes."""
STOP_FLUSH_S = 2.0
"""How long `stop` lets queued KV writes land before stepping down."""

EMPTY_PARTITION_QUIET_S = 0.3
TICK_NOW_GAP_S = 0.01
"""An early tick (an input asked for one) comes at least this long after the last tick began."""
"""A partition with no message this long after subscribing has no history to replay."""
PARTITION_IDLE_HEARTBEAT_S = 1.0
"""The server heartbeats an idle partition consumer this often. A partition consumer is an R1
ordered consumer on any node of the stream; when that node dies, nats-py recreates it after two
missed heartbeats, so reading resumes within seconds (its default of 5 s meant 10-20 s)."""
MISMATCH_LOG_INTERVAL_S = 10.0
"""Reports dropped for a claimed source that does not match their subject: one line this often."""


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    nats_url: str
    core: ControllerConfig
    partitions: int = DEFAULT_PARTITIONS
    retention_s: float = DEFAULT_RETENTION_S
    rebuild_s: float = settings.CONTROLLER_REBUILD.default
    probe_timeout_s: float = 1.0
    metrics_port: int = settings.METRICS_PORT.default
    stream_replicas: int = settings.CONTROLLER_STREAM_REPLICAS.default
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    member_ttl_s: float = DEFAULT_MEMBER_TTL_S
    stats_file: str = settings.CONTROLLER_STATS_FILE.default
    """Append per-tick loop stats as JSON lines here (see stats.py); empty: off."""
    decode_threads: int = settings.CONTROLLER_DECODE_THREADS.default
    """1: decode columnar parts on a worker thread (decode_pipeline.py); 0: on the loop."""
    policy_timeout_s: float = DEFAULT_POLICY_TIMEOUT_S
    """A custom policy call's deadline (policy_host.py): past it the default policy decides."""


class ControllerService:
    def __init__(self, cfg: ServiceConfig, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.cfg = cfg
        self.clock = clock
        self.policies = ProcessRunner(cfg.policy_timeout_s)
        """Custom policies run in a worker process, started at the first one's first call."""
        self.core = ControllerCore(cfg.core, policies=self.policies)
        self.bus: NatsBus | None = None
        self._pending: dict[int, int | None] = {}
        self._epochs: dict[int, int] = {}
        """Partitions we own -> the lease epoch that fences our writes for their apps."""
        self._replaying: dict[int, set[str]] = {}
        self._next_sample: dict[int, float] = {}
        self._since: dict[int, float] = {}
        """Owned partition -> wall time its replay starts at; nothing older is ours to read."""
        self.group: GroupRunner | None = None
        self.exporter = prom.Exporter()
        self._decode = DecodePipeline(cfg.decode_threads)
        self.collector = Collector()
        """Full collections out of the ticks (collector.py)."""
        self._subs: dict[int, Any] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: dict[str, FencedWriter] = {}
        self._kv: KVWriter[KVWrite] = KVWriter(
            self._write_kv, describe=_describe_key, on_done=self._wrote, concurrency=KV_WRITERS
        )
        """Write-behind for KV actions: a tick does not wait for them; failed ones are retried."""
        self.bad_kv = BadInput("controller: control state", log)
        self.refusals = RefusalLog("controller", log, clock=clock)
        """Illegal lifecycle transitions (exporter.event counts them), logged rate-limited."""
        self._mismatch_log = RateLimiter(MISMATCH_LOG_INTERVAL_S, clock)
        self._mismatches_logged = 0
        self._apps_raw: dict[str, AppConfig] = {}
        self._stop = asyncio.Event()
        self._tick_now = asyncio.Event()
        """Set by an input that asks for a tick at once (core.tick_now), and on a stop."""
        self.ticks = 0
        self.stream = ""
        self.stats = StatsDump(cfg.stats_file) if cfg.stats_file else None
        self.core_seconds = 0.0
        """How long the last tick's `core.tick` took (the rest of a tick is carrying it out)."""
        self.core_cpu_seconds = 0.0
        """The thread CPU time of the same call (less than `core_seconds`: descheduled)."""

    # -- startup -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect (a wrong URL or credentials fail at once), then set up JetStream, retrying:
        a cluster that is still forming or busy answers slowly, and giving up would leave the
        group a member short until someone restarts this one."""
        self.bus = await NatsBus.connect(
            self.cfg.nats_url, name=f"controller-{self.cfg.core.member_id}"
        )
        await retrying("set up streams and buckets", self._set_up, self._stop, log)
        self._spawn(self._watch_apps(), "apps")
        self._spawn(self._watch_agents(), "agents")
        self.group = GroupRunner(
            self.bus,
            GroupCore(self.cfg.core.member_id, self.cfg.partitions, self.cfg.member_ttl_s),
            self._take_partition,
            self._drop_partition,
            heartbeat_s=self.cfg.heartbeat_s,
            describe=self._describe,
            clock=self.clock,
        )
        await retrying("join the controller group", self.group.start, self._stop, log)

    async def _set_up(self) -> None:
        bus = self.bus
        assert bus is not None
        subjects = self.core.subjects
        self.stream = await ensure_stream(
            bus.js,
            subjects,
            self.cfg.partitions,
            self.cfg.retention_s,
            replicas=self.cfg.stream_replicas,
        )
        for bucket in (buckets.TARGETS, buckets.MEMBERSHIP, buckets.STATUS):
            self._writers[bucket.name] = FencedWriter(await buckets.open_bucket(bus, bucket), 0)
        await self._load_apps()

    async def _load_apps(self) -> None:
        assert self.bus is not None
        kv = await self.bus.kv(KV_APPS)
        for entry in await kv.snapshot([">"]):
            self._apply_app(entry.key, entry.value)

    def _owned_apps(self) -> dict[str, AppConfig]:
        parts = self.cfg.partitions
        return {
            name: app
            for name, app in self._apps_raw.items()
            if partition_of(name, parts) in self._epochs
        }

    def _apps_in(self, partition: int) -> set[str]:
        return {a for a in self._apps_raw if partition_of(a, self.cfg.partitions) == partition}

    def _describe(self) -> dict[str, Any]:
        return {
            "partitions": sorted(self._epochs),
            "pending": sum(v or 0 for v in self._pending.values()),
            "apps": len(self.core.apps),  # the owned ones (a pass over all of them per beat was 1%)
        }

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
            key = entry.key
            self._apply_app(key, entry.value if entry.op == "PUT" else None)
            if not initial and partition_of(key, self.cfg.partitions) in self._epochs:
                # the one app, not the owned set: at 10,000 apps a put costs that app alone
                self.core.update_app(key, self._apps_raw.get(key), self.clock.monotonic())
                log.info("app %s: %s", key, "put" if entry.op == "PUT" else "deleted")

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

    async def _restore(self, now: float, apps: set[str]) -> None:
        """The replicas and members the previous owner of `apps` left in KV: one read per bucket
        filtered to `apps`, so what a takeover reads is bounded by what it takes over, and its
        cost by that, not by a round trip per app."""
        assert self.bus is not None
        targets = DocKV(self._writers[buckets.TARGETS.name].kv, ReplicaTarget, self.bad_kv)
        members = DocKV(self._writers[buckets.MEMBERSHIP.name].kv, Member, self.bad_kv)
        names = sorted(apps)
        found_t = [c.doc for c in await targets.snapshot([app_pattern(a) for a in names]) if c.doc]
        found_m = [c.doc for c in await members.snapshot([f"{a}.>" for a in names]) if c.doc]
        self.core.restore(found_t, found_m, now)
        if found_t:
            log.info("restored %d replicas of %d app(s) from fp_targets", len(found_t), len(apps))

    async def _take_partition(self, p: int, epoch: int) -> None:
        """A partition became ours: restore its apps from KV, replay its history, then act."""
        assert self.bus is not None
        now = self.clock.monotonic()
        self._epochs[p] = epoch
        apps = self._apps_in(p)
        # held before the first await: a control tick during the KV restore below would
        # otherwise decide on an empty window and sample ahead of the replayed history
        self.core.held |= apps
        self.core.set_apps(self._owned_apps(), now)
        await self._restore(now, apps)
        self._replaying[p] = apps
        self._next_sample[p] = now - self.cfg.rebuild_s
        self._pending[p] = None  # unknown until its first message
        self._since[p] = self.clock.wall() - self.cfg.rebuild_s
        start = datetime.fromtimestamp(self._since[p]).astimezone()

        async def on_msg(msg: NatsMsg) -> None:
            self._on_msg(p, msg)

        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=start)
        with nats_errors(f"partition {p}'s consumer"):  # a failed start hands it back
            self._subs[p] = await self.bus.js.subscribe(
                partition_subject(self.core.subjects, p),
                stream=self.stream,
                cb=on_msg,
                ordered_consumer=True,
                idle_heartbeat=PARTITION_IDLE_HEARTBEAT_S,
                config=config,
            )
        # nats-py recreates a lost ordered consumer from this very config object, switched to
        # "by start sequence"; a start time left in it makes the server refuse every recreation,
        # and the partition would never be read again
        config.opt_start_time = None
        self._spawn(self._catch_up(p), f"catch-up-{p}")

    async def _drop_partition(self, p: int) -> None:
        """A partition is no longer ours: stop reading it and forget its apps, writing nothing."""
        self._epochs.pop(p, None)
        self._replaying.pop(p, None)
        self._pending.pop(p, None)
        self._since.pop(p, None)
        self.exporter.forget_partition(p, lambda app: partition_of(app, self.cfg.partitions))
        sub = self._subs.pop(p, None)
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self.core.release_apps(
            self._apps_in(p)
            | {a for a, _ in self.core.deployments if partition_of(a, self.cfg.partitions) == p}
        )

    # -- ingest ------------------------------------------------------------------------------

    def _on_msg(self, partition: int, msg: NatsMsg) -> None:
        now = self.clock.monotonic()
        self._pending[partition], stored = delivery_position(msg.reply)
        if stored < self._since.get(partition, stored):
            return  # a recreated consumer that had delivered nothing restarts at sequence 1
        recv = now
        if partition in self._replaying:
            # replayed history: place it on our monotonic timeline by its age in the stream
            recv = min(now, now - (self.clock.wall() - stored))
        subject = report_subject(self.core.subjects, msg.subject)
        kind = ingest_kind(self.core.subjects, subject, msg.data)
        self.exporter.ingest_n[kind] += 1
        self.exporter.ingest_b[kind] += len(msg.data)
        data = msg.data

        def apply(decoded: Decoded) -> None:
            apps = self._replaying.get(partition)
            if apps is not None:
                self._sample_until(partition, apps, recv)
            if self.stats is None:
                self.core.ingest(subject, data, recv, decoded)
            else:
                started = time.perf_counter()
                self.core.ingest(subject, data, recv, decoded)
                self.stats.ingested(kind, time.perf_counter() - started)
            if self.core.take_tick_now() and apps is None:
                self._tick_now.set()  # a wake from zero or a replica ready: tick now (run())

        self._decode.submit(data, kind == "handle_columnar", apply)

    # -- control loop ------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self.start()
        except BusError:
            if self._stop.is_set():
                return  # told to stop while still starting
            raise
        self._spawn(self._kv.run(), "kv-writer")
        self._spawn(self._stop_ends_the_wait(), "stop-relay")
        interval = self.cfg.core.control_interval_s
        next_tick = self.clock.monotonic()
        while not self._stop.is_set():
            late = self.clock.monotonic() - next_tick
            next_tick += interval
            began = self.clock.monotonic()
            started = time.perf_counter()
            await self._tick()
            took = time.perf_counter() - started
            prom.LOOP_SECONDS.observe(took)
            if self.stats is not None:
                self._record_tick(next_tick - interval, took, late)
            delay = next_tick - self.clock.monotonic()
            if delay < 0:
                next_tick = self.clock.monotonic()  # fell behind: do not try to catch up in a burst
            if await self._until_tick(max(0.0, delay), began + TICK_NOW_GAP_S):
                next_tick = self.clock.monotonic()  # ticking early: the interval counts from here

    async def _stop_ends_the_wait(self) -> None:
        """A stop (however set: a signal handler sets `_stop` itself) ends `_until_tick`."""
        await self._stop.wait()
        self._tick_now.set()

    async def _until_tick(self, delay: float, earliest: float) -> bool:
        """Wait `delay` for the next tick, or less when an input asked for a tick at once
        (core.tick_now: a request queued at zero replicas, a replica ready), though not before
        monotonic `earliest`, so a burst of such inputs costs at most a tick per
        TICK_NOW_GAP_S. True: the tick comes early."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._tick_now.wait(), delay)
        if not self._tick_now.is_set() or self._stop.is_set():
            return False
        self._tick_now.clear()
        gap = earliest - self.clock.monotonic()
        if gap > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), gap)
        return True

    @property
    def live(self) -> bool:
        """Every owned partition has replayed its history and acts."""
        return bool(self._epochs) and not self._replaying

    def _record_tick(self, scheduled: float, took: float, late: float) -> None:
        assert self.stats is not None
        self.stats.tick(scheduled + late, took, late, self.core_seconds, self.core_cpu_seconds)
        self.stats.maybe_write(
            self.clock.monotonic(),
            probes=self.core.stats.probes,
            pending=sum(v or 0 for v in self._pending.values()),
            stalled=bool(self.core.stall_state and self.core.stall_state.stalled),
            live=self.live,
        )

    def _sample_until(self, partition: int, apps: set[str], until: float) -> None:
        t = self._next_sample.get(partition, until)
        while t <= until:
            self.core.sample(t, apps)
            t += self.cfg.core.control_interval_s
        self._next_sample[partition] = t

    async def _catch_up(self, p: int, timeout_s: float = 30.0) -> None:
        """Let the partition's consumer deliver its retained history, then let its apps act:
        caught up when a delivered message says nothing is left behind it, or when an empty
        partition stayed silent for a moment."""
        deadline = self.clock.monotonic() + timeout_s
        started = self.clock.monotonic()
        while self.clock.monotonic() < deadline and p in self._replaying:
            pending = self._pending.get(p)
            if pending == 0:
                break
            if pending is None and self.clock.monotonic() - started >= EMPTY_PARTITION_QUIET_S:
                break
            await asyncio.sleep(0.02)
        apps = self._replaying.pop(p, None)
        if apps is None:
            return  # dropped meanwhile
        self._sample_until(p, apps, self.clock.monotonic())
        self.core.held -= apps
        self.collector.settle(self.clock.monotonic())
        log.info("partition %d rebuilt from the stream; %d app(s) live", p, len(apps))

    async def _tick(self) -> None:
        now = self.clock.monotonic()
        pending = sum(v or 0 for v in self._pending.values())
        started, cpu = time.perf_counter(), time.thread_time()
        actions = self.core.tick(now, self.clock.wall(), pending=pending)
        self.core_seconds = time.perf_counter() - started
        self.core_cpu_seconds = time.thread_time() - cpu
        self.ticks += 1
        await self._execute(actions)
        self.exporter.tick(self.core.stats, self.core.stall_state, self._pending)
        self._log_mismatches()
        self.collector.between_ticks(now)

    def _log_mismatches(self) -> None:
        total = self.core.stats.dropped[SOURCE_MISMATCH]
        if total > self._mismatches_logged and self._mismatch_log.allow():
            log.warning(
                "dropped %d report(s) whose payload names another replica, deployment or rpc subject "
                "than the subject they came on (%d so far)",
                total - self._mismatches_logged,
                total,
            )
            self._mismatches_logged = total

    def _epoch_of(self, app: str) -> int | None:
        return self._epochs.get(partition_of(app, self.cfg.partitions))

    async def _execute(self, actions: list[Action]) -> None:
        for a in actions:
            try:
                if isinstance(a, PutDoc | DeleteDoc | PutStatus):
                    self._submit(a)
                elif isinstance(a, DeleteKey):
                    if a.bucket == KV_STATUS:
                        self.exporter.forget_app(a.key)
                    self._submit(a)
                elif isinstance(a, Probe):
                    prom.PROBES.inc()
                    self._spawn(self._probe(a), "probe")
                elif isinstance(a, Event):
                    self.exporter.event(a)
                    if a.refused is not None:
                        where = f"app={a.app} deployment={a.deployment} replica={a.replica_id}"
                        self.refusals.refused(a.refused, where)
                        continue
                    log.info(
                        "%s app=%s deployment=%s replica=%s %s",
                        a.kind, a.app, a.deployment, a.replica_id, a.detail,
                    )  # fmt: skip
            except FleetpulseError as exc:
                prom.ACTION_ERRORS.labels(type(a).__name__).inc()
                log.warning("action %s failed: %s", type(a).__name__, exc)

    def _submit(self, a: KVAction) -> None:
        """Queue a KV write (kv_writer.py) under the epoch we hold the app's partition at."""
        epoch = self._epoch_of(_app_of(a))
        if epoch is not None:  # None: handed over between decision and write
            self._kv.submit(_key_of(a), (a, epoch))

    async def _write_kv(self, item: KVWrite) -> None:
        """One queued write, stamped with the epoch at which we hold the app's partition;
        dropped if the partition changed hands (or epoch) since it was decided."""
        a, decided = item
        if self.group is not None:
            await self.group.writable()  # a paused owner's queue waits until it knows
        if self._epoch_of(_app_of(a)) != decided:
            return
        if isinstance(a, DeleteKey | DeleteDoc):
            await self._writers[a.bucket].delete(a.key, decided)
        elif isinstance(a, PutDoc):
            doc = replace(a.doc, owner_epoch=decided)
            await self._writers[a.bucket].put(a.key, envelope.encode(doc), decided)
        else:
            part = partition_of(a.key, self.cfg.partitions)
            value = replace(a.value, owner_epoch=decided, partition=part)
            await self._writers[KV_STATUS].put(a.key, value.encode(), decided)
            self.exporter.status(a.value)

    def _wrote(self, item: KVWrite, took: float, ok: bool) -> None:
        if self.stats is not None:
            self.stats.wrote(took, ok)
        if not ok:
            prom.ACTION_ERRORS.labels(type(item[0]).__name__).inc()

    async def _probe(self, a: Probe) -> None:
        assert self.bus is not None
        status: HealthStatus | None = None
        prom.PROBES_IN_FLIGHT.inc()
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
        finally:
            prom.PROBES_IN_FLIGHT.dec()
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
        self.collector.close()
        # what the last ticks decided lands before we let go of the partitions
        await self._kv.flush(STOP_FLUSH_S)
        if self.group is not None:
            with contextlib.suppress(Exception):
                await self.group.step_down()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for sub in list(self._subs.values()):
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._decode.close()
        self.policies.close()
        if self.bus is not None:
            await self.bus.close()
        if self.stats is not None:
            self.stats.close()
            self.stats = None


def _app_of(a: KVAction) -> str:
    if isinstance(a, PutDoc):
        return a.doc.app
    if isinstance(a, DeleteDoc) and a.bucket == buckets.TARGETS.name:
        return a.key.split(".", 2)[1]  # {agent}.{app}.{deployment}.{slot}
    return a.key.split(".", 1)[0]  # {app}.{deployment}.{slot}, or {app} for fp_status


def _key_of(a: KVAction) -> tuple[str, str]:
    if isinstance(a, PutStatus):
        return KV_STATUS, a.key
    return a.bucket, a.key


def _describe_key(key: Hashable) -> str:
    return "/".join(cast(tuple[str, str], key))

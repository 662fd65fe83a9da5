"""The node agent's I/O shell: fp_targets in, replica processes out, fp_agents registration.

How it works:
1. Register in KV `fp_agents` (TTL bucket) under the agent id, then re-put the entry every TTL/3,
   and at once whenever the number of running replicas changes.
2. Watch this agent's keys of KV `fp_targets` (`{agent}.>`: one value per replica it must run,
   so what it reads is bounded by what it runs). A value that does not decode is counted and
   dropped, and the last good one for that key stays in force: a garbled write must not stop
   replicas that are serving. Nothing starts before the initial values are all in, so "the first N
   in start order" means the same after a restart.
3. Every tick (and at once on a change) reap exited children, ask `core.plan` what to do, and do
   it. Every exit is reported as a Lifecycle "exited" (crashes and SIGKILL included, which the
   replica cannot report itself). Nothing is restarted here: the controller decides.
4. On stop: stop watching, plan against an empty target set until every child is gone (SIGTERM,
   SIGKILL past the deadline), then delete the fp_agents entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from shared import resources, runtimeenv
from shared.badinput import BadInput
from shared.bus import KV, Bus, KVWatcher
from shared.clock import SYSTEM_CLOCK, Clock
from shared.errors import BusError, FleetpulseError, WireError
from shared.kv import buckets, envelope
from shared.kv.agents import AGENT_TTL_S, MAX_ENV_NOTES, AgentInfo, EnvNote
from shared.kv.targets import ReplicaTarget, agent_pattern
from shared.natsbus import NatsBus
from shared.packages import PackageError
from shared.packagestore import NatsPackageStore, PackageStore
from shared.startup import retrying
from shared.subjects import KV_AGENTS, Subjects
from shared.transitions import RefusalLog, Refused
from shared.wire.codec import encode
from shared.wire.messages import Lifecycle, LifecycleState

from .config import AgentConfig
from .core import (
    ChildEvent,
    ChildState,
    Forget,
    Kill,
    OverCapacity,
    Start,
    Stop,
    advance,
    merge_wanted,
    plan,
    replica_argv,
    replica_env,
    wanted_target,
)
from .credentials import ReplicaCredentials
from .metrics import (
    BAD_TARGETS,
    CAPACITY,
    EXITS,
    KILLS,
    RUNNING,
    SPARE_STARTS,
    START_FAILURES,
    STARTS,
    STOPS,
    TRANSITIONS_REFUSED,
)
from .packages import PackageCache
from .procs import ChildProcesses, child_env
from .pyenv import PyEnvs
from .runtimeenvs import EXIT_RUNTIME_ENV_FAILED, Failed, RuntimeEnvs
from .spare import Spares

log = logging.getLogger(__name__)

TICK_S = 0.1
"""How often children are reaped and the plan re-run (exits are seen within a tick)."""
REGISTER_INTERVAL_S = AGENT_TTL_S / 3
REGISTER_RETRY_S = 1.0
DRAIN_EXTRA_S = 10.0
"""On shutdown, give up waiting for children this long after the last kill deadline."""
FAILED_NOTE_S = 600.0
"""A failed runtime_env stays in the agent's registration this long (for `fleetpulse status`)."""
ENV_SWEEP_S = 60.0
"""How often built pip/uv environments unused for --env-grace-s are looked for."""
EXIT_SPAWN_FAILED = 127
"""Reported as the exit code of a replica whose process could not be started at all."""


class AgentService:
    """Run with `await AgentService(cfg).run()`; `stop()` (signal-handler safe) ends it."""

    def __init__(self, cfg: AgentConfig, *, bus: Bus | None = None, clock: Clock = SYSTEM_CLOCK):
        self.cfg = cfg
        self.clock = clock
        self.subjects = Subjects(cfg.namespace)
        self._given_bus = bus
        self.bus: Bus | None = bus
        log_dir = Path(cfg.log_dir or tempfile.mkdtemp(prefix=f"fleetpulse-agent-{cfg.agent_id}-"))
        env = child_env(os.environ, cfg.pythonpath, cfg.replica_auth) | cfg.replica_http_env()
        spares = Spares(
            python=cfg.python,
            cwd=cfg.workdir,
            env=env,
            log_path=log_dir / "spare.log",
            count=cfg.spare_replicas,
        )
        self.procs = ChildProcesses(
            cwd=cfg.workdir, env=env, log_dir=log_dir, spares=spares if cfg.spare_replicas else None
        )
        self.bad = BadInput(f"agent {cfg.agent_id}", log, clock=clock)
        self.refusals = RefusalLog(f"agent {cfg.agent_id}", log, _count_refused, clock=clock)
        self.started_at = clock.wall()
        self._hostname = socket.gethostname()
        self.ticks = 0
        self._children: dict[str, ChildState] = {}
        self._targets: dict[str, ReplicaTarget] = {}
        """KV key -> the replica wanted there (this agent's keys only)."""
        self._synced = False
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._register_now = asyncio.Event()
        self._skipped: tuple[str, ...] = ()
        self._agents_kv: KV | None = None
        self.creds = (
            ReplicaCredentials(cfg.replica_key, cfg.credential_ttl_s)
            if cfg.replica_key is not None
            else None
        )
        cache = Path(
            cfg.cache_dir or Path.home() / ".cache" / "fleetpulse" / f"agent-{cfg.agent_id}"
        )
        self.envs = RuntimeEnvs(
            PackageCache(cache / "packages", self._package_store, max_bytes=cfg.cache_mb << 20),
            PyEnvs(
                cache / "pyenvs",
                cfg.python,
                max_builds=cfg.max_env_builds,
                grace_s=cfg.env_grace_s,
            ),
            wake=self._wake.set,
        )
        self.envs.in_use = self._packages_in_use
        self._store: PackageStore | None = None
        self._next_env_sweep = 0.0
        self._notes: dict[str, EnvNote] = {}
        """Deployments waiting here for their runtime_env, or whose runtime_env failed."""
        self._running = RUNNING.labels(cfg.agent_id)
        self._running.set(0)
        CAPACITY.labels(cfg.agent_id).set(cfg.max_replicas)

    # -- public view -------------------------------------------------------------------------

    @property
    def children(self) -> Mapping[str, ChildState]:
        return MappingProxyType(self._children)

    def pid(self, replica_id: str) -> int | None:
        return self.procs.pid(replica_id)

    def info(self) -> AgentInfo:
        return AgentInfo(
            agent_id=self.cfg.agent_id,
            capacity=self.cfg.max_replicas,
            running=self._live(),
            hostname=self._hostname,
            pid=os.getpid(),
            started_at=self.started_at,
            resources=self.cfg.offer,
            environments=tuple(self._notes[d] for d in sorted(self._notes))[:MAX_ENV_NOTES],
        )

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    # -- main loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        if self.bus is None:
            self.bus = await NatsBus.connect(self.cfg.nats_url, name=f"agent-{self.cfg.agent_id}")
        tasks: list[asyncio.Task[None]] = []
        watcher: KVWatcher | None = None
        try:
            watcher = await retrying(
                "register and watch fp_targets", self._join, self._stopping, log
            )
            tasks.append(asyncio.create_task(self._consume(watcher), name="agent-targets"))
            tasks.append(asyncio.create_task(self._keep_registered(), name="agent-register"))
            log.info(
                "agent %s up: capacity %d, logs in %s",
                self.cfg.agent_id,
                self.cfg.max_replicas,
                self.procs.log_dir,
            )
            while not self._stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(TICK_S):
                        await self._wake.wait()
                self._wake.clear()
                await self._reconcile()
        except BusError:
            if not self._stopping.is_set():
                raise  # else: told to stop while still starting
        finally:
            if watcher is not None:
                await watcher.stop()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.envs.close()
            await self._drain()
            if self.creds is not None:
                self.creds.close()
            await self._unregister()
            if self._given_bus is None and self.bus is not None:
                await self.bus.close()

    async def _join(self) -> KVWatcher:
        assert self.bus is not None
        self._agents_kv = await self.bus.kv(KV_AGENTS, ttl=AGENT_TTL_S)
        await self._register()
        targets = await buckets.open_bucket(self.bus, buckets.TARGETS, create=False)
        return await targets.watch(agent_pattern(self.cfg.agent_id))  # the controller makes it

    async def _consume(self, watcher: KVWatcher) -> None:
        async for entry in watcher:
            if entry is None:
                self._synced = True
            elif entry.op == "DEL":
                self._targets.pop(entry.key, None)
            else:
                try:
                    self._on_targets(entry.key, entry.value)
                except Exception:  # a bug must not blind the agent to every later change
                    log.exception(
                        "agent %s: fp_targets/%s not applied", self.cfg.agent_id, entry.key
                    )
            self._wake.set()

    def _on_targets(self, key: str, value: bytes) -> None:
        try:
            target = wanted_target(
                key, envelope.decode(value, ReplicaTarget), self.cfg.agent_id, self.subjects
            )
        except WireError as exc:
            BAD_TARGETS.labels(exc.reason).inc()
            self.bad.drop(exc.reason, f"fp_targets/{key}: {exc.detail}")
            return
        if target is not None:
            self._targets[key] = target
        else:
            self._targets.pop(key, None)

    async def _reconcile(self) -> None:
        before = self._live()
        for rid, code in self.procs.poll():
            await self._on_exit(rid, code)
        running = self._synced and not self._stopping.is_set()
        wanted = self._prepared(merge_wanted(self._targets)) if running else {}
        now = self.clock.monotonic()
        actions = plan(
            wanted, self._children, self.cfg.max_replicas, now, kill_margin_s=self.cfg.kill_margin_s
        )
        if not any(isinstance(a, OverCapacity) for a in actions):
            self._skipped = ()
        for action in actions:
            if isinstance(action, Start):
                await self._start(action.target)
            elif isinstance(action, Stop):
                if self._advance(action.replica_id, ChildEvent.STOP, deadline=action.deadline):
                    self._signal(action.replica_id, signal.SIGTERM)
                    STOPS.inc()
            elif isinstance(action, Kill):
                if self._advance(action.replica_id, ChildEvent.KILL):
                    log.warning("replica %s did not exit in time: SIGKILL", action.replica_id)
                    self._signal(action.replica_id, signal.SIGKILL)
                    KILLS.inc()
            elif isinstance(action, Forget):
                del self._children[action.replica_id]
            elif isinstance(action, OverCapacity):
                self._over_capacity(action)
        if self.creds is not None:
            self.creds.renew(self.clock.wall())
        if running and self.procs.spares is not None:
            self.procs.spares.refill(now)  # the next replica (a wake from zero) starts in one
        if now >= self._next_env_sweep:
            self._next_env_sweep = now + ENV_SWEEP_S
            await self.envs.pyenvs.sweep(self._envs_in_use())
        live = self._live()
        self._running.set(live)
        if live != before:
            self._register_now.set()
        self.ticks += 1

    def _prepared(self, wanted: dict[str, ReplicaTarget]) -> dict[str, ReplicaTarget]:
        """`wanted` without the replicas whose runtime_env is still being prepared (fetched,
        built): they hold no slot meanwhile and start once it is ready. What waits, and what
        failed, goes into the agent's registration (`fleetpulse status` shows it)."""
        out: dict[str, ReplicaTarget] = {}
        notes: dict[str, EnvNote] = {
            d: n
            for d, n in self._notes.items()
            if n.state == "failed" and self.clock.wall() - n.since < FAILED_NOTE_S
        }
        for rid, t in wanted.items():
            if rid in self._children:
                out[rid] = t
                continue
            dep = f"{t.app}.{t.deployment}"
            state = self.envs.state(t.spec.runtime_env)
            if state is None:
                since, what = self.envs.progress(t.spec.runtime_env)
                notes[dep] = EnvNote(dep, "preparing", since, what)
                continue
            if isinstance(state, Failed):
                old = notes.get(dep)
                keep = old is not None and old.detail == state.reason
                notes[dep] = (
                    old if keep and old else EnvNote(dep, "failed", self.clock.wall(), state.reason)
                )
            elif dep in notes:
                del notes[dep]
            out[rid] = t
        if notes != self._notes:
            self._notes = notes
            self._register_now.set()
        return out

    def _envs_in_use(self) -> set[str]:
        """The pip/uv environments live replicas run in (kept by the sweep)."""
        keys = set()
        for c in self._children.values():
            pip = c.target.spec.runtime_env.get("pip") if not c.exited else None
            if pip:
                keys.add(self.envs.pyenvs.key(pip))
        return keys

    def _packages_in_use(self) -> set[str]:
        return {
            str(ref["sha256"])
            for c in self._children.values()
            if not c.exited
            for ref in runtimeenv.refs(c.target.spec.runtime_env)
        }

    def _package_store(self) -> PackageStore:
        if self._store is None:
            js = getattr(self.bus, "js", None)
            if js is None:
                raise PackageError("this agent's bus has no object store")
            self._store = NatsPackageStore(js, create=False)
        return self._store

    async def _start(self, spec: ReplicaTarget) -> None:
        prepared = self.envs.state(spec.spec.runtime_env)
        if prepared is None or isinstance(prepared, Failed):
            reason = "not prepared" if prepared is None else prepared.reason
            self._children[spec.replica_id] = ChildState(spec)
            log.error("replica %s cannot start: %s", spec.replica_id, reason)
            START_FAILURES.inc()
            await self._on_exit(spec.replica_id, EXIT_RUNTIME_ENV_FAILED)
            return
        argv = replica_argv(
            spec,
            python=prepared.python or self.cfg.python,
            nats_url=self.cfg.nats_url,
            agent_id=self.cfg.agent_id,
            namespace=self.cfg.namespace,
        )
        name = f"{spec.app}.{spec.deployment}.{spec.replica_id}"
        self._children[spec.replica_id] = ChildState(spec)
        try:
            env = replica_env(spec, os.environ.get(resources.GPU_ENV))
            if self.creds is not None:
                env.update(self.creds.issue(spec, self.clock.wall()))
            if prepared.pythonpath:
                env["PYTHONPATH"] = self.procs.pythonpath(prepared.pythonpath)
            spares_taken = self.procs.spares.taken if self.procs.spares is not None else 0
            pid = self.procs.start(spec.replica_id, argv, name, env, cwd=prepared.cwd)
        except (OSError, ValueError) as exc:  # ValueError: e.g. a NUL byte in an argument
            log.error("replica %s could not be started: %s", spec.replica_id, exc)
            START_FAILURES.inc()
            await self._on_exit(spec.replica_id, EXIT_SPAWN_FAILED)
            return
        STARTS.inc()
        spare = self.procs.spares is not None and self.procs.spares.taken > spares_taken
        if spare:
            SPARE_STARTS.inc()
        log.info(
            "replica %s started%s: pid %d, log %s",
            spec.replica_id, " in a spare" if spare else "", pid, self.procs.log_path(name),
        )  # fmt: skip
        # the spawn, not the replica's own "starting" after its imports, begins its start time
        # (what the what-if model reads from recordings)
        await self._lifecycle(spec, LifecycleState.STARTING)

    def _signal(self, replica_id: str, sig: signal.Signals) -> None:
        if not self.procs.signal(replica_id, sig):
            log.debug("replica %s already gone before %s", replica_id, sig.name)

    async def _on_exit(self, replica_id: str, code: int) -> None:
        child = self._children.get(replica_id)
        if child is None or not self._advance(replica_id, ChildEvent.REAPED, code=code):
            return
        if self.creds is not None:
            self.creds.drop(replica_id)
        EXITS.labels(str(code)).inc()
        level = logging.INFO if code == 0 else logging.WARNING
        log.log(level, "replica %s exited with code %d", replica_id, code)
        await self._lifecycle(child.target, LifecycleState.EXITED, code)

    def _advance(
        self, replica_id: str, event: ChildEvent, *, deadline: float | None = None, code: int = 0
    ) -> bool:
        """Step the child through core's table; a refused step is counted and logged, and the
        caller does nothing (no signal, no second "exited")."""
        child, refused = advance(self._children[replica_id], event, deadline=deadline, code=code)
        if refused is not None:
            self.refusals.refused(refused, f"replica={replica_id}")
            return False
        self._children[replica_id] = child
        return True

    async def _lifecycle(
        self, spec: ReplicaTarget, state: LifecycleState, code: int | None = None
    ) -> None:
        event = Lifecycle(
            replica_id=spec.replica_id,
            agent_id=self.cfg.agent_id,
            state=state.value,
            at=self.clock.wall(),
            rpc_subject=spec.rpc_subject,
            version=spec.version,
            exit_code=code,
            app=spec.app,
            deployment=spec.deployment,
        )
        if self.bus is None:
            return
        try:
            subject = self.subjects.report("lifecycle", spec.app, spec.deployment)
            await self.bus.publish(subject, encode(event))
        except FleetpulseError as exc:
            log.warning("could not report replica %s %s: %s", spec.replica_id, state, exc)

    def _over_capacity(self, action: OverCapacity) -> None:
        if action.skipped == self._skipped:
            return
        self._skipped = action.skipped
        if action.assigned > self.cfg.max_replicas:
            log.warning(
                "%d replicas assigned to agent %s, capacity %d: not starting %s",
                action.assigned,
                self.cfg.agent_id,
                self.cfg.max_replicas,
                ", ".join(action.skipped),
            )
        else:
            log.info(
                "waiting for %d draining replica(s) to free a slot for %s",
                action.draining,
                ", ".join(action.skipped),
            )

    def _live(self) -> int:
        return sum(1 for c in self._children.values() if not c.exited)

    # -- registration ------------------------------------------------------------------------

    async def _register(self) -> None:
        assert self._agents_kv is not None
        await self._agents_kv.put(self.cfg.agent_id, self.info().encode())

    async def _keep_registered(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REGISTER_INTERVAL_S):
                    await self._register_now.wait()
            self._register_now.clear()
            try:
                await self._register()
            except FleetpulseError as exc:
                log.warning("agent %s: registration failed: %s", self.cfg.agent_id, exc)
                await asyncio.sleep(REGISTER_RETRY_S)
                # a nats-server that restarted without its store lost the bucket: bring it back
                with contextlib.suppress(FleetpulseError):
                    assert self.bus is not None
                    self._agents_kv = await self.bus.kv(KV_AGENTS, ttl=AGENT_TTL_S)
                self._register_now.set()

    async def _unregister(self) -> None:
        if self._agents_kv is None:
            return
        try:
            await self._agents_kv.delete(self.cfg.agent_id)
        except FleetpulseError as exc:
            log.warning(
                "agent %s: could not delete its fp_agents entry: %s", self.cfg.agent_id, exc
            )

    # -- shutdown ----------------------------------------------------------------------------

    async def _drain(self) -> None:
        """Stop every child (SIGTERM, SIGKILL past its deadline) and report each exit."""
        self._stopping.set()
        if self.procs.spares is not None:
            self.procs.spares.close()
        if not self._children:
            return
        log.info("agent %s: stopping %d replica(s)", self.cfg.agent_id, self._live())
        longest = max(
            (c.target.spec.graceful_shutdown_timeout_s for c in self._children.values()), default=0
        )
        give_up = self.clock.monotonic() + longest + self.cfg.kill_margin_s + DRAIN_EXTRA_S
        while self._live() and self.clock.monotonic() < give_up:
            await self._reconcile()
            if self._live():
                await asyncio.sleep(TICK_S / 2)
        if self._live():
            log.error(
                "agent %s: replicas still running after the drain: killing", self.cfg.agent_id
            )
            self.procs.kill_all()
            await self._reconcile()


def _count_refused(r: Refused) -> None:
    TRANSITIONS_REFUSED.labels(r.machine, r.state, r.event).inc()

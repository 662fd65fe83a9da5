"""Replicas of one deployment, their states, the target and the deployment status.

How it works: the controller decides *how many* replicas (the policy) and this module decides
*which*. Each replica record moves through

    PENDING --starting--> STARTING --ready--> RUNNING --(scale down, replace)--> DRAINING --exited--> gone
       \\________________________\\_________________ exited / startup timeout ______________/

PENDING means "in fp_targets, not yet heard from"; lifecycle events from the replica (or its agent)
drive the rest. Every move of a record's state goes through one table (lifecycle.py); an event the
table does not allow leaves the record as it was and comes back as a `transition_refused` event. While agents place replicas (`placing`), a PENDING replica without an agent is
waiting for room, not starting: no start timeout runs for it, it goes at once when no longer
wanted (no process will report its exit), and `unplaced` (why, from placement.py) shows in the
status message. Likewise a PENDING replica whose agent says it prepares the deployment's
runtime_env (fetches packages, builds a pip/uv environment: minutes, `preparing`) is not
starting yet: its start clock runs from when the agent stops saying so, and a preparation
longer than `prepare_timeout_s` (a setting) makes the deployment DEPLOY_FAILED with that reason. `reconcile(now)` adds replicas (with ids from a deterministic generator) until the
live count meets the target, drains the surplus (pending first, then the newest running), replaces
replicas with an unhealthy verdict, and rolls a new version. Membership (what routers may call)
is the RUNNING replicas without a verdict, in start order; it gets a new epoch whenever it changes.

A rollout (the deployment's `rollout`, shared/rollout.py; surge S and unavailable U resolved for
the target T at every tick) keeps two bounds, Kubernetes' rolling update: live replicas (old and
new, not draining) <= T + S, and routable ones (running, no verdict) >= T - U. Each tick: old
replicas still starting drain at once (they cost no routable replica: a new version arriving
mid-rollout), then as many routable old ones drain as the floor allows (oldest first), then new
ones start into the room left. So at the defaults (1, 0) one new replica is in flight and an old
one drains per new one running; with U > 0 up to U old ones drain before their successors run.
A target moved by the autoscaler mid-rollout moves both bounds; new replicas above a lower target
drain (starting ones first). Draining replicas count against neither bound (they are out of
membership already and leave on their own). A tick starts and drains at most ROLLOUT_STEP
replicas each, so a large surge is reached over a few ticks, not in one long one.

Status follows the brief: UPDATING until the current version first meets its target (or during a
rollout; a deployment created at zero is HEALTHY at once, so a later wake-up is UPSCALING),
HEALTHY when the target is met with healthy replicas (target 0 reached counts), UPSCALING /
DOWNSCALING while moving, UNHEALTHY after a recent verdict or crash until healthy again,
DEPLOY_FAILED after `max_start_failures` replicas in a row failed to start (the message carries
what an agent said of the deployment's runtime_env, `environment`: why it failed, or that it is
still being prepared while UPDATING). The status is not a
state machine of its own: `_compute_status` derives it afresh from the records at every tick (by
the rules above, in that order), so any status may follow any other and none is refused; what moves
by events, and is refused when an event is illegal, is each replica record (lifecycle.py).

Cost: every tick asks for the live set, the running ids, the counts and the status, and at tens
of thousands of replicas a pass over the records each time is the whole control loop. So what is
derived from the records is kept up to date by delta (records.py): a record reports every
assignment to any of its fields, and adding or removing one is reported too, on change channels
that each consumer empties when it catches up. A steady deployment costs no pass over its replicas
at all, and one changed replica costs O(1) (a rollout re-sorts old from new once).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from shared import settings
from shared.rollout import DEFAULT as DEFAULT_ROLLOUT
from shared.rollout import RolloutConfig
from shared.transitions import Refused
from shared.wire.messages import LifecycleState

from .lifecycle import REPLICA_LIFECYCLE, Decision, Event
from .records import RecordSets, ReplicaRecord, ReplicaState, Revision, take

__all__ = ["DeploymentState", "DeploymentStatus", "ReplicaRecord", "ReplicaState", "StateEvent"]

TRANSITION_REFUSED = "transition_refused"

STARTUP_TIMEOUT_S = 120.0
MAX_START_FAILURES = 3
UNHEALTHY_HOLD_S = 30.0
EARLY_S = 1e-6
"""Start timeouts are looked for this much early (float rounding of `now - since`)."""
ROLLOUT_STEP = 64
"""A rollout tick starts at most this many replicas and drains at most this many. Every replica
started costs the ticks that follow a few changes (its record, its agent, starting, ready, its
KV keys; then draining, exited), ~25 us each, so a 25% surge of 16,384 replicas at once was a
0.1-0.2 s tick; 64 of each keep the tick's CPU p99 under ~10 ms at 16,384 replicas and still
start 640 replicas a second (docs/benchmarks.md)."""


class DeploymentStatus(enum.Enum):
    UPDATING = "UPDATING"
    HEALTHY = "HEALTHY"
    UPSCALING = "UPSCALING"
    DOWNSCALING = "DOWNSCALING"
    UNHEALTHY = "UNHEALTHY"
    DEPLOY_FAILED = "DEPLOY_FAILED"


@dataclass(frozen=True, slots=True)
class StateEvent:
    """Something the shell should log (and count); the core never logs."""

    kind: str
    replica_id: str
    detail: str
    refused: Refused | None = None
    """Set on a `transition_refused` event: the machine, state and event (the counter's labels)."""


@dataclass(slots=True)
class DeploymentState:
    app: str
    deployment: str
    version: str
    id_prefix: str
    target: int = 0
    replicas: dict[str, ReplicaRecord] = field(default_factory=dict)
    membership_epoch: int = 0
    start_failures: int = 0
    settled: bool = False
    last_trouble: float | None = None
    status: DeploymentStatus = DeploymentStatus.UPDATING
    message: str = ""
    placing: bool = False
    """Agents place replicas (placement is on): a PENDING replica without an agent is waiting
    for room, not starting, so no start timeout runs for it."""
    unplaced: str = ""
    """Why some replica fits on no agent (placement.py), or "" (the status message says it)."""
    environment: str = ""
    """What agents say of its runtime_env (fp_agents: preparing it, or the error that failed
    it), or "": the status message carries it (core.on_agent)."""
    preparing: dict[str, float] = field(default_factory=dict)
    """Agent id -> when (local receipt time) it first said it prepares this deployment's
    runtime_env (fp_agents notes, core.on_agent). Its PENDING replicas' start clock is stopped
    meanwhile (an install may take minutes) and starts again when the note goes; past
    `prepare_timeout_s` the deployment is DEPLOY_FAILED."""
    prepare_timeout_s: float = settings.CONTROLLER_PREPARE_TIMEOUT.default
    failed_why: str = ""
    """Why the deployment is DEPLOY_FAILED when it is not its replicas' starts (a runtime_env
    prepared for too long), or ""."""
    on_remove: Callable[[str], None] | None = field(default=None, repr=False, compare=False)
    """Called with the id of every record removed (what it held on its agent is released)."""
    _next_id: int = 0
    _next_order: int = 0
    _rev: Revision = field(default_factory=Revision, repr=False, compare=False)
    _sets: RecordSets | None = field(default=None, repr=False, compare=False)
    _sets_changes: set[str] = field(default_factory=set, repr=False, compare=False)
    _kv_changes: set[str] = field(default_factory=set, repr=False, compare=False)
    _retire_queue: list[ReplicaRecord] = field(default_factory=list, repr=False, compare=False)
    """Old-version replicas, newest first (popped from the end), for the rollout in progress."""
    _retire_version: str | None = field(default=None, repr=False, compare=False)
    rollout: RolloutConfig = DEFAULT_ROLLOUT
    _starts_due: float = field(default=-math.inf, repr=False, compare=False)
    """No waiting replica's start times out before this (`_time_out_starts`)."""

    def __post_init__(self) -> None:
        self._rev.channels += [self._sets_changes, self._kv_changes]

    @property
    def revision(self) -> int:
        """Changes to the records so far (a cache key for views of them)."""
        return self._rev.n

    def channel(self) -> set[str]:
        """A new change channel: the ids of records changed (set, added, removed) from now on;
        its owner empties it (records.take) when it has caught up."""
        return self._rev.channel()

    def view(self) -> RecordSets:
        """The records' classes and counts, brought up to date with the records changed since
        (O(changed), see records.py)."""
        sets = self._sets
        if sets is None:
            sets = self._sets = RecordSets(self.version)
            sets.update(self.replicas, self.replicas, self.version)
            self._sets_changes.clear()
        elif self._sets_changes or sets.version != self.version:
            sets.update(self.replicas, take(self._sets_changes), self.version)
        return sets

    # -- ids ---------------------------------------------------------------------------------

    def _new_replica(self, now: float) -> ReplicaRecord:
        self._next_id += 1
        rid = f"{self.id_prefix}-{self._next_id:x}"
        self._next_order += 1
        rec = ReplicaRecord(
            rid, self.version, ReplicaState.PENDING, now, self._next_order, rev=self._rev
        )
        self.replicas[rid] = rec
        self._waits_from(now)
        return rec

    def adopt(
        self, replica_id: str, version: str, now: float, *, id_number: int = 0, order: int = 0
    ) -> None:
        """Take over a replica found in fp_targets after a restart (state PENDING until it
        speaks), keeping its start order."""
        if replica_id in self.replicas:
            return
        self._next_order = max(self._next_order + 1, order)
        self._next_id = max(self._next_id, id_number)
        rec = ReplicaRecord(
            replica_id, version, ReplicaState.PENDING, now, order or self._next_order, rev=self._rev
        )
        self.replicas[replica_id] = rec
        self._waits_from(now)

    # -- lifecycle input ---------------------------------------------------------------------

    def on_lifecycle(
        self,
        replica_id: str,
        state: str,
        now: float,
        *,
        rpc_subject: str = "",
        agent_id: str = "",
        http_address: str = "",
    ) -> list[StateEvent]:
        rec = self.replicas.get(replica_id)
        if rec is None:
            return [StateEvent("unknown_replica", replica_id, f"lifecycle {state} ignored")]
        if agent_id:
            rec.agent_id = agent_id
        if rpc_subject:
            rec.rpc_subject = rpc_subject
        if http_address:  # sent on "ready" only: later messages leave it as it was
            rec.http_address = http_address
        try:
            event = LifecycleState(state)
        except ValueError:  # the decoder lets none through; a caller in process might
            return [_refused(replica_id, REPLICA_LIFECYCLE.refused(rec.state, "invalid"))]
        before = rec.state
        after, refused = REPLICA_LIFECYCLE.step(before, event)
        if refused is not None:
            return [_refused(replica_id, refused)]
        if after is ReplicaState.GONE:
            return self._exited(rec, now)
        if after is before:
            return []
        rec.state, rec.since = after, now
        if after is ReplicaState.STARTING:
            self._waits_from(now)
        elif after is ReplicaState.RUNNING:
            if rec.version == self.version:
                self.start_failures = 0
                self.failed_why = ""
            return [StateEvent("replica_running", replica_id, "")]
        return []

    def _move(self, rec: ReplicaRecord, event: Event, now: float) -> list[StateEvent]:
        """The controller's own transition of `rec` (a `Decision`); GONE removes the record."""
        after, refused = REPLICA_LIFECYCLE.step(rec.state, event)
        if refused is not None:
            return [_refused(rec.replica_id, refused)]
        if after is ReplicaState.GONE:
            self._remove(rec.replica_id)
        elif after is not rec.state:
            rec.state, rec.since = after, now
        return []

    def _exited(self, rec: ReplicaRecord, now: float) -> list[StateEvent]:
        self._remove(rec.replica_id)
        if rec.state is ReplicaState.DRAINING:
            return [StateEvent("replica_stopped", rec.replica_id, "")]
        if rec.state in (ReplicaState.PENDING, ReplicaState.STARTING):
            self.start_failures += 1
            self.last_trouble = now
            return [StateEvent("start_failed", rec.replica_id, f"{self.start_failures} in a row")]
        self.last_trouble = now
        return [StateEvent("replica_crashed", rec.replica_id, "exited while running")]

    def verdict(self, replica_id: str, reason: str, now: float) -> list[StateEvent]:
        """The health registry judged this replica unhealthy: replace it."""
        rec = self.replicas.get(replica_id)
        if rec is None or rec.verdict:
            return []
        rec.verdict = reason
        self.last_trouble = now
        refused = self._move(rec, Decision.DRAIN, now)
        return [StateEvent("replica_unhealthy", replica_id, reason), *refused]

    def lost_with_agent(self, replica_id: str, reason: str) -> list[StateEvent]:
        """The replica's agent is gone and the replica with it: replace it, but not as the
        deployment's trouble (its code did nothing wrong). The status reads UPSCALING while the
        replacement starts, not UNHEALTHY, so an app left at zero stays registered and its
        requests are held (an UNHEALTHY app at zero is deregistered)."""
        rec = self.replicas.get(replica_id)
        if rec is None:
            return []
        refused = self._move(rec, Decision.LOST, 0.0)
        return [StateEvent("replica_unhealthy", replica_id, reason), *refused]

    def forget(self, replica_id: str) -> list[StateEvent]:
        """The replica is gone for good (its process is known dead): drop the record."""
        rec = self.replicas.get(replica_id)
        return [] if rec is None else self._move(rec, Decision.LOST, 0.0)

    def _remove(self, replica_id: str) -> None:
        del self.replicas[replica_id]
        self._rev.touched(replica_id)
        if self.on_remove is not None:
            self.on_remove(replica_id)

    def take_dirty(self) -> list[str]:
        """The ids of records changed, added or removed since the last call (the KV delta's
        channel), sorted."""
        return take(self._kv_changes)

    def assign_agent(self, replica_id: str, agent_id: str) -> None:
        self.replicas[replica_id].agent_id = agent_id

    # -- reconcile ---------------------------------------------------------------------------

    def live(self) -> list[ReplicaRecord]:
        return list(self.view().live.values())

    def running_ids(self) -> list[str]:
        return list(self.view().running)

    def reconcile(self, now: float) -> list[StateEvent]:
        events = self._time_out_starts(now)
        if self.start_failures >= MAX_START_FAILURES and (
            self.failed_why or self.status is DeploymentStatus.DEPLOY_FAILED
        ):
            return events  # stop retrying; a new version or a redeploy resets
        view = self.view()
        if view.old:
            events += self._roll(view, now)
        else:
            events += self._resize(view, now)
        return events

    def _time_out_starts(self, now: float) -> list[StateEvent]:
        """Starts that took too long. The waiting replicas are looked at only once the earliest
        of them could be due (a rollout keeps up to a surge of them waiting at every tick)."""
        if now < self._starts_due:
            return []
        events: list[StateEvent] = []
        due = math.inf
        for rec in list(self.view().waiting.values()):
            if self.placing and not rec.agent_id and rec.state is ReplicaState.PENDING:
                continue  # waiting for room on an agent: its start clock runs from placement
            prepared_from = self.preparing.get(rec.agent_id) if rec.agent_id else None
            if prepared_from is not None and rec.state is ReplicaState.PENDING:
                # its agent prepares the runtime_env: no start yet, but a bound of its own
                if now - prepared_from >= self.prepare_timeout_s:
                    events += self._prepare_timed_out(rec, now, now - prepared_from)
                else:
                    due = min(due, prepared_from + self.prepare_timeout_s - STARTUP_TIMEOUT_S)
                continue
            if now - rec.since >= STARTUP_TIMEOUT_S:
                events += self._move(rec, Decision.START_TIMEOUT, now)
                self.start_failures += 1
                self.last_trouble = now
                events.append(
                    StateEvent("start_timeout", rec.replica_id, f"{STARTUP_TIMEOUT_S:g} s")
                )
            else:
                due = min(due, rec.since)
        self._starts_due = due + STARTUP_TIMEOUT_S - EARLY_S
        return events

    def preparing_on(self, agent_id: str, preparing: bool, now: float | None) -> None:
        """Agent `agent_id` says (or no longer says) it prepares this deployment's runtime_env,
        heard at `now` (None: the agent is gone). When it stops, its PENDING replicas' start
        clock runs from `now`: the time spent preparing is no start."""
        if preparing:
            self.preparing.setdefault(agent_id, -math.inf if now is None else now)
            if now is not None:
                self._starts_due = min(self._starts_due, now)  # looked at again for its bound
            return
        if self.preparing.pop(agent_id, None) is None or now is None:
            return
        for rec in self.view().waiting.values():
            if rec.agent_id == agent_id and rec.state is ReplicaState.PENDING:
                rec.since = max(rec.since, now)
        self._waits_from(now)

    def _prepare_timed_out(self, rec: ReplicaRecord, now: float, took: float) -> list[StateEvent]:
        """An agent prepared the runtime_env for longer than `prepare_timeout_s`: the
        deployment is DEPLOY_FAILED (no retry: a new version or a redeploy resets)."""
        events = self._move(rec, Decision.START_TIMEOUT, now)
        self.start_failures = max(self.start_failures, MAX_START_FAILURES)
        self.last_trouble = now
        self.failed_why = (
            f"runtime_env still being prepared on agent {rec.agent_id} after {took:.0f} s "
            f"(--prepare-timeout-s {self.prepare_timeout_s:g})"
        )
        return [*events, StateEvent("prepare_timeout", rec.replica_id, self.failed_why)]

    def start_timeouts_due(self) -> float:
        """When the next visit must look for starts that took too long (inf: none waits)."""
        return self._starts_due if self.view().waiting else math.inf

    def waits_for_room(self) -> bool:
        """Whether a PENDING replica waits for an agent with room (placement places the waiting
        replicas of the deployments a tick visits)."""
        if not self.placing:
            return False
        return any(
            not r.agent_id and r.state is ReplicaState.PENDING for r in self.view().waiting.values()
        )

    def placed(self, replica_id: str, agent_id: str, devices: tuple[int, ...], now: float) -> None:
        """An agent with room was found: its start clock runs from now (the time it waited for
        room is not a start)."""
        rec = self.replicas[replica_id]
        rec.agent_id, rec.devices, rec.since = agent_id, devices, now
        self._waits_from(now)

    def _waits_from(self, now: float) -> None:
        """A replica waits (again) from `now`: its start times out no earlier than that."""
        self._starts_due = min(self._starts_due, now + STARTUP_TIMEOUT_S - EARLY_S)

    def _resize(self, view: RecordSets, now: float) -> list[StateEvent]:
        events: list[StateEvent] = []
        count = view.new_count
        for _ in range(self.target - count):
            rec = self._new_replica(now)
            events.append(StateEvent("replica_added", rec.replica_id, f"target {self.target}"))
        surplus = count - self.target
        if surplus > 0:
            rank = {ReplicaState.PENDING: 0, ReplicaState.STARTING: 1, ReplicaState.RUNNING: 2}
            victims = sorted(view.new(), key=lambda r: (rank[r.state], -r.order))[:surplus]
            events += self._drain(victims, now, "scale down")
        return events

    def _roll(self, view: RecordSets, now: float) -> list[StateEvent]:
        """Rolling onto the current version within `rollout`'s budget (see the header). From
        the counts, and the oldest old replicas from a queue sorted once per rollout, so a
        rollout tick costs O(replicas it changes), not a pass over the deployment. (A replica
        with a verdict is draining, never running, so the running replicas of the new version
        are `running_current`.)"""
        target = self.target
        surge, unavailable = self.rollout.budget(target)
        new_running, new_waiting = view.running_current, view.waiting_current
        routable = len(view.running) - view.running_condemned
        old_live, new_count = len(view.old), view.new_count
        events: list[StateEvent] = []
        drains = ROLLOUT_STEP  # what this tick may still drain
        # old replicas still starting will never serve this version: stopping them costs no
        # routable replica and frees their room (a new version arriving mid-rollout)
        if len(view.waiting) > new_waiting:
            stale = [r for r in view.waiting.values() if r.version != self.version][:drains]
            events += self._drain(stale, now, "replaced by new version")
            old_live -= len(stale)
            drains -= len(stale)
        # an old routable replica retires whenever the floor allows it
        retire = min(routable - new_running, routable - (target - unavailable), drains)
        retired = self._oldest_old(view, retire)
        events += self._drain(retired, now, "replaced by new version")
        old_live -= len(retired)
        drains -= len(retired)
        if new_count > target:  # the target fell mid-rollout: the newest new ones go first
            surplus = self._drain_new(view, min(new_count - target, drains), now)
            events += surplus
            new_count -= len(surplus)
        room = target + surge - old_live - new_count
        for _ in range(min(target - new_count, room, ROLLOUT_STEP)):
            rec = self._new_replica(now)
            events.append(StateEvent("replica_added", rec.replica_id, f"rollout to {self.version}"))
        return events

    def _drain(self, recs: list[ReplicaRecord], now: float, why: str) -> list[StateEvent]:
        """Stop `recs`: each drains, unless it was never placed on an agent (it waits for
        room): no process runs it, so none will report its exit, and it goes at once."""
        refused: list[StateEvent] = []
        for rec in recs:
            unplaced = self.placing and not rec.agent_id and rec.state is ReplicaState.PENDING
            refused += self._move(rec, Decision.DROP if unplaced else Decision.DRAIN, now)
        return [StateEvent("replica_draining", rec.replica_id, why) for rec in recs] + refused

    def _drain_new(self, view: RecordSets, surplus: int, now: float) -> list[StateEvent]:
        """`surplus` new-version replicas: those still starting (newest first), then running
        ones only beyond the target (so the floor holds); a pass over the deployment only in
        the second case."""
        waiting = [r for r in view.waiting.values() if r.version == self.version]
        victims = sorted(waiting, key=lambda r: (r.state is ReplicaState.STARTING, -r.order))
        victims = victims[:surplus]
        if len(victims) < surplus:
            running = [r for r in view.new() if r.state is ReplicaState.RUNNING]
            running.sort(key=lambda r: -r.order)
            victims += running[: surplus - len(victims)]
        return self._drain(victims, now, "scale down")

    def _oldest_old(self, view: RecordSets, n: int) -> list[ReplicaRecord]:
        """The `n` old-version live replicas first in start order."""
        if n <= 0:
            return []
        if self._retire_version != self.version or len(self._retire_queue) < len(view.old):
            self._retire_version = self.version
            self._retire_queue = sorted(view.old.values(), key=lambda r: r.order)
            self._retire_queue.reverse()  # popped from the end: first in start order first
        queue, out = self._retire_queue, list[ReplicaRecord]()
        while queue and len(out) < n:
            rec = queue.pop()
            # (one drained since, or still starting and drained this tick, is passed over)
            if view.old.get(rec.replica_id) is rec and rec.state is ReplicaState.RUNNING:
                out.append(rec)
        return out

    # -- outputs -----------------------------------------------------------------------------

    def target_ids(self) -> list[ReplicaRecord]:
        """Replicas the agents must run: everything not draining, in start order."""
        return self.view().by_order()

    def update_status(self, now: float) -> bool:
        status, message = self._compute_status(now)
        if status is DeploymentStatus.HEALTHY:
            self.settled = True  # later moves from zero are UPSCALING, not UPDATING
        changed = (status, message) != (self.status, self.message)
        self.status, self.message = status, message
        return changed

    def _compute_status(self, now: float) -> tuple[DeploymentStatus, str]:
        if self.start_failures >= MAX_START_FAILURES:
            if self.failed_why:
                return DeploymentStatus.DEPLOY_FAILED, self.failed_why
            env = f": {self.environment}" if self.environment else ""
            return (
                DeploymentStatus.DEPLOY_FAILED,
                f"{self.start_failures} replicas in a row failed to start{env}",
            )
        view = self.view()
        running = len(view.running) - view.running_condemned
        current = view.running_current
        rolling = bool(view.old)
        waiting = f"; a replica cannot be placed: {self.unplaced}" if self.unplaced else ""
        if self.environment:
            waiting += f"; {self.environment}"
        if rolling or (not self.settled and current < self.target):
            return DeploymentStatus.UPDATING, "starting replicas of version " + (
                self.version or "-"
            ) + waiting
        recent_trouble = (
            self.last_trouble is not None and now - self.last_trouble < UNHEALTHY_HOLD_S
        )
        if recent_trouble and current < self.target:
            return (
                DeploymentStatus.UNHEALTHY,
                "replicas failing health checks or crashing" + waiting,
            )
        if current < self.target:
            return DeploymentStatus.UPSCALING, f"{current}/{self.target} replicas running{waiting}"
        if running > self.target or view.draining_clean > 0:
            return DeploymentStatus.DOWNSCALING, f"draining to {self.target}"
        return DeploymentStatus.HEALTHY, f"{current}/{self.target} replicas running"

    def set_version(self, version: str) -> None:
        if version != self.version:
            self.version = version
            self.settled = False
            self.start_failures = 0
            self.failed_why = ""


def _refused(replica_id: str, refused: Refused) -> StateEvent:
    return StateEvent(TRANSITION_REFUSED, replica_id, str(refused), refused)


def app_status(statuses: Iterable[DeploymentStatus], deleting: bool = False) -> str:
    """DEPLOYING, RUNNING, UNHEALTHY, DEPLOY_FAILED or DELETING from the deployments' statuses."""
    s = set(statuses)
    if deleting:
        return "DELETING"
    if DeploymentStatus.DEPLOY_FAILED in s:
        return "DEPLOY_FAILED"
    if DeploymentStatus.UNHEALTHY in s:
        return "UNHEALTHY"
    if DeploymentStatus.UPDATING in s:
        return "DEPLOYING"
    return "RUNNING"

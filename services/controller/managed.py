"""Everything the controller keeps for one deployment, and its per-tick decision.

How it works: a `ManagedDeployment` bundles the pure pieces (DeploymentState, ReplicaIndex,
DeploymentMetrics, HealthRegistry, DemandWindow, the policy state) and `step(now, hold_verdicts)`
runs one control tick over them in a fixed order:

    index/registry/metrics follow the replica records -> expire silent handles -> sample demand
    -> health verdicts (replace) -> policy decides the target -> reconcile replicas
    -> (after placement) per-replica KV deltas and the status

After a visit, `next_visit` says when the next one is needed (schedule.py): at every tick while
something moves, at the earliest time a timer could change the outcome (health going stale, a
handle expiring, the last demand change leaving the window, an unhealthy hold ending), or only
when something arrives. A deployment skipped for some ticks catches up first (`catch_up`): the
demand samples those ticks would have added (its demand was constant) and the expiry they would
have run, so its state is what visiting it every tick would have made it.

Only changes come out: the puts and deletes of the replicas whose records changed (kv_delta.py)
and a status change, so a steady deployment costs no KV writes and one replaced replica a few.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from shared.appconfig import AutoscalingConfig, DeploymentConfig
from shared.errors import UsageError
from shared.kv.membership import Member
from shared.kv.status import DeploymentStatusView
from shared.kv.targets import ReplicaTarget
from shared.subjects import Subjects

from .custom_policy import Answer, CustomMetric, CustomPolicy, PolicyCall
from .demand_window import DemandWindow
from .deployment_state import UNHEALTHY_HOLD_S, DeploymentState, ReplicaState, StateEvent
from .health_registry import HealthEvaluation, HealthRegistry, VerdictReason
from .kv_delta import KVChange, KVDelta
from .machinery.schedule import BUSY, TickLog
from .metrics_store import DeploymentMetrics
from .placement import Waiting
from .policy import NONE, Decision, PolicyInputs, PolicyState, decide, initial_state
from .records import take
from .replica_index import ReplicaIndex

EARLY_S = 1e-6
"""Timers fire this much early (see `next_visit`)."""


@dataclass(slots=True)
class StepResult:
    events: list[StateEvent] = field(default_factory=list)
    kv: list[KVChange] = field(default_factory=list)
    """Puts and deletes of fp_targets / fp_membership keys for the replicas that changed."""
    members_changed: bool = False
    status_changed: bool = False
    decision_changed: bool = False
    previous_target: int = 0
    """The target before this tick's decision (its direction, for metrics)."""
    evaluation: HealthEvaluation | None = None


class ManagedDeployment:
    def __init__(
        self,
        app: str,
        cfg: DeploymentConfig,
        version: str,
        now: float,
        *,
        id_prefix: str,
        subjects: Subjects,
    ) -> None:
        self.app = app
        self.cfg = cfg
        self.policy_cfg: AutoscalingConfig = cfg.policy
        self.subjects = subjects
        self.state = DeploymentState(app, cfg.name, version, id_prefix=id_prefix)
        self.state.rollout = cfg.rollout
        self.index = ReplicaIndex()
        self.metrics = DeploymentMetrics(self.index, self.policy_cfg.metrics_interval_s)
        self.health = self._registry()
        self.window = DemandWindow.for_policy(self.policy_cfg)
        self.policy: PolicyState = initial_state(self.policy_cfg, now)
        self.state.target = self.policy.target
        self.decision = Decision(self.policy.target, self.policy.target, "initial", False)
        self.kv = KVDelta(app, cfg.name)
        self._stray: list[KVChange] = []
        self.kv.set_spec(version, cfg.replica_spec())
        self.kv.set_queue_bound(_queue_bound(cfg))
        self._changes = self.state.channel()
        """Records changed since the index, registry and metrics last followed them."""
        self._follow_in_full = True
        """The next follow looks at every record (first time, or a new registry)."""
        self._last_rule = ""
        self._custom: CustomPolicy | None = None
        """The custom policy of `policy_cfg.policy`, made at its first decision."""
        self._asked: PolicyInputs | None = None
        """The inputs of the custom policy's call this tick (settled with its answer)."""
        self.sampled_until = -math.inf
        """The last tick whose demand sample the window holds (or was caught up with)."""
        self._run_start: float | None = None
        """Since when every demand sample was equal and no gap broke coverage."""
        self.counts = (0, 0)
        """(stale, candidates) of the last health evaluation (the stall guard's inputs)."""
        self._demand_seen = (-1, 0.0)
        self._decides = True
        """Whether the last visit decided a target (False while being deleted)."""
        self._health_timer = False
        """Whether the due time `_timers` gave last is the health registry's..."""
        self._hold_timer = False
        """...or the end of an unhealthy hold (neither: a metrics source's expiry)..."""
        self._start_timer = False
        """...or when a waiting replica's start could time out."""

    @property
    def name(self) -> str:
        return self.cfg.name

    def reconfigure(self, cfg: DeploymentConfig, version: str, now: float) -> None:
        """A new config or version: keep replicas and history, roll if the version changed."""
        self.cfg = cfg
        new_policy = cfg.policy
        read_before = self._decision_reads_demand()
        if new_policy.metrics_interval_s != self.policy_cfg.metrics_interval_s:
            self.window = DemandWindow.for_policy(new_policy)
            self._run_start = None
        self.policy_cfg = new_policy
        if self._custom is not None:
            self._custom.pardon()  # a redeploy lifts a quarantine
        if not read_before and self._decision_reads_demand():
            # a fixed size kept no demand window (`sample`): autoscaling starts from an empty
            # one, as a new deployment's does (no scale-down before the look-back is covered)
            self.window = DemandWindow.for_policy(new_policy)
            self._run_start = None
        self.health = self._registry()
        self._follow_in_full = True
        self.kv.set_spec(version, cfg.replica_spec())
        self.kv.set_queue_bound(_queue_bound(cfg))
        self.state.rollout = cfg.rollout
        self.state.set_version(version)

    def _registry(self) -> HealthRegistry:
        # health relayed by routers arrives up to one report interval late (health_registry.py)
        return HealthRegistry(
            self.index,
            self.cfg.health_check_period_s,
            self.cfg.health_check_timeout_s,
            relay_slack_s=self.policy_cfg.metrics_interval_s,
        )

    def follow_records(self, now: float) -> None:
        """Index, registry and metrics track the replica records, by delta: only the records
        changed since the last call are looked at (free when unchanged)."""
        if self._follow_in_full:
            self._changes.clear()
            self.index.sync(self.state.replicas)
            self.health.sync(now)
            self.metrics.set_running(self.state.running_ids())
            self._follow_in_full = False
            return
        if not self._changes:
            return
        changed = take(self._changes)
        replicas = self.state.replicas
        for rid in changed:  # removals first: a freed slot may go to a replica added now
            if rid not in replicas:
                self.index.remove(rid)
        for rid in changed:
            if rid in replicas:
                self.index.add(rid)
        self.health.sync(now)
        self.metrics.update_running(changed, self.state.view().running)

    def sample(self, now: float) -> float:
        """Add one demand sample (also used while rebuilding the window from the stream)."""
        self.follow_records(now)
        self.metrics.expire(now)
        demand = self.metrics.total_demand()
        if self._decision_reads_demand():
            # only a decision that reads demand reads the window: a fixed size keeps none
            # (catching it up at every input was a tenth of a member's CPU at 10,000 apps)
            self._track_run(now, demand)
            self.window.add(now, demand)
        self.sampled_until = now
        return demand

    def _track_run(self, t: float, demand: float) -> None:
        last_t, last_v = self.window.last_time, self.window.last_value
        if last_t is None or demand != last_v or t - last_t > self.window.max_gap_s:
            self._run_start = t

    def window_keep_s(self) -> float:
        return max(self.policy_cfg.look_back_period_s, self.policy_cfg.panic_window_s)

    def catch_up(self, ticks: TickLog) -> None:
        """The ticks this deployment was skipped at: add the samples they would have added and
        run their expiry, so the state is what visiting it at every tick would have left. Each
        sample is today's demand: every input calls this first, and a timer (an expiry) makes
        the tick it fires at a visit, so nothing changed demand since those ticks."""
        last = ticks.last
        if last is None or last <= self.sampled_until:
            return
        last_t = self.window.last_time
        if last_t is not None and self._decision_reads_demand():
            missed = ticks.since(max(self.sampled_until, last_t), self.window_keep_s())
            if missed.size:
                value = self.metrics.total_demand()
                if value != self.window.last_value:
                    self._run_start = float(missed[0])
                max_gap = self.window.max_gap_s
                if float(missed[0]) - last_t > max_gap or ticks.gap_over(missed, max_gap):
                    gaps = np.diff(missed, prepend=last_t)
                    broken = np.flatnonzero(gaps > max_gap)
                    self._run_start = max(self._run_start or -math.inf, float(missed[broken[-1]]))
                self.window.extend_constant(missed, value)
                self.window.trim(last, self.window_keep_s())
        self.metrics.expire(last)
        self.sampled_until = last

    def input_due(self, now: float) -> float | None:
        """After a report or heartbeat was applied at `now`: None if the next tick must visit,
        else when its next visit is due, exactly as a visit would place it. A fixed-size
        deployment whose health facts did not change needs no visit for new metrics: its
        decision does not read them, and its demand samples are caught up when it is next
        visited. The due time may move later than the last visit placed it: what arrived keeps
        the replicas fresh and the sources alive, so the timer goes to when that runs out
        (a timer left at the old bound fired once per freshness window per deployment, at
        10,000 apps hundreds in one tick)."""
        if self._decides and self._decision_reads_demand():
            return None
        self.health.raise_floor()
        self.metrics.refresh_expiry()
        due = self._timers(now)
        return None if due == BUSY else due

    def skip_to(self, t: float) -> None:
        """Ticks up to `t` do not count for this deployment (its app was held: not visited)."""
        self.sampled_until = max(self.sampled_until, t)

    def step(self, now: float, *, hold_verdicts: bool, decide_scale: bool = True) -> StepResult:
        """One visit with the default policy (a custom one is asked between `begin_step` and
        `settle`, so that the core can ask all of a tick's custom policies at once)."""
        out = self.begin_step(now, hold_verdicts=hold_verdicts)
        if decide_scale:
            self._decide(now, out)
        self.end_step(now, out)
        return out

    def begin_step(self, now: float, *, hold_verdicts: bool) -> StepResult:
        """A visit up to the decision: the demand sample and the health verdicts."""
        out = StepResult()
        self.sample(now)
        evaluation = self.health.evaluate(now, hold_verdicts=hold_verdicts)
        out.evaluation = evaluation
        for slot, reason in zip(
            evaluation.unhealthy_slots.tolist(), evaluation.unhealthy_reasons.tolist(), strict=True
        ):
            rid = self.index.id_at(slot)
            if rid is not None:
                label = VerdictReason(reason).label
                out.events += self.state.verdict(rid, label, now)
                if reason in (VerdictReason.EXITED, VerdictReason.GONE):
                    out.events += self.state.forget(rid)  # its process is gone: no drain
        return out

    def end_step(self, now: float, out: StepResult) -> None:
        """The rest of a visit after the decision: replicas follow the target."""
        out.events += self.state.reconcile(now)
        self.follow_records(now)
        self.window.trim(now, self.window_keep_s())
        ev = out.evaluation
        assert ev is not None  # begin_step set it
        self.counts = (ev.stale, ev.candidates)

    def next_visit(self, now: float, out: StepResult, *, decided: bool) -> float:
        """After a visit (`step` and `finish`): when the next visit could come out differently
        with no new input: BUSY (every tick), a time, or inf (only when something arrives).
        Every condition errs towards visiting: a visit too many costs time, a visit too few
        would change a decision."""
        self._decides = decided
        if out.events or out.kv or out.status_changed or out.decision_changed:
            return BUSY
        ev = out.evaluation
        if ev is None or ev.stale or ev.unhealthy_slots.size or ev.held:
            return BUSY
        view = self.state.view()
        if view.old or view.new_count != self.state.target:
            return BUSY  # rollouts and resizes move at the tick
        if view.waiting and self.state.waits_for_room():
            return BUSY  # placement looks at the waiting replicas of the visited deployments
        if decided and self._opaque_policy():
            return BUSY
        if decided and (self.policy.pending != NONE or self.policy.panic_until is not None):
            return BUSY  # a delay or a panic hold runs (its reason text counts the seconds)
        settled = self._run_start is not None and self._run_start + self.window_keep_s() < now
        if decided and self._decision_reads_demand() and not settled:
            return BUSY
        return self._timers(now)

    def _timers(self, now: float) -> float:
        """The earliest timer of a quiet deployment: its health going stale (the registry's
        fast path holds while `now <= floor`, so the timer is the next float after it), a
        handle expiring and an unhealthy hold running out (a hair early: those conditions are
        computed with other roundings, `now - last >= delay`, and a visit early is only a
        visit). A timer already due is looked at again at the next tick (`timer_visit`)."""
        health = self.health.quiet_until()
        if health == -math.inf:
            return BUSY  # a fact changed: the next evaluation is a full one
        due = self.metrics.next_expiry() - EARLY_S
        trouble = self.state.last_trouble
        hold = math.inf
        if trouble is not None and trouble + UNHEALTHY_HOLD_S > now:
            hold = trouble + UNHEALTHY_HOLD_S - EARLY_S
        health = math.nextafter(health, math.inf)
        # a starting replica moves on an input (its lifecycle, a report), or times out here:
        # thousands of apps starting at once are not visited at every tick while they start
        starts = self.state.start_timeouts_due()
        self._start_timer = starts < math.inf and starts <= min(due, hold, health)
        self._health_timer = not self._start_timer and health < min(due, hold)
        self._hold_timer = not self._start_timer and not self._health_timer and hold <= due
        return max(min(due, hold, health, starts), now + EARLY_S)

    def timer_visit(self, now: float, ticks: TickLog) -> float | None:
        """A quiet deployment whose timer fired. If its health or expiry timer fired and finds
        nothing (no replica stale; no handle silent long enough: the expiry timer is a lower
        bound, as reports keep coming), the rest of the step would change nothing: returns its
        next due time without the step (None: run the step). No verdict can come of it: none of
        the facts a verdict needs changed since the last full evaluation (or the health timer
        would not be set)."""
        if self._start_timer:
            return None  # a start may time out: the step's reconcile looks
        if self._health_timer:
            if self.health.quiet_until() == -math.inf:
                return None
            ev = self.health.evaluate(now, hold_verdicts=False)
            if ev.stale or ev.unhealthy_slots.size:
                return None
            self.counts = (ev.stale, ev.candidates)
        elif self._hold_timer:
            return None  # the unhealthy hold ended: the status may change
        else:
            self.metrics.refresh_expiry()  # sources that reported since moved it later
            if self.metrics.next_expiry() - EARLY_S <= now:
                self.catch_up(ticks)  # the ticks before `now` saw the demand before it
                demand = self.metrics.total_demand()
                if self.metrics.expire(now) or self.metrics.total_demand() != demand:
                    return None  # a source left: this tick's sample and decision need the step
        due = self._timers(now)
        return None if due == BUSY else due

    def _decision_reads_demand(self) -> bool:
        """Whether `_decide` can come out differently for a different demand window. At a fixed
        size (min == max) the default policy's first rule decides whatever the demand; a policy
        that reads demand even then must make this True."""
        if self._opaque_policy():
            return True
        return self.policy_cfg.min_replicas != self.policy_cfg.max_replicas

    def _opaque_policy(self) -> bool:
        """A user's own policy (where one is configured) may read anything, the clock too: its
        deployment is visited at every tick, as before the schedule."""
        return self.policy_cfg.policy is not None

    def finish(self, now: float, out: StepResult) -> None:
        """After placement: the KV writes and the status change of this tick."""
        dirty = self.state.take_dirty()
        restamp = self.kv.take_restamp()
        if restamp:
            dirty = sorted({*dirty, *restamp})
        if dirty:
            out.kv, out.members_changed = self.kv.changes(
                self.state.replicas,
                dirty,
                rpc_for=self._rpc_for,
                epoch=self.state.membership_epoch + 1,
            )
            if out.members_changed:
                self.state.membership_epoch += 1
        out.status_changed = self.state.update_status(now)

    def _rpc_for(self, replica_id: str) -> str:
        return self.subjects.rpc(self.app, self.name, replica_id)

    def waiting_for_agent(self) -> list[Waiting]:
        """PENDING replicas without an agent, in start order, with what each asks for (its
        version's resources): a look at the waiting ones only."""
        pending = self.state.view().pending.values()  # not the starting ones a rollout keeps
        per_node = self.cfg.max_replicas_per_node
        out = []
        for r in sorted(pending, key=lambda r: r.order):
            if not r.agent_id:
                spec = self.kv.spec_of(r.version)
                asked = spec.resources if spec is not None else self.cfg.resources
                out.append(Waiting(r.replica_id, (self.app, self.name), asked, per_node))
        return out

    def lose_agent(self, agent_id: str, now: float) -> list[StateEvent]:
        """The agent is gone and its replicas with it: replace them."""
        events: list[StateEvent] = []
        for rid in [r.replica_id for r in self.state.replicas.values() if r.agent_id == agent_id]:
            events += self.state.lost_with_agent(rid, f"agent {agent_id} lost")
        return events

    def _inputs(self, now: float, out: StepResult) -> PolicyInputs:
        pc = self.policy_cfg
        running = len(self.state.view().running)
        mean, short, full = self.window.policy_demand(pc, self.state.target, now)
        out.previous_target = self.state.target
        return PolicyInputs(
            demand_mean=mean,
            demand_short=short,
            window_full=full,
            cold_start=self.state.target == 0 and self.metrics.cold_start_signal(),
            running_replicas=running,
        )

    def _decide(self, now: float, out: StepResult) -> None:
        if self.policy_cfg.policy is not None:
            raise UsageError(f"{self.app}.{self.name} has a custom policy: policy_call, settle")
        self.policy, decision = decide(self.policy_cfg, self.policy, self._inputs(now, out), now)
        self._take(decision, out)

    @property
    def custom_policy(self) -> bool:
        """Whether a custom policy decides (the core asks it between begin_step and settle)."""
        return self.policy_cfg.policy is not None

    def policy_call(self, now: float, out: StepResult) -> PolicyCall | None:
        """After `begin_step`: this tick's call of the custom policy (None: not called)."""
        path = self.policy_cfg.policy
        assert path is not None
        custom = self._custom
        if custom is None or custom.path != path:
            custom = self._custom = CustomPolicy(self.app, self.name, path)
        self._asked = inputs = self._inputs(now, out)
        return custom.call(self.policy_cfg, self.policy, inputs, read_metrics(self.metrics), now)

    def settle(self, now: float, out: StepResult, answer: Answer | None) -> None:
        """The custom policy's answer to `policy_call` decides; then the rest of the visit."""
        custom, inputs = self._custom, self._asked
        assert custom is not None and inputs is not None
        self.policy, decision, events = custom.settle(
            self.policy_cfg, self.policy, inputs, answer, now
        )
        out.events += events
        self._take(decision, out)
        self.end_step(now, out)

    def _take(self, decision: Decision, out: StepResult) -> None:
        out.decision_changed = decision.changed or decision.rule != self._last_rule
        self._last_rule = decision.rule
        self.decision = decision
        self.state.target = decision.target

    # -- outputs -----------------------------------------------------------------------------

    def status_view(self) -> DeploymentStatusView:
        view = self.state.view()
        return DeploymentStatusView(
            status=self.state.status.value,
            message=self.state.message,
            target_replicas=self.state.target,
            running_replicas=len(view.running),
            demand=self.status_demand(),
            healthy_replicas=len(view.running) - view.running_condemned,
            unhealthy_replicas=view.condemned,
            last_decision=self.decision.reason,
        )

    def status_figures(self) -> tuple[object, ...]:
        """What `status_view` is built from besides demand, cheaply: equal figures and close
        demand, an equal view but for the demand figure."""
        st = self.state
        return (st.revision, st.status, st.message, st.target, self.decision.reason)

    def status_demand(self) -> float:
        """The demand figure of `status_view` (summed again only when the metrics changed)."""
        version, demand = self._demand_seen
        if version != self.metrics.version:
            version, demand = self.metrics.version, round(float(self.metrics.total_demand()), 3)
            self._demand_seen = (version, demand)
        return demand

    def replica_states(self) -> dict[str, str]:
        return {rid: r.state.value for rid, r in self.state.replicas.items()}

    def restore(self, targets: list[ReplicaTarget], members: list[Member], now: float) -> None:
        """Take over what a previous owner left in KV: its replicas (RUNNING when they are
        members, else PENDING until they speak), their slots and the membership epoch."""
        running = {m.replica_id: m for m in members}
        by_id = {t.replica_id: t for t in targets}
        # a member without a target is being stopped by its agent: not ours to adopt
        for t in sorted(by_id.values(), key=lambda t: t.order):
            try:
                number = int(t.replica_id.rsplit("-", 1)[-1], 16)
            except ValueError:
                number = 0
            self.state.adopt(t.replica_id, t.version, now, id_number=number, order=t.order)
            rec = self.state.replicas[t.replica_id]
            rec.agent_id, rec.rpc_subject, rec.devices = t.agent_id, t.rpc_subject, t.devices
            member = running.get(t.replica_id)
            if member is not None:
                rec.state = ReplicaState.RUNNING
                rec.http_address = member.http_address or ""
        known = [m for m in members if m.replica_id in by_id]
        self.kv.restore(by_id.values(), known)
        self.state.membership_epoch = max(
            [self.state.membership_epoch, *(m.epoch for m in members)]
        )
        # what we adopted is already in KV: only later changes are written
        self.state.take_dirty()
        self._stray = self.kv.stray_members(members)

    def take_stray(self) -> list[KVChange]:
        """Member keys found on takeover that name no replica we run (deleted once)."""
        stray, self._stray = self._stray, []
        return stray


def read_metrics(store: DeploymentMetrics) -> tuple[Mapping[str, CustomMetric], float]:
    """The custom metrics and the queued requests of one deployment, as a policy sees them."""
    out: dict[str, CustomMetric] = {}
    for name in store.custom_names():
        summary = store.custom_summary(name)
        if summary is not None:
            total, n = summary
            out[name] = CustomMetric(total, total / n, n)
    return MappingProxyType(out), store.queued()


def _queue_bound(cfg: DeploymentConfig) -> int | None:
    """What the members tell routers: the deployment's bound, or None (-1: theirs applies)."""
    return cfg.max_queued_requests if cfg.max_queued_requests > 0 else None

"""Everything the controller keeps for one deployment, and its per-tick decision.

How it works: a `ManagedDeployment` bundles the pure pieces (DeploymentState, ReplicaIndex,
DeploymentMetrics, HealthRegistry, DemandWindow, the policy state) and `step(now, hold_verdicts)`
runs one control tick over them in a fixed order:

    index/registry/metrics follow the replica records -> expire silent handles -> sample demand
    -> health verdicts (replace) -> policy decides the target -> reconcile replicas
    -> (after placement) per-replica KV deltas and the status

Only changes come out: the puts and deletes of the replicas whose records changed (kv_delta.py)
and a status change, so a steady deployment costs no KV writes and one replaced replica a few.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.appconfig import AutoscalingConfig, DeploymentConfig
from shared.kv.membership import Member
from shared.kv.status import DeploymentStatusView
from shared.kv.targets import ReplicaTarget
from shared.subjects import Subjects

from .custom_policy import CustomPolicy, read_metrics
from .demand_window import DemandWindow
from .deployment_state import DeploymentState, ReplicaState, StateEvent
from .health_registry import HealthEvaluation, HealthRegistry, VerdictReason
from .kv_delta import KVChange, KVDelta
from .metrics_store import DeploymentMetrics
from .policy import Decision, PolicyInputs, PolicyState, decide, initial_state
from .records import take
from .replica_index import ReplicaIndex


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
        self._changes = self.state.channel()
        """Records changed since the index, registry and metrics last followed them."""
        self._follow_in_full = True
        """The next follow looks at every record (first time, or a new registry)."""
        self._last_rule = ""
        self._custom: CustomPolicy | None = None
        """The custom policy of `policy_cfg.policy`, loaded at its first decision."""

    @property
    def name(self) -> str:
        return self.cfg.name

    def reconfigure(self, cfg: DeploymentConfig, version: str, now: float) -> None:
        """A new config or version: keep replicas and history, roll if the version changed."""
        self.cfg = cfg
        new_policy = cfg.policy
        if new_policy.metrics_interval_s != self.policy_cfg.metrics_interval_s:
            self.window = DemandWindow.for_policy(new_policy)
        self.policy_cfg = new_policy
        self.health = self._registry()
        self._follow_in_full = True
        self.kv.set_spec(version, cfg.replica_spec())
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
        self.window.add(now, demand)
        return demand

    def step(self, now: float, *, hold_verdicts: bool, decide_scale: bool = True) -> StepResult:
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
                    self.state.forget(rid)  # its process is gone: nothing left to drain
        if decide_scale:
            self._decide(now, out)
        out.events += self.state.reconcile(now)
        self.follow_records(now)
        self.window.trim(
            now, max(self.policy_cfg.look_back_period_s, self.policy_cfg.panic_window_s)
        )
        return out

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

    def waiting_for_agent(self) -> list[str]:
        """PENDING replicas without an agent, in start order (a look at the waiting ones only)."""
        waiting = self.state.view().waiting.values()
        return [
            r.replica_id
            for r in sorted(waiting, key=lambda r: r.order)
            if r.state is ReplicaState.PENDING and not r.agent_id
        ]

    def lose_agent(self, agent_id: str, now: float) -> list[StateEvent]:
        """The agent is gone and its replicas with it: replace them."""
        events: list[StateEvent] = []
        for rid in [r.replica_id for r in self.state.replicas.values() if r.agent_id == agent_id]:
            events += self.state.lost_with_agent(rid, f"agent {agent_id} lost")
        return events

    def _decide(self, now: float, out: StepResult) -> None:
        pc = self.policy_cfg
        running = len(self.state.view().running)
        mean, short, full = self.window.policy_demand(pc, self.state.target, now)
        inputs = PolicyInputs(
            demand_mean=mean,
            demand_short=short,
            window_full=full,
            cold_start=self.state.target == 0 and self.metrics.cold_start_signal(),
            running_replicas=running,
        )
        out.previous_target = self.state.target
        if pc.policy is None:
            self.policy, decision = decide(pc, self.policy, inputs, now)
        else:
            custom = self._custom
            if custom is None or custom.path != pc.policy:
                custom = self._custom = CustomPolicy(self.app, self.name, pc.policy)
            metrics = read_metrics(self.metrics)
            self.policy, decision, events = custom.decide(pc, self.policy, inputs, metrics, now)
            out.events += events
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
            demand=round(float(self.metrics.total_demand()), 3),
            healthy_replicas=len(view.running) - view.running_condemned,
            unhealthy_replicas=view.condemned,
            last_decision=self.decision.reason,
        )

    def replica_states(self) -> dict[str, str]:
        return {rid: r.state.value for rid, r in self.state.replicas.items()}

    def restore(self, targets: list[ReplicaTarget], members: list[Member], now: float) -> None:
        """Take over what a previous owner left in KV: its replicas (RUNNING when they are
        members, else PENDING until they speak), their slots and the membership epoch."""
        running = {m.replica_id for m in members}
        by_id = {t.replica_id: t for t in targets}
        # a member without a target is being stopped by its agent: not ours to adopt
        for t in sorted(by_id.values(), key=lambda t: t.order):
            try:
                number = int(t.replica_id.rsplit("-", 1)[-1], 16)
            except ValueError:
                number = 0
            self.state.adopt(t.replica_id, t.version, now, id_number=number, order=t.order)
            rec = self.state.replicas[t.replica_id]
            rec.agent_id, rec.rpc_subject = t.agent_id, t.rpc_subject
            if t.replica_id in running:
                rec.state = ReplicaState.RUNNING
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

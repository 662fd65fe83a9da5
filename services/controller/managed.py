"""Everything the controller keeps for one deployment, and its per-tick decision.

How it works: a `ManagedDeployment` bundles the pure pieces (DeploymentState, ReplicaIndex,
DeploymentMetrics, HealthRegistry, DemandWindow, the policy state) and `step(now, hold_verdicts)`
runs one control tick over them in a fixed order:

    index/registry/metrics follow the replica records -> expire silent handles -> sample demand
    -> health verdicts (replace) -> policy decides the target -> reconcile replicas
    -> membership / targets / status outputs

Only changes come out (a new membership epoch, a new target set, a status change), so a steady
deployment costs no KV writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.appconfig import AutoscalingConfig, DeploymentConfig
from shared.control import DeploymentStatusView, Member, Membership, ReplicaTarget
from shared.subjects import Subjects

from .demand_window import DemandWindow
from .deployment_state import DeploymentState, ReplicaState, StateEvent
from .health_registry import HealthEvaluation, HealthRegistry, VerdictReason
from .metrics_store import DeploymentMetrics
from .policy import Decision, PolicyInputs, PolicyState, decide, initial_state
from .replica_index import ReplicaIndex


@dataclass(slots=True)
class StepResult:
    events: list[StateEvent] = field(default_factory=list)
    membership: Membership | None = None
    targets_changed: bool = False
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
        self._last_targets: tuple[ReplicaTarget, ...] = ()
        self._targets: tuple[int, tuple[ReplicaTarget, ...]] = (-1, ())
        self._followed = -1
        """The records' revision the index, registry and metrics last followed."""
        self._last_rule = ""

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
        self._followed = -1
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
        """Index, registry and metrics track the replica records (free when unchanged)."""
        revision = self.state.revision
        if revision == self._followed:
            return
        self.index.sync(self.state.replicas)
        self.health.sync(now)
        self.metrics.set_running(self.state.running_ids())
        self._followed = revision

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

    def finish(self, now: float, out: StepResult, *, owner_epoch: int = 0) -> None:
        """After placement: the outputs that changed this tick."""
        if self.state.update_membership():
            out.membership = self.membership(owner_epoch)
        targets = self.targets()
        if targets is not self._last_targets and targets != self._last_targets:
            self._last_targets = targets
            out.targets_changed = True
        out.status_changed = self.state.update_status(now)

    def waiting_for_agent(self) -> list[str]:
        return [
            r.replica_id
            for r in sorted(self.state.replicas.values(), key=lambda r: r.order)
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
        mean, full = self.window.mean_and_full(now, pc.look_back_period_s)
        inputs = PolicyInputs(
            demand_mean=mean,
            # read only in panic mode: not computed otherwise (a window scan per tick)
            demand_short=self.window.mean(now, pc.panic_window_s) if pc.panic_mode else None,
            window_full=full,
            cold_start=self.state.target == 0 and self.metrics.cold_start_signal(),
            running_replicas=running,
        )
        out.previous_target = self.state.target
        self.policy, decision = decide(pc, self.policy, inputs, now)
        out.decision_changed = decision.changed or decision.rule != self._last_rule
        self._last_rule = decision.rule
        self.decision = decision
        self.state.target = decision.target

    # -- outputs -----------------------------------------------------------------------------

    def membership(self, owner_epoch: int = 0) -> Membership:
        members = tuple(Member(rid, subj) for rid, subj in self.state.membership)
        return Membership(self.app, self.name, self.state.membership_epoch, members, owner_epoch)

    def targets(self) -> tuple[ReplicaTarget, ...]:
        revision, cached = self._targets
        if revision == self.state.revision:
            return cached
        targets = tuple(
            ReplicaTarget(
                r.replica_id,
                r.version,
                r.state.value,
                r.agent_id,
                r.rpc_subject or self.subjects.rpc(self.app, self.name, r.replica_id),
            )
            for r in self.state.view().by_order
        )
        self._targets = (self.state.revision, targets)
        return targets

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

    def restore_replica(self, t: ReplicaTarget, now: float) -> None:
        try:
            number = int(t.replica_id.rsplit("-", 1)[-1], 16)
        except ValueError:
            number = 0
        self.state.adopt(t.replica_id, t.version, now, id_number=number)
        rec = self.state.replicas[t.replica_id]
        rec.agent_id, rec.rpc_subject = t.agent_id, t.rpc_subject
        if t.state in (s.value for s in ReplicaState):
            rec.state = ReplicaState(t.state)

"""Replica records, reconcile, membership epochs and deployment status transitions."""

from __future__ import annotations

from services.controller.deployment_state import (
    MAX_START_FAILURES,
    STARTUP_TIMEOUT_S,
    UNHEALTHY_HOLD_S,
    DeploymentState,
    DeploymentStatus,
    ReplicaState,
    app_status,
)
from services.controller.kv_delta import KVDelta, PutDoc
from shared.kv.membership import Member
from shared.replicaspec import ReplicaSpec

S = DeploymentStatus


def new(target: int = 0, version: str = "v1") -> DeploymentState:
    d = DeploymentState("app", "dep", version, id_prefix="dep-x")
    d.target = target
    return d


class Routable:
    """The routable set as the controller derives it (managed.finish): the records changed since
    the last look (`take_dirty`) through the KV delta; the epoch grows when the set changed."""

    def __init__(self, d: DeploymentState) -> None:
        self.d = d
        self.kv = KVDelta(d.app, d.deployment)
        self.looked_at: set[str] = set()
        for v in ("v1", "v2"):
            self.kv.set_spec(v, ReplicaSpec("m:X"))

    def update(self) -> bool:
        dirty = self.d.take_dirty()
        self.looked_at = set(dirty)
        _, changed = self.kv.changes(
            self.d.replicas, sorted(dirty), rpc_for=str, epoch=self.d.membership_epoch + 1
        )
        if changed:
            self.d.membership_epoch += 1
        return changed

    @property
    def members(self) -> list[str]:
        return sorted(self.kv.members, key=lambda rid: self.d.replicas[rid].order)


def bring_up(d: DeploymentState, now: float) -> list[str]:
    """Every pending replica starts and becomes ready."""
    ids = [r.replica_id for r in d.replicas.values() if r.state is ReplicaState.PENDING]
    for rid in ids:
        d.on_lifecycle(rid, "starting", now, rpc_subject=f"fp.v1.rpc.app.dep.{rid}")
        d.on_lifecycle(rid, "ready", now)
    return ids


def test_cold_start_is_updating_then_healthy_with_membership() -> None:
    d = new(target=2)
    d.reconcile(0.0)
    assert len(d.replicas) == 2 and all(
        r.state is ReplicaState.PENDING for r in d.replicas.values()
    )
    d.update_status(0.0)
    assert d.status is S.UPDATING
    routable = Routable(d)
    assert not routable.update()  # nobody routable yet
    ids = bring_up(d, 1.0)
    assert routable.update() and d.membership_epoch == 1
    assert routable.members == ids
    d.update_status(1.0)
    assert d.status is S.HEALTHY
    assert d.take_dirty() == []  # a steady deployment has nothing to look at
    assert not routable.update() and d.membership_epoch == 1  # unchanged: same epoch


def test_ids_are_deterministic() -> None:
    a, b = new(3), new(3)
    a.reconcile(0.0)
    b.reconcile(5.0)
    assert list(a.replicas) == list(b.replicas) == ["dep-x-1", "dep-x-2", "dep-x-3"]


def test_created_at_zero_is_healthy_and_waking_is_upscaling_not_updating() -> None:
    d = new(target=0)
    d.reconcile(0.0)
    d.update_status(0.0)
    assert d.status is S.HEALTHY  # target 0 reached: serviceable at zero
    d.target = 1
    d.reconcile(1.0)
    d.update_status(1.0)
    assert d.status is S.UPSCALING
    bring_up(d, 2.0)
    d.update_status(2.0)
    assert d.status is S.HEALTHY


def test_scale_down_drains_pending_first_then_newest_running() -> None:
    d = new(target=3)
    d.reconcile(0.0)
    routable = Routable(d)
    bring_up(d, 1.0)
    d.target = 4
    d.reconcile(2.0)  # one pending
    d.target = 2
    d.reconcile(3.0)
    draining = sorted(r.replica_id for r in d.replicas.values() if r.state is ReplicaState.DRAINING)
    assert draining == ["dep-x-3", "dep-x-4"]  # the pending one, then the newest running
    routable.update()
    assert routable.members == ["dep-x-1", "dep-x-2"]
    d.update_status(3.0)
    assert d.status is S.DOWNSCALING
    d.on_lifecycle("dep-x-3", "exited", 4.0)
    d.on_lifecycle("dep-x-4", "exited", 4.0)
    d.update_status(4.0)
    assert d.status is S.HEALTHY and d.start_failures == 0


def test_unhealthy_verdict_replaces_the_replica() -> None:
    d = new(target=2)
    d.reconcile(0.0)
    routable = Routable(d)
    bring_up(d, 1.0)
    routable.update()
    d.update_status(1.0)
    events = d.verdict("dep-x-1", "3 consecutive failed checks", 10.0)
    assert [e.kind for e in events] == ["replica_unhealthy"]
    assert d.verdict("dep-x-1", "again", 11.0) == []  # once
    d.reconcile(10.0)
    assert "dep-x-3" in d.replicas  # replacement
    assert routable.update()
    assert routable.members == ["dep-x-2"]
    assert routable.looked_at == {"dep-x-1", "dep-x-3"}  # the replaced one and its successor
    d.update_status(10.0)
    assert d.status is S.UNHEALTHY
    bring_up(d, 12.0)
    d.update_status(12.0)
    assert d.status is S.HEALTHY  # target met again with healthy replicas


def test_crash_while_running_is_unhealthy_until_replaced() -> None:
    d = new(target=1)
    d.reconcile(0.0)
    bring_up(d, 1.0)
    d.update_status(1.0)
    assert [e.kind for e in d.on_lifecycle("dep-x-1", "exited", 5.0)] == ["replica_crashed"]
    d.reconcile(5.0)
    d.update_status(5.0)
    assert d.status is S.UNHEALTHY
    d.update_status(5.0 + UNHEALTHY_HOLD_S)
    assert d.status is S.UPSCALING  # trouble is old news, still below target


def test_repeated_start_failures_are_deploy_failed_and_stop_retrying() -> None:
    d = new(target=1)
    for i in range(MAX_START_FAILURES):
        d.reconcile(float(i))
        (rid,) = [r.replica_id for r in d.replicas.values()]
        d.on_lifecycle(rid, "starting", float(i))
        d.on_lifecycle(rid, "exited", float(i) + 0.5)
    d.update_status(10.0)
    assert d.status is S.DEPLOY_FAILED
    d.reconcile(11.0)
    assert d.replicas == {}  # no more retries
    d.set_version("v2")  # a redeploy resets
    d.reconcile(12.0)
    assert len(d.replicas) == 1


def test_startup_timeout_counts_as_a_start_failure() -> None:
    d = new(target=1)
    d.reconcile(0.0)
    d.reconcile(STARTUP_TIMEOUT_S - 0.1)
    assert d.start_failures == 0
    events = d.reconcile(STARTUP_TIMEOUT_S)
    assert [e.kind for e in events][:2] == ["start_timeout", "replica_added"]
    assert d.start_failures == 1


def test_rolling_update_keeps_capacity() -> None:
    d = new(target=2)
    d.reconcile(0.0)
    bring_up(d, 1.0)
    d.update_status(1.0)
    d.set_version("v2")
    for step in range(6):
        now = 2.0 + step
        d.reconcile(now)
        running = [r for r in d.replicas.values() if r.state is ReplicaState.RUNNING]
        assert len(running) >= 2  # never below target while rolling
        d.update_status(now)
        bring_up(d, now + 0.5)
        for r in list(d.replicas.values()):
            if r.state is ReplicaState.DRAINING:
                d.on_lifecycle(r.replica_id, "exited", now + 0.6)
    assert {r.version for r in d.replicas.values()} == {"v2"}
    assert len(d.replicas) == 2
    d.update_status(9.0)
    assert d.status is S.HEALTHY


def test_unknown_replica_lifecycle_is_reported_not_adopted() -> None:
    d = new(target=1)
    events = d.on_lifecycle("stranger", "ready", 0.0)
    assert events[0].kind == "unknown_replica" and "stranger" not in d.replicas


def test_app_status_from_deployments() -> None:
    assert app_status([S.HEALTHY, S.UPSCALING]) == "RUNNING"
    assert app_status([S.HEALTHY, S.UPDATING]) == "DEPLOYING"
    assert app_status([S.UNHEALTHY, S.UPDATING]) == "UNHEALTHY"
    assert app_status([S.DEPLOY_FAILED, S.UNHEALTHY]) == "DEPLOY_FAILED"
    assert app_status([S.HEALTHY], deleting=True) == "DELETING"


def test_replicas_lost_with_their_agent_are_replaced_without_unhealthy() -> None:
    """Killing the agent that hosted the only replica made the deployment UNHEALTHY at zero, and
    the proxy deregistered a healthy app (seen on a real Docker engine); a crash still counts."""
    d = new(target=1)
    d.reconcile(0.0)
    (rid,) = bring_up(d, 1.0)
    d.update_status(1.0)
    assert d.status is S.HEALTHY
    events = d.lost_with_agent(rid, "agent a1 lost")
    assert [e.kind for e in events] == ["replica_unhealthy"] and rid not in d.replicas
    d.reconcile(2.0)
    d.update_status(2.0)
    assert d.status is S.UPSCALING, d.message
    (new_rid,) = bring_up(d, 3.0)
    d.on_lifecycle(new_rid, "exited", 4.0)  # the replacement crashes: that is trouble
    d.reconcile(4.0)
    d.update_status(4.0)
    assert d.status is S.UNHEALTHY


def test_a_member_carries_its_versions_max_ongoing_requests() -> None:
    d = new(target=1)
    d.reconcile(0.0)
    kv = KVDelta(d.app, d.deployment)
    kv.set_spec("v1", ReplicaSpec("m:X", max_ongoing_requests=3))
    (rid,) = bring_up(d, 1.0)
    out, changed = kv.changes(d.replicas, [rid], rpc_for=str, epoch=1)
    members = [c.doc for c in out if isinstance(c, PutDoc) and isinstance(c.doc, Member)]
    assert changed and [m.max_ongoing_requests for m in members] == [3]

"""Rolling updates in the deployment state: the surge and the floor, target changes and a new
version mid-rollout, and a property test over random event sequences."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from services.controller.deployment_state import (
    ROLLOUT_STEP,
    DeploymentState,
    ReplicaRecord,
    ReplicaState,
)
from shared.rollout import RolloutConfig


def deployment(target: int, rollout: RolloutConfig) -> DeploymentState:
    d = DeploymentState("app", "dep", "v1", id_prefix="dep-x")
    d.target, d.rollout = target, rollout
    d.reconcile(0.0)
    ready(d, d.replicas, 0.0)
    d.update_status(0.0)
    return d


def ready(d: DeploymentState, ids: object, now: float) -> None:
    for rid in list(ids):  # type: ignore[call-overload]
        if d.replicas[rid].state in (ReplicaState.PENDING, ReplicaState.STARTING):
            d.on_lifecycle(rid, "starting", now)
            d.on_lifecycle(rid, "ready", now)


def exit_drained(d: DeploymentState, now: float) -> None:
    for rid in [r for r, rec in d.replicas.items() if rec.state is ReplicaState.DRAINING]:
        d.on_lifecycle(rid, "exited", now)


@dataclass
class Counts:
    routable: int
    live: int
    new_waiting: int
    old: int
    new: int


def counts(d: DeploymentState) -> Counts:
    v = d.view()
    return Counts(
        routable=len(v.running) - v.running_condemned,
        live=len(v.live),
        new_waiting=v.waiting_current,
        old=len(v.old),
        new=v.new_count,
    )


def waiting(d: DeploymentState, version: str) -> list[str]:
    return [
        rid
        for rid, r in d.replicas.items()
        if r.version == version and r.state in (ReplicaState.PENDING, ReplicaState.STARTING)
    ]


def roll_to_the_end(d: DeploymentState, now: float, floor: int) -> tuple[int, float]:
    """Reconcile, every new replica becomes ready, drained ones exit; returns (ticks, now)."""
    ticks = 0
    while d.view().old or counts(d).new_waiting or counts(d).new != d.target:
        d.reconcile(now)
        assert counts(d).routable >= floor
        ready(d, waiting(d, d.version), now + 0.05)
        exit_drained(d, now + 0.06)
        now += 0.1
        ticks += 1
        assert ticks < 10 * d.target + 10, "the rollout must complete"
    return ticks, now


def test_default_surge_one_never_below_target_one_in_flight() -> None:
    d = deployment(8, RolloutConfig())
    d.set_version("v2")
    now = 1.0
    for _ in range(40):
        d.reconcile(now)
        c = counts(d)
        assert c.routable >= 8 and c.new_waiting <= 1 and c.live <= 9
        ready(d, waiting(d, "v2"), now + 0.05)
        exit_drained(d, now + 0.06)
        now += 0.1
    assert not d.view().old and counts(d).new == 8 == counts(d).routable


def test_surge_starts_that_many_at_once_and_retires_as_they_run() -> None:
    d = deployment(16, RolloutConfig(max_surge="25%"))
    d.set_version("v2")
    d.reconcile(1.0)
    c = counts(d)
    assert c.new_waiting == 4 and c.routable == 16 and c.live == 20
    first = waiting(d, "v2")
    ready(d, first[:3], 1.05)  # three of four become ready: three old ones go, three new start
    d.reconcile(1.1)
    c = counts(d)
    assert c.routable == 16 and c.old == 13 and c.new_waiting == 4 and c.live == 20
    drained = [r for r in d.replicas.values() if r.state is ReplicaState.DRAINING]
    assert [r.version for r in drained] == ["v1"] * 3
    assert sorted(r.order for r in drained) == [1, 2, 3]  # the oldest first
    ticks, _ = roll_to_the_end(d, 1.2, floor=16)
    assert ticks <= 6  # 16 / 4 waves, give or take the partial one


def test_a_large_surge_is_reached_over_ticks_of_bounded_work() -> None:
    d = deployment(1000, RolloutConfig(max_surge="50%", max_unavailable="20%"))
    d.set_version("v2")
    events = d.reconcile(1.0)
    kinds = [e.kind for e in events]
    assert kinds.count("replica_draining") == ROLLOUT_STEP  # of the 200 the floor allows
    assert kinds.count("replica_added") == ROLLOUT_STEP
    d.reconcile(1.1)
    c = counts(d)
    assert c.routable == 1000 - min(200, 2 * ROLLOUT_STEP)
    assert c.new_waiting == 2 * ROLLOUT_STEP  # (the surge of 500 is further off)
    roll_to_the_end(d, 1.2, floor=800)


def test_max_unavailable_drains_before_successors_run_but_never_below_the_floor() -> None:
    d = deployment(10, RolloutConfig(max_surge=0, max_unavailable=2))
    d.set_version("v2")
    d.reconcile(1.0)
    c = counts(d)
    assert c.routable == 8 and c.live == 10 and c.new_waiting == 2
    d.reconcile(1.1)  # nothing new ran: nothing more may go
    assert counts(d).routable == 8 and counts(d).live == 10
    roll_to_the_end(d, 1.2, floor=8)


def test_a_new_version_mid_rollout_stops_the_starting_ones_and_rolls_on() -> None:
    d = deployment(12, RolloutConfig(max_surge=4))
    d.set_version("v2")
    d.reconcile(1.0)
    v2 = waiting(d, "v2")
    ready(d, v2[:2], 1.05)
    d.reconcile(1.1)  # 2 v2 running, 4 v2 starting, 10 v1
    assert counts(d).routable == 12
    d.set_version("v3")
    d.reconcile(1.2)
    states = {rid: r.state for rid, r in d.replicas.items() if r.version == "v2"}
    assert sorted(s.value for s in states.values()).count("DRAINING") == 4  # the starting ones
    assert counts(d).routable == 12 and len(waiting(d, "v3")) == 4
    roll_to_the_end(d, 1.3, floor=12)
    assert {r.version for r in d.replicas.values()} == {"v3"}


def test_target_changes_mid_rollout_move_both_bounds() -> None:
    d = deployment(8, RolloutConfig(max_surge=2))
    d.set_version("v2")
    d.reconcile(1.0)
    d.target = 12  # the autoscaler scales up: room for 4 more at once, nothing retires
    d.reconcile(1.1)
    c = counts(d)
    assert c.routable == 8 and c.new_waiting == 6 and c.live == 14
    ready(d, waiting(d, "v2"), 1.15)
    d.target = 4  # and down again: old ones go as far as the floor allows, new above it too
    d.reconcile(1.2)
    c = counts(d)
    assert c.routable >= 4 and c.new == 4 and c.old == 0
    roll_to_the_end(d, 1.3, floor=4)
    assert counts(d).routable == 4


def test_to_zero_mid_rollout_drains_everything() -> None:
    d = deployment(4, RolloutConfig(max_surge=2))
    d.set_version("v2")
    d.reconcile(1.0)
    d.target = 0
    d.reconcile(1.1)
    assert counts(d).live == 0


def test_a_rollout_tick_looks_at_no_replica_it_does_not_change() -> None:
    """O(changed): once the retire queue is sorted, a tick of a 5,000-replica rollout reads the
    counts and the queue's end: no pass over the records or over the live, old or running ones
    (the waiting ones, a handful, are looked at for start timeouts)."""
    d = deployment(5000, RolloutConfig())
    d.set_version("v2")
    d.reconcile(1.0)
    ready(d, waiting(d, "v2"), 1.05)
    d.reconcile(1.1)  # the first retirement sorts the queue, once
    [rid] = waiting(d, "v2")
    ready(d, [rid], 1.15)
    changes = d.channel()
    v = d.view()
    tables = [Counting(d.replicas), Counting(v.live), Counting(v.old), Counting(v.running)]
    d.replicas, v.live, v.old, v.running = tables  # type: ignore[assignment]
    d.reconcile(1.2)
    assert len(changes) == 2  # one old drained, one new added
    assert [t.iterated for t in tables] == [0, 0, 0, 0]


class Counting(dict[str, ReplicaRecord]):
    """A records table that counts passes over it."""

    iterated = 0

    def values(self):  # type: ignore[no-untyped-def, override]
        self.iterated += 1
        return super().values()

    def items(self):  # type: ignore[no-untyped-def, override]
        self.iterated += 1
        return super().items()

    def __iter__(self):  # type: ignore[no-untyped-def]
        self.iterated += 1
        return super().__iter__()


AMOUNT = st.one_of(st.integers(0, 6), st.sampled_from(["0%", "10%", "25%", "50%", "100%"]))
EVENT = st.sampled_from(["ready_some", "exit_drained", "target", "version", "crash", "tick"])


@settings(max_examples=150, deadline=None)
@given(
    target=st.integers(1, 24),
    surge=AMOUNT,
    unavailable=AMOUNT,
    data=st.data(),
)
def test_property_floor_surge_and_completion(
    target: int, surge: int | str, unavailable: int | str, data: st.DataObject
) -> None:
    """Whatever happens between ticks (replicas becoming ready in any order, drained ones
    leaving, the target moving, new versions, crashes), a tick never takes the routable
    replicas below `target - max_unavailable` (nor lower than they already were), starts a
    replica only within `target + max_surge` live ones, keeps new ones in flight within surge +
    unavailable while the target holds, and once events stop the rollout completes."""
    if surge in (0, "0%") and unavailable in (0, "0%"):
        surge = 1
    cfg = RolloutConfig(surge, unavailable)
    d = deployment(target, cfg)
    d.set_version("v2")
    versions, now = 2, 1.0
    moved = False
    for event in data.draw(st.lists(EVENT, max_size=40)):
        if event == "ready_some":
            ids = waiting(d, d.version) + waiting(d, "v1")
            ready(d, data.draw(st.lists(st.sampled_from(ids), unique=True)) if ids else [], now)
        elif event == "exit_drained":
            exit_drained(d, now)
        elif event == "target":
            d.target = data.draw(st.integers(0, 24))
            moved = True
        elif event == "version":
            versions += 1
            d.set_version(f"v{versions}")
        elif event == "crash":
            running = sorted(d.view().running)
            if running:
                d.on_lifecycle(data.draw(st.sampled_from(running)), "exited", now)
            moved = True
        before = counts(d)
        surge_n, unavailable_n = cfg.budget(d.target)
        events = d.reconcile(now)
        after = counts(d)
        assert after.routable >= min(before.routable, d.target - unavailable_n)
        if any(e.kind == "replica_added" for e in events):
            assert after.live <= d.target + surge_n
        if not moved:
            assert after.routable >= d.target - unavailable_n
            assert after.new_waiting <= surge_n + unavailable_n
        now += 0.1
    d.start_failures = 0  # (crashes of starting replicas count as failed starts)
    roll_to_the_end(d, now, floor=0)
    c = counts(d)
    assert c.old == 0 and c.new == d.target == c.routable


def test_placement_during_a_rollout_counts_agent_load_by_delta() -> None:
    """With node agents, each new replica of a rollout is placed by the agents' load, which the
    placement's ledger keeps by delta (a pass over every replica at every placing tick was the
    rollout's cost): the load always equals a full count, and no agent goes over its
    capacity."""
    from collections import Counter

    from tests.unit.test_controller_core import Sim, agent, app_with

    base = app_with(num_replicas=6)
    dep = replace(base.deployments[0], rollout=RolloutConfig(max_surge=2))
    sim = Sim(replace(base, deployments=(dep,)))
    m = sim.core.deployments[("shop", "Model")]
    for _ in range(2):
        sim.core.on_agent(agent("a", 4), sim.t)
        sim.core.on_agent(agent("b", 4), sim.t)
        sim.tick()
    sim.start_all()
    sim.core.set_apps({"shop": replace(sim.core.apps["shop"], version="v2")}, sim.t)
    for _ in range(60):
        sim.core.on_agent(agent("a", 4), sim.t)
        sim.core.on_agent(agent("b", 4), sim.t)
        for rid, rec in list(m.state.replicas.items()):
            if rec.state is ReplicaState.DRAINING:
                sim.lifecycle(rid, "exited")
        sim.start_all()
        full = Counter(r.agent_id for r in m.state.replicas.values() if r.agent_id)
        ledger = sim.core.placement.ledger
        held = Counter(ledger.ids[a.row] for a in ledger.assigned.values())
        assert held == full
        assert all(n <= 4 for n in full.values())
    assert {r.version for r in m.state.replicas.values()} == {"v2"}
    assert len(sim.membership) == 6


def test_start_timeouts_come_on_time_and_the_waiting_are_looked_at_only_then() -> None:
    from services.controller.deployment_state import STARTUP_TIMEOUT_S

    d = DeploymentState("app", "dep", "v1", id_prefix="dep-x")
    d.target = 2
    d.reconcile(0.0)
    late = sorted(d.replicas)[1]
    d.on_lifecycle(late, "starting", 50.0)  # its wait starts again at 50
    waiting_ = Counting(d.view().waiting)
    d.view().waiting = waiting_
    for t in (1.0, 60.0, STARTUP_TIMEOUT_S - 0.1):
        assert d.reconcile(t) == [] and waiting_.iterated == 0
    events = d.reconcile(STARTUP_TIMEOUT_S)
    assert [e.kind for e in events][:1] == ["start_timeout"] and late in d.replicas
    assert [e.replica_id for e in events if e.kind == "start_timeout"] != [late]
    kinds = [e.kind for e in d.reconcile(50.0 + STARTUP_TIMEOUT_S)]
    assert kinds.count("start_timeout") == 1 and late not in d.replicas

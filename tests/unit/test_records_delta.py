"""The controller's per-deployment views kept by delta equal the same views computed in full:
record classes and counts (records.py), the replica index's change log, the health registry's and
the metrics store's view of which replicas exist and run (managed.follow_records). And a changed
replica costs work for that replica only."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.controller.deployment_state import DeploymentState
from services.controller.managed import ManagedDeployment
from services.controller.records import RecordSets, ReplicaState
from services.controller.replica_index import ReplicaIndex
from shared.appconfig import DeploymentConfig
from shared.subjects import Subjects

CFG = DeploymentConfig("Model", "services.examples.echo:Echo", num_replicas=0)
OPS = st.lists(
    st.tuples(
        st.sampled_from(["grow", "ready", "verdict", "exit", "drain", "version", "starting"]),
        st.integers(0, 60),
    ),
    max_size=80,
)


def apply(d: DeploymentState, op: str, n: int, t: float) -> None:
    rids = sorted(d.replicas)
    rid = rids[n % len(rids)] if rids else None
    if op == "grow":
        d.target = n % 15
        d.reconcile(t)
    elif op == "version":
        d.set_version(f"v{n % 3}")
        d.reconcile(t)
    elif rid is not None:
        event = {"ready": "ready", "exit": "exited", "drain": "draining", "starting": "starting"}
        if op == "verdict":
            d.verdict(rid, "unhealthy", t)
        else:
            d.on_lifecycle(rid, event[op], t)


def full(d: DeploymentState) -> RecordSets:
    sets = RecordSets(d.version)
    sets.update(d.replicas, d.replicas, d.version)
    return sets


def same(a: RecordSets, b: RecordSets) -> None:
    for name in ("live", "waiting", "pending", "running", "old"):
        assert set(getattr(a, name)) == set(getattr(b, name)), name
    for name in (
        "running_current",
        "running_condemned",
        "condemned",
        "draining_clean",
        "waiting_current",
    ):
        assert getattr(a, name) == getattr(b, name), name
    assert [r.replica_id for r in a.by_order()] == [r.replica_id for r in b.by_order()]


@settings(max_examples=80, deadline=None)
@given(OPS)
def test_record_sets_by_delta_equal_the_full_pass(ops: list[tuple[str, int]]) -> None:
    d = DeploymentState("app", "Model", "v0", id_prefix="app-Model-0000")
    for t, (op, n) in enumerate(ops):
        apply(d, op, n, float(t))
        same(d.view(), full(d))


@settings(max_examples=60, deadline=None)
@given(OPS)
def test_follow_by_delta_equals_following_in_full(ops: list[tuple[str, int]]) -> None:
    m = ManagedDeployment("app", CFG, "v0", 0.0, id_prefix="app-Model-0000", subjects=Subjects())
    for t, (op, n) in enumerate(ops):
        apply(m.state, op, n, float(t))
        m.follow_records(float(t))
        # a fresh deployment following the same records in full is the reference
        ref = ManagedDeployment(
            "app", CFG, m.state.version, 0.0, id_prefix="x", subjects=Subjects()
        )
        ref.state.replicas = m.state.replicas
        ref.follow_records(float(t))
        assert set(m.index.ids()) == set(m.state.replicas) == set(ref.index.ids())
        assert (
            m.metrics.running_ids()
            == ref.metrics.running_ids()
            == sorted(rid for rid, r in m.state.replicas.items() if r.state is ReplicaState.RUNNING)
        )
        for rid in m.state.replicas:  # the registry holds exactly the index's replicas
            slot = m.index.slot(rid)
            assert m.health._ids[slot] == rid and bool(m.health._live[slot])
        live = {rid for rid in m.health._ids if rid is not None}
        assert live == set(m.state.replicas)


def test_index_change_log_reaches_back_or_says_it_does_not() -> None:
    ix = ReplicaIndex()
    assert ix.changed_since(0) == []
    a = ix.add("a")
    ix.add("b")
    v = ix.version
    ix.remove("a")
    c = ix.add("c")
    assert c == a  # the freed slot, reused
    assert sorted(ix.changed_since(v) or []) == [a, a]
    for i in range(1000):  # far more changes than the log keeps for so small an index
        ix.add(f"r{i}")
        ix.remove(f"r{i}")
    ix.add("r7")
    assert ix.changed_since(v) is None  # the follower must look at every slot
    w, slot = ix.version, ix.slot("r7")
    ix.remove("r7")
    assert ix.changed_since(w) == [slot]


def test_one_change_in_a_large_deployment_looks_at_one_record() -> None:
    m = ManagedDeployment("app", CFG, "v0", 0.0, id_prefix="app-Model-0000", subjects=Subjects())
    m.state.target = 5000
    m.state.reconcile(0.0)
    for rid in list(m.state.replicas):
        m.state.on_lifecycle(rid, "ready", 0.0)
    m.follow_records(0.0)
    m.state.view()
    victim = sorted(m.state.replicas)[10]
    probe = m.state.channel()  # what every follower is handed: the changed ids
    m.state.on_lifecycle(victim, "exited", 1.0)
    assert probe == {victim}
    version = m.index.version
    m.follow_records(1.0)
    assert victim not in m.index and m.index.version == version + 1  # one removal, nothing else
    assert m.index.changed_since(version) == [m.health._ids.index(None)]
    assert len(m.state.view().running) == 4999 and victim not in m.metrics.running_ids()

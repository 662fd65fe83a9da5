"""Per-replica KV deltas (services/controller/kv_delta.py): O(1) writes per changed replica, slots
bounded by the deployment's largest size, takeover without rewrites, and the KV they build always
equal to what the replica records say."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from services.controller.deployment_state import ReplicaState
from services.controller.kv_delta import DeleteDoc, KVChange, PutDoc
from services.controller.managed import ManagedDeployment, StepResult
from shared.appconfig import AutoscalingConfig, DeploymentConfig
from shared.kv import buckets, envelope
from shared.kv.membership import Member
from shared.kv.targets import ReplicaTarget
from shared.subjects import Subjects

CFG = DeploymentConfig("Model", "services.examples.echo:Echo", num_replicas=0)
TARGETS, MEMBERS = buckets.TARGETS.name, buckets.MEMBERSHIP.name
KV = dict[tuple[str, str], ReplicaTarget | Member]


def deployment() -> ManagedDeployment:
    return ManagedDeployment("app", CFG, "v1", 0.0, id_prefix="app-Model-0000", subjects=Subjects())


def finish(m: ManagedDeployment, kv: KV) -> list[KVChange]:
    res = StepResult()
    m.finish(0.0, res)
    for c in res.kv:
        if isinstance(c, PutDoc):
            # what lands is exactly what the documents encode to
            kv[(c.bucket, c.key)] = envelope.decode(envelope.encode(c.doc), type(c.doc))
        else:
            assert isinstance(c, DeleteDoc)
            kv.pop((c.bucket, c.key), None)
    return res.kv


def grow(m: ManagedDeployment, n: int, agents: tuple[str, ...] = ("a1", "a2")) -> None:
    m.state.target = n
    m.state.reconcile(0.0)
    for i, rid in enumerate(sorted(m.state.replicas, key=lambda r: m.state.replicas[r].order)):
        rec = m.state.replicas[rid]
        if rec.state is ReplicaState.PENDING:
            rec.agent_id = agents[i % len(agents)]
            m.state.on_lifecycle(rid, "ready", 0.0)


def expected(m: ManagedDeployment, kv: KV) -> None:
    """The KV says what the records say: a target per live replica, a member per routable one,
    each replica in one slot, no two replicas sharing one."""
    live = {r.replica_id for r in m.state.replicas.values() if r.state is not ReplicaState.DRAINING}
    routable = {
        r.replica_id
        for r in m.state.replicas.values()
        if r.state is ReplicaState.RUNNING and not r.verdict
    }
    targets = [d for (b, _), d in kv.items() if b == TARGETS]
    members = [d for (b, _), d in kv.items() if b == MEMBERS]
    assert {t.replica_id for t in targets} == live and len(targets) == len(live)
    assert {x.replica_id for x in members} == routable and len(members) == len(routable)
    slots = {t.replica_id: t.slot for t in targets}
    for x in members:
        assert isinstance(x, Member)
        assert slots.get(x.replica_id, x.slot) == x.slot
    assert len(set(slots.values())) == len(slots)
    assert len({x.slot for x in members}) == len(members)


def test_one_replacement_costs_a_handful_of_small_writes_at_any_size() -> None:
    for n in (10, 2_000):
        m, kv = deployment(), {}
        grow(m, n)
        first = finish(m, kv)
        assert sum(isinstance(c, PutDoc) for c in first) == 2 * n  # a target and a member each
        epoch = m.state.membership_epoch
        victim = next(iter(m.state.replicas))
        m.state.verdict(victim, "unhealthy", 1.0)
        m.state.reconcile(1.0)  # a replacement is added
        new = next(r for r in m.state.replicas.values() if r.state is ReplicaState.PENDING)
        new.agent_id = "a1"
        changes = finish(m, kv)
        # the victim's member and target go, the newcomer's target comes: no other key moves
        assert len(changes) <= 3, changes
        assert all(len(envelope.encode(c.doc)) < 1024 for c in changes if isinstance(c, PutDoc))
        assert m.state.membership_epoch == epoch + 1
        m.state.on_lifecycle(new.replica_id, "ready", 2.0)
        assert len(finish(m, kv)) == 1  # its member
        expected(m, kv)


def test_slots_are_reused_so_keys_stay_bounded_by_the_largest_size() -> None:
    m, kv = deployment(), {}
    grow(m, 50)
    finish(m, kv)
    for i in range(200):
        rid = sorted(m.state.replicas)[i % 50]
        m.state.on_lifecycle(rid, "exited", float(i))  # crashed: replaced under a new id
        grow(m, 50)
        finish(m, kv)
        expected(m, kv)
    assert m.kv.slot_count == 50
    assert {d.slot for (b, _), d in kv.items() if b == MEMBERS} == set(range(50))


def test_a_new_owner_takes_over_without_rewriting_and_continues_by_delta() -> None:
    old, kv = deployment(), {}
    grow(old, 20)
    finish(old, kv)
    # a new owner restores from what the old one wrote
    new = deployment()
    targets = [d for (b, _), d in kv.items() if isinstance(d, ReplicaTarget)]
    members = [d for (b, _), d in kv.items() if isinstance(d, Member)]
    new.restore(targets, members, 5.0)
    assert finish(new, kv) == []  # nothing to rewrite
    assert new.state.membership_epoch == old.state.membership_epoch
    assert all(r.state is ReplicaState.RUNNING for r in new.state.replicas.values())
    order = [r.replica_id for r in sorted(new.state.replicas.values(), key=lambda r: r.order)]
    assert order == [t.replica_id for t in sorted(targets, key=lambda t: t.order)]
    # and it goes on by delta from the same slots
    victim = order[3]
    new.state.on_lifecycle(victim, "exited", 6.0)
    grow(new, 20)
    changes = finish(new, kv)
    assert 1 <= len(changes) <= 3  # the freed slot's member key is reused: one put, not two
    expected(new, kv)
    assert new.kv.slot_count == 20


def test_members_an_older_owner_wrote_without_a_limit_are_rewritten_once_with_it() -> None:
    old, kv = deployment(), {}
    grow(old, 3)
    finish(old, kv)
    for key, doc in list(kv.items()):
        if isinstance(doc, Member):  # as a controller before members carried the limit
            kv[key] = dataclasses.replace(doc, max_ongoing_requests=None)
    new = deployment()
    targets = [d for d in kv.values() if isinstance(d, ReplicaTarget)]
    new.restore(targets, [d for d in kv.values() if isinstance(d, Member)], 5.0)
    changes = finish(new, kv)
    assert len(changes) == 3 and all(isinstance(c, PutDoc) for c in changes)
    assert {d.max_ongoing_requests for d in kv.values() if isinstance(d, Member)} == {
        CFG.max_ongoing_requests
    }
    assert finish(new, kv) == []  # once


def test_a_member_without_a_target_is_deleted_on_takeover() -> None:
    old, kv = deployment(), {}
    grow(old, 3)
    finish(old, kv)
    gone = next(k for k in kv if k[0] == TARGETS)
    orphan = kv.pop(gone)  # the old owner died between deleting a target and its member
    new = deployment()
    members = [d for d in kv.values() if isinstance(d, Member)]
    new.restore([d for d in kv.values() if isinstance(d, ReplicaTarget)], members, 1.0)
    stray = new.take_stray()
    assert isinstance(orphan, ReplicaTarget)
    assert [c.key for c in stray] == [f"app.Model.{orphan.slot}"]


def test_unplaced_replicas_are_written_under_the_reserved_token_then_moved() -> None:
    m, kv = deployment(), {}
    m.state.target = 1
    m.state.reconcile(0.0)
    (rid,) = m.state.replicas
    (put,) = finish(m, kv)
    assert put.key == "_unplaced.app.Model.0"
    m.state.replicas[rid].agent_id = "a9"
    changes = finish(m, kv)
    assert [type(c) for c in changes] == [DeleteDoc, PutDoc]
    assert changes[1].key == "a9.app.Model.0"


OPS = st.lists(
    st.tuples(st.sampled_from(["grow", "ready", "verdict", "exit", "drain"]), st.integers(0, 40)),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(OPS)
def test_property_kv_always_equals_the_records(ops: list[tuple[str, int]]) -> None:
    m, kv = deployment(), {}
    for t, (op, n) in enumerate(ops):
        rids = sorted(m.state.replicas)
        rid = rids[n % len(rids)] if rids else None
        if op == "grow":
            m.state.target = n % 12
            m.state.reconcile(float(t))
            for r in m.state.replicas.values():
                if not r.agent_id and n % 3:
                    r.agent_id = f"a{n % 4}"
        elif rid is not None and op == "ready":
            m.state.on_lifecycle(rid, "ready", float(t))
        elif rid is not None and op == "verdict":
            m.state.verdict(rid, "unhealthy", float(t))
        elif rid is not None and op == "exit":
            m.state.on_lifecycle(rid, "exited", float(t))
        elif rid is not None and op == "drain":
            m.state.on_lifecycle(rid, "draining", float(t))
        finish(m, kv)
        expected(m, kv)


def test_members_carry_the_report_interval_and_a_change_rewrites_each_once() -> None:
    m = deployment()
    kv: KV = {}
    grow(m, 3)
    finish(m, kv)
    members = [d for (b, _), d in kv.items() if b == MEMBERS]
    assert [d.report_interval_s for d in members] == [CFG.policy.metrics_interval_s] * 3
    epoch = max(d.epoch for d in members)

    policy = AutoscalingConfig(min_replicas=0, max_replicas=8, metrics_interval_s=1.5)
    m.reconfigure(dataclasses.replace(CFG, num_replicas=None, autoscaling=policy), "v1", 0.0)
    changes = finish(m, kv)
    assert {(c.bucket, type(c)) for c in changes} == {(MEMBERS, PutDoc)}  # no target rewritten
    assert len(changes) == 3
    members = [d for (b, _), d in kv.items() if b == MEMBERS]
    assert {(d.report_interval_s, d.epoch) for d in members} == {(1.5, epoch + 1)}
    assert finish(m, kv) == []  # once
    expected(m, kv)

"""The per-tick shortcuts of the controller's stores give exactly what a full pass gives.

`HealthRegistry.evaluate` answers "nothing new" without looking while nothing could have changed,
`DeploymentMetrics.total_demand` is cached by a version of the rows, `expire` and the source gates'
`prune` skip their passes below a lower bound of the oldest receipt. Each is checked here against
the same store doing the full pass, over random histories of every kind of input.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from services.controller.health_registry import HealthEvaluation, HealthRegistry, ProbeOutcome
from services.controller.metrics_store import DeploymentMetrics
from services.controller.replica_index import ReplicaIndex
from services.controller.staleness import SourceGate
from shared.wire.messages import HandleReport, HealthStatus, ReplicaReport

PERIOD, TIMEOUT = 10.0, 30.0


def same(a: HealthEvaluation, b: HealthEvaluation) -> None:
    np.testing.assert_array_equal(a.stale_slots, b.stale_slots)
    np.testing.assert_array_equal(a.stale_since, b.stale_since)
    np.testing.assert_array_equal(a.unhealthy_slots, b.unhealthy_slots)
    np.testing.assert_array_equal(a.unhealthy_reasons, b.unhealthy_reasons)
    assert (a.live, a.stale, a.unreported, a.condemned, a.held) == (
        b.live, b.stale, b.unreported, b.condemned, b.held,
    )  # fmt: skip


OPS = ("membership", "batch", "single", "probe", "exit", "quiet")


@pytest.mark.parametrize("seed", range(80))
def test_health_evaluate_fast_path_matches_the_full_evaluation(seed: int) -> None:
    rnd = random.Random(seed)
    # each history has its own mix, most of them long quiet stretches (where the shortcut works)
    weights = [rnd.choice([0.2, 1.0]), 4.0, 2.0, rnd.choice([0.5, 3.0]), 0.2, rnd.choice([2, 10])]
    idx = ReplicaIndex()
    relay = rnd.choice([0.0, 1.0, 10.0])
    fast = HealthRegistry(idx, PERIOD, TIMEOUT, relay_slack_s=relay)
    full = HealthRegistry(idx, PERIOD, TIMEOUT, relay_slack_s=relay)
    full.fast_path = False
    ids = [f"r{i}" for i in range(8)]
    for rid in ids[:5]:
        idx.add(rid)
    now, wall = 100.0, 1.7e9
    skipped = 0
    for _ in range(400):
        now += rnd.choice([0.0, 0.1, 0.5, 1.0, 3.0])
        op = rnd.choices(OPS, weights)[0]
        live = idx.ids()
        if op == "membership":
            rid = rnd.choice(ids)
            if rid in idx:
                idx.remove(rid)
            else:
                idx.add(rid)
        elif op == "batch" and live:  # a router's report (relayed) or replica reports (direct)
            rows = rnd.sample(live, rnd.randint(1, len(live)))
            slots = [idx.slot(r) for r in rows] + (
                [idx.slot(rows[0])] if rnd.random() < 0.2 else []
            )
            checked = [wall + now - rnd.choice([0.0, 0.0, 3.0, 50.0]) for _ in slots]
            failures = [rnd.choice([0] * 20 + [1, 3]) for _ in slots]
            healthy = [f == 0 for f in failures]
            direct = rnd.random() < 0.3
            for reg in (fast, full):
                reg.observe_batch(slots, healthy, checked, failures, now, direct=direct)
        elif op == "single" and live:  # heartbeat, replica report, probe answer
            rid = rnd.choice(live)
            st = HealthStatus(
                rid, True, wall + now - rnd.choice([0.0, 1.0]), rnd.choice([0] * 9 + [4])
            )
            for reg in (fast, full):
                reg.observe(rid, st, now)
        elif op == "probe" and live:
            rid = rnd.choice(live)
            outcome = rnd.choice(list(ProbeOutcome))
            st = HealthStatus(rid, True, wall + now, 0) if rnd.random() < 0.3 else None
            for reg in (fast, full):
                reg.probe_result(rid, outcome, now, st)
        elif op == "exit" and live:
            rid = rnd.choice(live)
            for reg in (fast, full):
                reg.mark_exited(rid, now)
        hold = rnd.random() < 0.05
        fast.sync(now)
        skipped += not hold and fast._facts == fast._evaluated_facts and now <= fast._stale_floor
        same(fast.evaluate(now, hold_verdicts=hold), full.evaluate(now, hold_verdicts=hold))
    assert skipped > 20  # the shortcut was taken


def steady(relay: float = 0.0) -> tuple[ReplicaIndex, HealthRegistry]:
    """Three replicas heard from at t=100 by a router, evaluated: the next tick is a shortcut."""
    idx = ReplicaIndex()
    for rid in ("r0", "r1", "r2"):
        idx.add(rid)
    reg = HealthRegistry(idx, PERIOD, TIMEOUT, relay_slack_s=relay)
    reg.observe_batch([0, 1, 2], [True] * 3, [1.0, 1.0, 1.0], [0, 0, 0], 100.0)
    reg.evaluate(100.0, hold_verdicts=False)
    assert reg._facts == reg._evaluated_facts and reg._stale_floor >= 100.1
    return idx, reg


def test_probe_timeouts_of_a_fresh_replica_still_earn_their_verdict() -> None:
    # a probe sent while stale can time out after a report made the replica fresh again
    _, reg = steady()
    for _ in range(3):
        reg.probe_result("r0", ProbeOutcome.TIMEOUT, 100.2)
    ev = reg.evaluate(100.3, hold_verdicts=False)
    assert ev.unhealthy_slots.tolist() == [0]


def test_no_responders_and_exits_and_failures_of_fresh_replicas_are_seen() -> None:
    _, reg = steady()
    reg.probe_result("r1", ProbeOutcome.NO_RESPONDERS, 100.2)
    assert reg.evaluate(100.3, hold_verdicts=False).unhealthy_slots.tolist() == [1]
    reg.mark_exited("r2", 100.4)
    assert reg.evaluate(100.5, hold_verdicts=False).unhealthy_slots.tolist() == [2]
    reg.observe_batch([0], [False], [2.0], [3], 100.6)
    assert reg.evaluate(100.7, hold_verdicts=False).unhealthy_slots.tolist() == [0]


def test_a_direct_entry_after_a_relayed_one_can_make_a_replica_stale_sooner() -> None:
    _, reg = steady(relay=10.0)  # fresh until 100 + 17 + 10 = 127
    reg.observe("r0", HealthStatus("r0", True, 1.0, 0), 101.0)  # direct: fresh until 118
    assert reg.evaluate(117.9, hold_verdicts=False).stale == 0
    ev = reg.evaluate(118.5, hold_verdicts=False)
    assert ev.stale_slots.tolist() == [0]


def test_absences_withheld_during_a_hold_are_judged_when_it_ends() -> None:
    _, reg = steady()
    reg.probe_result("r1", ProbeOutcome.NO_RESPONDERS, 100.2)
    held = reg.evaluate(100.3, hold_verdicts=True)
    assert held.held == 1 and held.unhealthy_slots.size == 0
    assert reg.evaluate(100.4, hold_verdicts=False).unhealthy_slots.tolist() == [1]


@pytest.mark.parametrize("seed", range(40))
def test_demand_cache_and_expiry_bounds_match_the_full_pass(seed: int) -> None:
    rnd = random.Random(seed)
    idx = ReplicaIndex()
    ids = [f"r{i}" for i in range(10)]
    for rid in ids[:6]:
        idx.add(rid)
    stores = [DeploymentMetrics(idx, 1.0), DeploymentMetrics(idx, 1.0)]
    cached, ref = stores
    now = 10.0
    for seq in range(1, 301):
        now += rnd.choice([0.1, 0.1, 0.5, 3.0, 12.0, 70.0])
        op = rnd.random()
        if op < 0.1:
            rid = rnd.choice(ids)
            if rid in idx:
                idx.remove(rid)
            else:
                idx.add(rid)
        if op < 0.25:
            running = rnd.sample(ids, rnd.randint(0, len(ids)))
            for s in stores:
                s.set_running(running)
        elif op < 0.6:
            hid = rnd.choice(["h1", "h2", "h3"])
            rows = rnd.sample(ids, rnd.randint(0, len(ids)))
            rep = HandleReport(
                handle_id=hid, app="a", deployment="d", sent_at=now, seq=seq,
                running={r: rnd.random() * 4 for r in rows},
                queued_requests=rnd.choice([0.0, 2.0]), membership_epoch=1, health=(),
            )  # fmt: skip
            for s in stores:
                s.ingest_handle_report(rep, now)
        elif op < 0.8:
            rid = rnd.choice(ids)
            rr = ReplicaReport(rid, now, seq, rnd.random() * 3, {}, None)
            for s in stores:
                s.ingest_replica_report(rr, now)
        for s in stores:
            s.expire(now)
        # the reference recomputes from the rows every time
        expect = ref.total_running() + ref.queued()
        assert cached.total_demand() == expect
        np.testing.assert_array_equal(cached.per_replica_running(), ref.per_replica_running())
        assert cached.handle_ids() == ref.handle_ids()


def test_gate_prune_bound_never_keeps_what_a_full_pass_drops() -> None:
    rnd = random.Random(7)
    gate = SourceGate()
    kept: dict[str, float] = {}
    now = 0.0
    for i in range(2000):
        now += rnd.choice([0.0, 0.1, 1.0, 10.0])
        src = f"s{rnd.randint(0, 20)}"
        recv = now - rnd.choice([0.0, 0.0, 5.0])  # a replayed message can be older
        if gate.admit(src, sent_at=float(i), seq=i, recv=recv).accepted:
            kept[src] = recv
        cut = now - rnd.choice([1.0, 10.0, 60.0])
        gone = sorted(gate.prune(cut))
        expect = sorted(s for s, r in kept.items() if r < cut)
        assert gone == expect
        for s in expect:
            del kept[s]
        assert len(gate) == len(kept)

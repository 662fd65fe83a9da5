"""The many-apps fleet simulator publishes what the real fleet would, when it would: lifecycle on
target changes, one handle report per router per metrics interval, heartbeats exactly when
`services/replica/suppression.py` says so."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from scripts.bench.fleet_apps import AppsSim, late_summary
from scripts.bench.fleet_sim import SILENT, UNHEALTHY, SimConfig, SimCounters
from services.replica.suppression import HealthCarriage, Via
from shared.subjects import Subjects
from shared.wire.codec import decode
from shared.wire.messages import HandleReport, HealthStatus, Heartbeat, Lifecycle

S = Subjects()
DT = 0.2


def make(apps: int = 3, replicas: int = 2, **kw: float) -> AppsSim:
    cfg = SimConfig("unused", health_period_s=10.0, metrics_interval_s=10.0,
                    routers_per_deployment=2, **kw)  # type: ignore[arg-type]  # fmt: skip
    sim = AppsSim(cfg, [(f"a{i}", "d") for i in range(apps)], SimCounters(),
                  np.random.default_rng(7))  # fmt: skip
    sim.set_interval(0.0)
    for d in range(apps):
        sim.apply_targets(d, {f"a{d}-r{k}": "v1" for k in range(replicas)}, 0.0, 0.0)
    return sim


def join_all(sim: AppsSim) -> None:
    """Every replica a member, in slot order (what fp_membership would say)."""
    for d in range(len(sim.keys)):
        ids = list(sim.dep_slots[d])
        sim.member_slots[d] = np.array([sim.dep_slots[d][r] for r in ids], dtype=np.int64)
        sim.member_ids[d] = ids
        sim.member[sim.member_slots[d]] = True


def kinds(out: list[tuple[str, bytes]]) -> Counter[str]:
    return Counter(subject.split(".")[3] for subject, _ in out)  # fp.v1.report.{kind}.app.dep


def test_targets_become_replicas_then_ready_with_a_first_heartbeat() -> None:
    cfg = SimConfig("unused")
    sim = AppsSim(cfg, [("a0", "d"), ("a1", "d")], SimCounters(), np.random.default_rng(1))
    out, gone = sim.apply_targets(1, {"x": "v1", "y": "v1"}, 0.0, 100.0)
    assert gone == []
    msgs = [decode(d) for _, d in out]
    assert [(m.replica_id, m.state, m.app) for m in msgs if isinstance(m, Lifecycle)] == [
        ("x", "starting", "a1"), ("y", "starting", "a1")
    ]  # fmt: skip
    assert all(s == S.report("lifecycle", "a1", "d") for s, _ in out)
    out = sim.tick(0.2, 100.2, DT)
    got = [decode(d) for _, d in out]
    assert sorted(m.replica_id for m in got if isinstance(m, Lifecycle)) == ["x", "y"]
    assert {m.state for m in got if isinstance(m, Lifecycle)} == {"ready"}
    beats = [m for m in got if isinstance(m, Heartbeat)]
    assert sorted(b.health.replica_id for b in beats) == ["x", "y"]  # nothing carried yet
    assert sim.counters.heartbeats["first"] == 2
    out, gone = sim.apply_targets(1, {"y": "v1"}, 1.0, 101.0)
    assert gone == ["x"] and [decode(d).state for _, d in out] == ["exited"]  # type: ignore[union-attr]
    assert sim.members() == 0 and "x" not in sim.slot_of


def test_each_router_reports_once_per_interval_with_its_carried_health() -> None:
    sim = make(apps=4, replicas=3, request_rate=2.0, idle_share=0.0, push_share=0.0)
    join_all(sim)
    per_router: Counter[str] = Counter()
    reports: list[HandleReport] = []
    t = 0.0
    while t < 60.0 - 1e-9:
        t += DT
        for subject, data in sim.tick(t, t, DT):
            m = decode(data)
            if isinstance(m, HandleReport):
                assert subject == S.report("handle", m.app, m.deployment)
                per_router[m.handle_id] += 1
                reports.append(m)
    assert len(per_router) == 4 * 2
    assert set(per_router.values()) <= {5, 6}  # 60 s at 10 s, a random phase
    late = reports[-1]
    assert set(late.running) == {f"{late.app}-r{k}" for k in range(3)}
    # 2 admissions/s over 2 routers: every member's latest check rode in
    assert {h.replica_id for h in late.health} == set(late.running)
    assert all(h.healthy and h.checked_at > 0 for h in late.health)
    # health rides on admissions: no heartbeat after the first ones (at most one per replica,
    # none for a replica an admission carried before its first heartbeat could go)
    hb = sim.counters.heartbeats
    assert {k for k, v in hb.items() if v} == {"first"} and hb["first"] <= 12


def test_idle_replicas_heartbeat_once_per_freshness_window() -> None:
    sim = make(apps=2, replicas=2, idle_share=1.0, push_share=0.0)
    join_all(sim)
    at: list[float] = []
    t = 0.0
    while t < 50.0:
        t += DT
        at += [t for _, d in sim.tick(t, t, DT) if isinstance(decode(d), Heartbeat) and t > 1]
    # four replicas, window 15 s: ~15, 30 and 45 s after the first
    assert len(at) == 4 * 3
    assert sim.counters.heartbeats["window_idle"] == 12
    assert min(np.diff(sorted(set(at)))) >= 15.0 - 1e-6


def test_a_failing_replica_sends_bad_news_at_once_behind_busy_routers() -> None:
    sim = make(apps=1, replicas=2, request_rate=50.0, idle_share=0.0, push_share=0.0)
    join_all(sim)
    t = 0.0
    for _ in range(5):
        t += DT
        sim.tick(t, t, DT)
    slot = sim.slot_of["a0-r0"]
    sim.fault[slot] = UNHEALTHY
    sim.next_check[slot] = t + DT
    t += DT
    beats = [decode(d) for _, d in sim.tick(t, t, DT)]
    bad = [b for b in beats if isinstance(b, Heartbeat)]
    assert [(b.health.replica_id, b.health.healthy) for b in bad] == [("a0-r0", False)]
    assert sim.counters.heartbeats["bad"] == 1
    # the silent one stops talking altogether
    sim.fault[slot] = SILENT
    for _ in range(200):
        t += DT
        assert not [d for _, d in sim.tick(t, t, DT) if isinstance(decode(d), Heartbeat)]


@pytest.mark.parametrize("seed", range(20))
def test_heartbeat_due_matches_the_replica_suppression_rules(seed: int) -> None:
    """Random checks, admissions, reports, heartbeats and probes fed to the simulator's arrays
    and to `HealthCarriage`: both say the same thing at every step."""
    rnd = random.Random(seed)
    sim = make(apps=1, replicas=1)
    sim.tick(DT, DT, DT)  # ready, first check done
    s = np.array([sim.slot_of["a0-r0"]], dtype=np.int64)
    carriage = HealthCarriage(sim.cfg.freshness_s)
    now = DT

    def latest() -> HealthStatus:
        return HealthStatus("a0-r0", bool(sim.healthy[s[0]]), float(sim.checked[s[0]]), 0)

    carriage.on_check(latest())
    carriage.carried(latest(), DT, Via.HEARTBEAT)  # the first heartbeat went out in that tick
    for _ in range(300):
        now += rnd.choice((0.1, 0.5, 2.0, 7.0))
        op = rnd.choice(("check", "check", "admission", "report", "heartbeat", "probe", "wait"))
        if op == "check":
            sim.fault[s] = UNHEALTHY if rnd.random() < 0.4 else 0
            sim.next_check[s] = now
            sim._checks(now, now)
            carriage.on_check(latest())
        elif op != "wait":
            via = {"admission": Via.ADMISSION, "report": Via.REPORT, "heartbeat": Via.HEARTBEAT,
                   "probe": Via.PROBE}[op]  # fmt: skip
            sim._carried(s, now, direct=via.direct)
            carriage.carried(latest(), now, via)
        due, _ = sim.heartbeat_due(now)
        assert (s[0] in due) == carriage.heartbeat_due(now), (op, now)


def test_lateness_counts_how_late_each_timed_event_ran() -> None:
    sim = make(apps=2, replicas=2)
    join_all(sim)
    sim.tick(DT, DT, DT)
    sim.lateness_hist[:] = 0
    sim.next_check[:] = np.inf
    sim.next_push[:] = np.inf
    sim.next_report[:] = 9.0
    sim.tick(10.0, 10.0, DT)  # four router reports, each 1 s late
    got = late_summary(sim.lateness_hist)
    assert got["late_p50_s"] == pytest.approx(1.0, abs=0.002)
    assert got["late_max_s"] == pytest.approx(1.0, abs=0.002)
    assert int(sim.lateness_hist.sum()) == 4
    assert np.all(sim.next_report == 19.0)

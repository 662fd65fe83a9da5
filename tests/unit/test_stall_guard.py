import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.controller.health_registry import HealthRegistry, ProbeOutcome, VerdictReason
from services.controller.replica_index import ReplicaIndex
from services.controller.stall_guard import (
    ProbeLimiter,
    ProbeLimits,
    StallEventKind,
    StallGuard,
    StallReason,
    StallThresholds,
)
from shared.errors import ConfigError, UsageError
from shared.wire.messages import HealthStatus

CALM = 15.0


def guard(**kw: object) -> StallGuard:
    return StallGuard(StallThresholds(calm_s=CALM, **kw))  # type: ignore[arg-type]


# -- stall guard -----------------------------------------------------------------------------


def test_lag_enters_at_once_and_leaves_only_after_a_calm_period() -> None:
    g = guard(max_pending=100)
    assert not g.tick(0.0, pending=100).stalled  # at the threshold: not behind
    s = g.tick(1.0, pending=101)
    assert s.stalled and s.hold_verdicts and s.cap_probes
    assert s.reason is StallReason.INGEST_PENDING
    assert [(e.kind, e.reasons) for e in s.events] == [
        (StallEventKind.ENTERED, (StallReason.INGEST_PENDING,))
    ]
    assert g.tick(2.0, pending=0).stalled  # calm starts at the last trigger (1.0)
    assert g.tick(10.0, pending=500).events == ()  # hovering: calm restarts, no new event
    assert g.tick(24.9, pending=0).stalled
    s = g.tick(25.0, pending=0)
    assert not s.stalled and not s.hold_verdicts and s.reason is None
    (left,) = s.events
    assert left.kind is StallEventKind.LEFT
    assert left.reasons == (StallReason.INGEST_PENDING,)
    assert left.stalled_for_s == 24.0
    assert g.tick(26.0).events == ()


def test_lag_in_seconds_and_missing_inputs() -> None:
    g = guard(max_lag_s=5.0)
    assert not g.tick(0.0).stalled  # nothing measurable: not stalled
    assert not g.tick(1.0, lag_s=5.0).stalled
    s = g.tick(2.0, lag_s=5.5, pending=10**9)  # pending is not configured away: default 10,000
    assert s.triggers == (StallReason.INGEST_PENDING, StallReason.INGEST_LAG)
    g2 = guard(max_pending=None, max_lag_s=None)
    assert not g2.tick(0.0, pending=10**9, lag_s=1e9).stalled


def test_mass_staleness_needs_a_share_and_a_count() -> None:
    g = guard(max_stale_share=0.3, min_stale_replicas=10)
    assert not g.tick(0.0, stale=9, known=10).stalled  # 90% but only 9 replicas
    assert not g.tick(1.0, stale=30, known=100).stalled  # exactly 30%
    s = g.tick(2.0, stale=31, known=100)
    assert s.stalled and s.reason is StallReason.MASS_STALENESS
    assert g.tick(2.0 + CALM - 0.5, stale=0, known=100).stalled
    assert not g.tick(2.0 + CALM, stale=5, known=100).stalled
    with pytest.raises(UsageError):
        g.tick(40.0, stale=5, known=4)


def test_overrun_needs_consecutive_ticks() -> None:
    g = guard(overrun_ticks=3)
    assert not g.tick(0.0, overrun=True).stalled
    assert not g.tick(1.0, overrun=True).stalled
    assert not g.tick(2.0, overrun=False).stalled
    assert not g.tick(3.0, overrun=True).stalled
    assert not g.tick(4.0, overrun=True).stalled
    s = g.tick(5.0, overrun=True)
    assert s.stalled and s.reason is StallReason.LOOP_OVERRUN


def test_the_hold_expires_on_lasting_mass_staleness_only() -> None:
    g = guard(max_hold_s=100.0)
    g.tick(0.0, stale=50, known=100)
    s = g.tick(99.0, stale=50, known=100)
    assert s.hold_verdicts
    s = g.tick(100.0, stale=50, known=100)
    assert s.stalled and s.cap_probes and not s.hold_verdicts
    assert [e.kind for e in s.events] == [StallEventKind.HOLD_EXPIRED]
    s = g.tick(101.0, stale=50, known=100, lag_s=60.0)  # the controller itself falls behind
    assert s.hold_verdicts and [e.kind for e in s.events] == [StallEventKind.HOLD_RESUMED]
    # the hold may expire again only once the controller's own input is calm for calm_s
    assert g.tick(110.0, stale=50, known=100).hold_verdicts
    assert not g.tick(116.0, stale=50, known=100).hold_verdicts


def test_lag_never_lets_the_hold_expire() -> None:
    g = guard(max_hold_s=10.0)
    for t in range(0, 100, 5):
        s = g.tick(float(t), lag_s=60.0, stale=50, known=100)
        assert s.hold_verdicts
    g2 = guard(max_hold_s=None)
    for t in range(0, 1000, 50):
        assert g2.tick(float(t), stale=50, known=100).hold_verdicts


def test_thresholds_are_validated() -> None:
    for bad in (
        {"max_stale_share": 0.0},
        {"max_stale_share": 1.5},
        {"min_stale_replicas": 0},
        {"overrun_ticks": 0},
        {"calm_s": -1.0},
        {"max_pending": -1},
        {"max_lag_s": math.nan},
        {"max_hold_s": 0.0},
    ):
        with pytest.raises(ConfigError):
            StallThresholds(**bad)
    with pytest.raises(ConfigError):
        ProbeLimits(burst=0.5)
    with pytest.raises(ConfigError):
        ProbeLimits(rate_per_s=-1.0)


# -- probe limiter ---------------------------------------------------------------------------

LIMITS = ProbeLimits(
    rate_per_s=200.0,
    burst=200.0,
    stalled_rate_per_s=10.0,
    stalled_burst=10.0,
    reprobe_after_s=15.0,
    outstanding_ttl_s=60.0,
)


def test_a_burst_of_ten_thousand_stale_yields_at_most_the_budget() -> None:
    lim: ProbeLimiter[str] = ProbeLimiter(LIMITS)
    ids = [f"r{i}" for i in range(10_000)]
    first = lim.select(ids, now=0.0, stalled=False)
    assert first == ids[:200]
    assert lim.select(ids, now=0.0, stalled=False) == []  # bucket empty
    second = lim.select(ids, now=0.5, stalled=False)  # 0.5 s refills 100
    assert second == ids[200:300]
    assert lim.outstanding == 300
    stalled = lim.select(ids, now=10.0, stalled=True)
    assert stalled == ids[300:310]  # refill capped by the stalled burst
    assert lim.select(ids, now=10.2, stalled=True) == ids[310:312]


def test_one_outstanding_probe_per_replica_and_no_reprobe_within_the_window() -> None:
    lim: ProbeLimiter[str] = ProbeLimiter(LIMITS)
    assert lim.select(["a", "a", "b"], now=0.0, stalled=False) == ["a", "b"]
    assert lim.is_outstanding("a")
    assert lim.select(["a", "b", "c"], now=1.0, stalled=False) == ["c"]
    lim.done("a")
    assert not lim.is_outstanding("a")
    assert lim.select(["a"], now=14.9, stalled=False) == []  # answered, but probed 14.9 s ago
    assert lim.select(["a"], now=15.0, stalled=False) == ["a"]
    # b is still outstanding (never reported done) until its ttl
    assert lim.select(["b"], now=59.0, stalled=False) == []
    assert lim.select(["b"], now=60.0, stalled=False) == ["b"]
    lim.forget("c")
    assert lim.select(["c"], now=60.0, stalled=False) == ["c"]


def test_selection_is_oldest_first_and_deterministic() -> None:
    lim: ProbeLimiter[tuple[str, int]] = ProbeLimiter(
        ProbeLimits(burst=3, stalled_burst=1, reprobe_after_s=15.0)
    )
    keys = [("d1", 0), ("d1", 1), ("d2", 0), ("d2", 1)]
    since = np.array([30.0, 10.0, 20.0, 10.0])
    assert lim.select(keys, 40.0, False, stale_since=since) == [("d1", 1), ("d2", 1), ("d2", 0)]
    with pytest.raises(UsageError):
        lim.select(keys, 50.0, False, stale_since=[1.0])


def test_registry_stale_slots_feed_the_limiter() -> None:
    idx = ReplicaIndex()
    for i in range(5):
        idx.add(f"r{i}")
    reg = HealthRegistry(idx, 10.0, 30.0, stale_slack_s=0.0)
    for i, recv in enumerate((5.0, 1.0, 4.0, 2.0, 3.0)):
        reg.observe(f"r{i}", HealthStatus(f"r{i}", True, 1e9, 0), recv=recv)
    ev = reg.evaluate(30.0, hold_verdicts=False)
    ids = [idx.id_at(int(s)) or "" for s in ev.stale_slots]
    lim: ProbeLimiter[str] = ProbeLimiter(ProbeLimits(burst=2))
    assert lim.select(ids, 30.0, False, stale_since=ev.stale_since) == ["r1", "r3"]


# -- property: a stalled controller neither storms nor condemns ------------------------------

N_REPLICAS = 400
STEP = st.tuples(
    st.floats(0.01, 5.0),  # time advance
    st.lists(st.integers(0, N_REPLICAS - 1), max_size=30),  # replicas that report this tick
    st.sampled_from(list(ProbeOutcome)),  # how this tick's probes end
)


@settings(max_examples=40, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=60))
def test_stalled_ticks_never_exceed_the_stalled_budget_nor_condemn_for_absence(
    steps: list[tuple[float, list[int], ProbeOutcome]],
) -> None:
    idx = ReplicaIndex()
    for i in range(N_REPLICAS):
        idx.add(f"r{i}")
    reg = HealthRegistry(idx, 1.0, 1.0, stale_slack_s=0.0)  # window 1.5 s: stale quickly
    g = StallGuard(StallThresholds(calm_s=1.0, max_hold_s=None))
    lim: ProbeLimiter[str] = ProbeLimiter(LIMITS)
    now, probed, wall = 0.0, 0, 1e9
    prev_outstanding: list[str] = []
    for dt, reporters, outcome in steps:
        now += dt
        wall += dt
        for slot in reporters:
            rid = f"r{slot}"
            reg.observe(rid, HealthStatus(rid, True, wall, 0), recv=now)
        for rid in prev_outstanding:
            reg.probe_result(rid, outcome, recv=now)
            lim.done(rid)
        ev = reg.evaluate(now, hold_verdicts=g.hold_verdicts)
        assert set(ev.unhealthy_reasons.tolist()) <= {VerdictReason.EXITED, VerdictReason.FAILURES}
        assert ev.unhealthy_slots.size == 0  # no replica here ever reports a fact
        state = g.tick(now, lag_s=60.0, stale=ev.stale, known=ev.candidates)  # always behind
        assert state.stalled and state.hold_verdicts
        ids = [f"r{int(s)}" for s in ev.stale_slots]
        chosen = lim.select(ids, now, state.cap_probes, stale_since=ev.stale_since)
        assert len(chosen) <= LIMITS.stalled_burst
        assert len(set(chosen)) == len(chosen)
        probed += len(chosen)
        # first tick may spend the stalled burst; after that, only what the rate refills
        assert (
            probed <= LIMITS.stalled_burst + LIMITS.stalled_rate_per_s * (now - steps[0][0]) + 1e-9
        )
        prev_outstanding = chosen

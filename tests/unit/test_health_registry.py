import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.controller.health_registry import (
    HealthRegistry,
    ProbeOutcome,
    VerdictReason,
    default_stale_slack,
)
from services.controller.replica_index import NO_SLOT, ReplicaIndex
from shared.errors import ConfigError, UsageError
from shared.freshness import freshness_window
from shared.wire.messages import HealthStatus

PERIOD = 10.0
TIMEOUT = 30.0
WINDOW = 15.0  # freshness_window(PERIOD)
GRACE = PERIOD + TIMEOUT
WALL = 1_700_000_000.0  # replicas' wall clock; never compared with `recv`


def hs(rid: str, checked_at: float, healthy: bool = True, failures: int = 0) -> HealthStatus:
    return HealthStatus(rid, healthy, checked_at, failures)


def make(
    n: int = 4, *, slack: float | None = 0.0, now: float = 0.0
) -> tuple[ReplicaIndex, HealthRegistry]:
    idx = ReplicaIndex()
    for i in range(n):
        idx.add(f"r{i}")
    reg = HealthRegistry(idx, PERIOD, TIMEOUT, stale_slack_s=slack)
    reg.sync(now)
    return idx, reg


def batch(
    reg: HealthRegistry,
    rows: list[tuple[int, bool, float, int]],
    recv: float,
    *,
    direct: bool = False,
) -> int:
    slots, healthy, checked, failures = zip(*rows, strict=True) if rows else ((), (), (), ())
    return reg.observe_batch(
        np.array(slots, dtype=np.int64),
        np.array(healthy, dtype=bool),
        np.array(checked, dtype=np.float64),
        np.array(failures, dtype=np.int32),
        recv,
        direct=direct,
    )


def checked(reg: HealthRegistry, replica: int | str) -> float | None:
    h = reg.get(replica, 0.0)
    assert h is not None
    return h.checked_at


def stale(reg: HealthRegistry, now: float, hold: bool = False) -> list[int]:
    slots: list[int] = reg.evaluate(now, hold_verdicts=hold).stale_slots.tolist()
    return slots


def test_window_is_the_shared_one_and_slack_is_small() -> None:
    assert freshness_window(PERIOD) == WINDOW
    assert default_stale_slack(15.0) == 2.0
    assert default_stale_slack(1.0) == 0.5
    reg = HealthRegistry(ReplicaIndex(), PERIOD, TIMEOUT)
    assert reg.freshness_s == WINDOW
    assert reg.stale_after_s == WINDOW + 2.0


def test_bad_config_is_refused() -> None:
    with pytest.raises(ConfigError):
        HealthRegistry(ReplicaIndex(), 0.0, TIMEOUT)
    with pytest.raises(ConfigError):
        HealthRegistry(ReplicaIndex(), PERIOD, TIMEOUT, failure_threshold=0)
    with pytest.raises(ConfigError):
        HealthRegistry(ReplicaIndex(), PERIOD, TIMEOUT, stale_slack_s=-1.0)


# -- ordering --------------------------------------------------------------------------------


def test_single_entries_newest_wins_and_out_of_order_is_ignored() -> None:
    _, reg = make()
    assert reg.observe("r0", hs("r0", WALL + 10), recv=1.0)
    assert reg.observe("r0", hs("r0", WALL + 20, healthy=False, failures=1), recv=2.0)
    assert not reg.observe("r0", hs("r0", WALL + 15), recv=3.0)  # arrived late
    h = reg.get("r0", 3.0)
    assert h is not None
    assert (h.checked_at, h.healthy, h.consecutive_failures) == (WALL + 20, False, 1)


def test_batches_newest_wins_across_batches() -> None:
    _, reg = make()
    assert batch(reg, [(0, True, WALL + 10, 0), (1, True, WALL + 5, 0)], recv=1.0) == 2
    assert batch(reg, [(0, False, WALL + 9, 2), (1, False, WALL + 6, 1)], recv=2.0) == 1
    assert checked(reg, 0) == WALL + 10
    h1 = reg.get(1, 2.0)
    assert h1 is not None and (h1.checked_at, h1.healthy, h1.consecutive_failures) == (
        WALL + 6,
        False,
        1,
    )


def test_duplicate_slots_in_one_batch_newest_wins() -> None:
    _, reg = make()
    rows = [
        (2, True, WALL + 3, 0),
        (2, False, WALL + 7, 2),
        (2, True, WALL + 5, 0),
        (1, True, WALL, 0),
    ]
    assert batch(reg, rows, recv=1.0) == 2
    h = reg.get(2, 1.0)
    assert h is not None and (h.checked_at, h.healthy, h.consecutive_failures) == (
        WALL + 7,
        False,
        2,
    )
    # equal checked_at in one batch: the first row wins, as it would across two batches
    batch(reg, [(3, True, WALL, 0), (3, False, WALL, 5)], recv=1.0)
    h3 = reg.get(3, 1.0)
    assert h3 is not None and h3.healthy and h3.consecutive_failures == 0


def test_rows_without_health_or_a_live_slot_are_skipped() -> None:
    idx, reg = make(2)
    rows = [
        (NO_SLOT, True, WALL, 0),
        (7, True, WALL, 0),
        (1000, True, WALL, 0),
        (0, True, float("nan"), 0),
    ]
    assert batch(reg, rows, recv=1.0) == 0
    assert reg.get(0, 1.0) is not None and checked(reg, 0) is None
    with pytest.raises(UsageError):
        reg.observe_batch([0, 1], [True], [WALL], [0], 1.0)
    assert not reg.observe("nobody", hs("nobody", WALL), recv=1.0)
    assert idx.slot("nobody") == NO_SLOT


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.booleans(), st.integers(0, 6), st.integers(0, 4)),
        max_size=40,
    ),
    st.lists(st.integers(1, 40), max_size=6),
)
def test_batches_converge_to_the_newest_first_seen_entry(
    rows: list[tuple[int, bool, int, int]], cuts: list[int]
) -> None:
    _, reg = make(6)
    data = [(s, h, WALL + c, f) for s, h, c, f in rows]
    bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    for a, b in itertools.pairwise(bounds):
        batch(reg, data[a:b], recv=1.0)
    expected: dict[int, tuple[bool, float, int]] = {}
    for s, h, c, f in data:
        if s not in expected or c > expected[s][1]:
            expected[s] = (h, c, f)
    for slot in range(6):
        got = reg.get(slot, 1.0)
        assert got is not None
        if slot in expected:
            assert (got.healthy, got.checked_at, got.consecutive_failures) == expected[slot]
        else:
            assert got.checked_at is None


# -- freshness -------------------------------------------------------------------------------


def test_freshness_is_judged_by_receipt_time_not_the_remote_clock() -> None:
    _, reg = make(3)
    reg.observe("r0", hs("r0", WALL - 3600), recv=100.0)  # wall clock an hour behind
    reg.observe("r1", hs("r1", WALL + 3600), recv=100.0)  # an hour ahead
    reg.observe("r2", hs("r2", WALL), recv=100.0)
    assert stale(reg, 100.0 + WINDOW) == []
    assert stale(reg, 100.0 + WINDOW + 0.25) == [0, 1, 2]
    # the skewed replicas keep counting from their own base
    reg.observe("r0", hs("r0", WALL - 3600 + 10), recv=110.0)
    reg.observe("r1", hs("r1", WALL + 3600 + 10), recv=110.0)
    assert stale(reg, 110.0 + WINDOW) == [2]


def test_stale_exactly_at_the_window_boundary() -> None:
    _, reg = make(1)
    reg.observe("r0", hs("r0", WALL), recv=100.0)
    assert stale(reg, 115.0) == []
    assert stale(reg, 115.0 + 2**-20) == [0]


def test_default_slack_extends_the_boundary() -> None:
    _, reg = make(1, slack=None)
    reg.observe("r0", hs("r0", WALL), recv=100.0)
    assert stale(reg, 117.0) == []
    assert stale(reg, 117.0 + 2**-20) == [0]


def test_equal_checked_at_refreshes_on_direct_channels_only() -> None:
    _, reg = make(2)
    reg.observe("r0", hs("r0", WALL), recv=100.0)
    batch(reg, [(1, True, WALL, 0)], recv=100.0)
    # a slow check: the replica re-sends the same status on a heartbeat / probe answer
    assert not reg.observe("r0", hs("r0", WALL), recv=110.0)
    # a router re-sends the entry it holds: says nothing about the replica now
    assert batch(reg, [(1, True, WALL, 0)], recv=110.0) == 0
    assert stale(reg, 120.0) == [1]
    h0 = reg.get("r0", 120.0)
    assert h0 is not None and h0.received_at == 110.0 and h0.fresh_until == 125.0
    # a direct batch (the replicas' own reports) refreshes too
    batch(reg, [(1, True, WALL, 0)], recv=120.0, direct=True)
    assert stale(reg, 125.0) == []


def test_a_stepped_back_clock_is_heard_again_once_stale_on_a_direct_channel() -> None:
    _, reg = make(1)
    reg.observe("r0", hs("r0", WALL), recv=100.0)
    assert not reg.observe("r0", hs("r0", WALL - 50), recv=105.0)  # still fresh: out of order
    assert batch(reg, [(0, True, WALL - 40, 0)], recv=120.0) == 0  # relayed: never accepted
    assert reg.observe("r0", hs("r0", WALL - 30, healthy=False, failures=1), recv=120.0)
    assert checked(reg, "r0") == WALL - 30
    assert stale(reg, 130.0) == []
    # the same rule on the batch path (the replicas' own reports)
    assert batch(reg, [(0, True, WALL - 60, 0)], recv=130.0, direct=True) == 0  # still fresh
    assert batch(reg, [(0, True, WALL - 60, 0)], recv=140.0, direct=True) == 1  # stale: heard
    assert checked(reg, "r0") == WALL - 60


def test_startup_grace_then_stale() -> None:
    _, reg = make(2, now=50.0)
    ev = reg.evaluate(50.0 + GRACE, hold_verdicts=False)
    assert ev.stale == 0 and ev.unreported == 2 and ev.live == 2
    reg.observe("r1", hs("r1", WALL), recv=80.0)
    ev = reg.evaluate(50.0 + GRACE + 0.5, hold_verdicts=False)
    assert ev.stale_slots.tolist() == [0]
    assert ev.unreported == 1
    assert ev.stale_share == 0.5
    # a first report ends the grace: a replica heard once early and then silent goes stale
    # a window after that report, not at the end of the grace
    _, reg = make(1, now=0.0)
    reg.observe("r0", hs("r0", WALL), recv=1.0)
    assert stale(reg, 1.0 + WINDOW + 0.5) == [0]


def test_stale_slots_most_overdue_first_and_share() -> None:
    _, reg = make(4)
    for rid, recv in (("r0", 30.0), ("r1", 10.0), ("r2", 20.0), ("r3", 10.0)):
        reg.observe(rid, hs(rid, WALL), recv=recv)
    ev = reg.evaluate(60.0, hold_verdicts=False)
    assert ev.stale_slots.tolist() == [1, 3, 2, 0]
    assert ev.stale_since.tolist() == [25.0, 25.0, 35.0, 45.0]
    reg.mark_exited("r1", 60.0)
    ev = reg.evaluate(60.0, hold_verdicts=False)
    assert ev.stale_slots.tolist() == [3, 2, 0]  # a condemned replica needs no probe
    assert (ev.stale, ev.candidates, ev.stale_share) == (3, 3, 1.0)


# -- verdicts --------------------------------------------------------------------------------


def new_verdicts(reg: HealthRegistry, now: float, hold: bool = False) -> dict[int, VerdictReason]:
    ev = reg.evaluate(now, hold_verdicts=hold)
    return {
        int(s): VerdictReason(int(r))
        for s, r in zip(ev.unhealthy_slots, ev.unhealthy_reasons, strict=True)
    }


def test_unhealthy_after_exactly_three_consecutive_failures_once() -> None:
    _, reg = make(1)
    reg.observe("r0", hs("r0", WALL + 1, False, 1), recv=1.0)
    reg.observe("r0", hs("r0", WALL + 2, False, 2), recv=2.0)
    assert new_verdicts(reg, 2.0) == {}
    reg.observe("r0", hs("r0", WALL + 3, False, 3), recv=3.0)
    assert new_verdicts(reg, 3.0) == {0: VerdictReason.FAILURES}
    assert new_verdicts(reg, 4.0) == {}  # issued once
    reg.observe("r0", hs("r0", WALL + 4), recv=5.0)  # healthy later: the verdict stays
    assert new_verdicts(reg, 5.0) == {}
    assert reg.condemned_slots().tolist() == [0]
    assert reg.evaluate(5.0, hold_verdicts=False).condemned == 1


def test_a_success_resets_the_count() -> None:
    _, reg = make(1)
    reg.observe("r0", hs("r0", WALL + 1, False, 1), recv=1.0)
    reg.observe("r0", hs("r0", WALL + 2, False, 2), recv=2.0)
    reg.observe("r0", hs("r0", WALL + 3, True, 0), recv=3.0)
    reg.observe("r0", hs("r0", WALL + 4, False, 1), recv=4.0)
    assert new_verdicts(reg, 4.0) == {}


def test_exit_is_unhealthy_at_once_even_while_held() -> None:
    _, reg = make(2)
    reg.observe("r0", hs("r0", WALL), recv=1.0)
    assert reg.mark_exited("r0", 1.0)
    assert not reg.mark_exited("nobody", 1.0)
    assert new_verdicts(reg, 1.0, hold=True) == {0: VerdictReason.EXITED}


def test_no_responders_means_gone_but_not_for_a_replica_never_heard() -> None:
    _, reg = make(2)
    reg.observe("r0", hs("r0", WALL), recv=1.0)
    reg.probe_result("r0", ProbeOutcome.NO_RESPONDERS, recv=20.0)
    reg.probe_result("r1", ProbeOutcome.NO_RESPONDERS, recv=20.0)  # maybe still loading
    assert new_verdicts(reg, 20.0) == {0: VerdictReason.GONE}
    h1 = reg.get("r1", 20.0)
    assert h1 is not None and not h1.gone and h1.probe_timeouts == 1


def test_probe_timeouts_make_unhealthy_after_k_and_an_answer_resets() -> None:
    _, reg = make(2)
    reg.observe("r0", hs("r0", WALL), recv=0.0)
    for t in (20.0, 40.0):
        reg.probe_result("r0", ProbeOutcome.TIMEOUT, recv=t)
    assert new_verdicts(reg, 40.0) == {}
    reg.probe_result("r0", ProbeOutcome.ANSWERED, recv=45.0, status=hs("r0", WALL))
    h = reg.get("r0", 45.0)
    assert h is not None and h.probe_timeouts == 0 and h.received_at == 45.0
    for t in (60.0, 80.0):
        reg.probe_result("r0", ProbeOutcome.TIMEOUT, recv=t)
    assert new_verdicts(reg, 80.0) == {}
    reg.probe_result("r0", ProbeOutcome.TIMEOUT, recv=100.0)
    assert new_verdicts(reg, 100.0) == {0: VerdictReason.PROBE_TIMEOUTS}
    # a replica never heard from that times out K times is reported as such
    for t in (50.0, 70.0, 90.0):
        reg.probe_result("r1", ProbeOutcome.TIMEOUT, recv=t)
    assert new_verdicts(reg, 100.0) == {1: VerdictReason.NEVER_REPORTED}
    assert not reg.probe_result("nobody", ProbeOutcome.TIMEOUT, recv=100.0)


def test_an_answer_without_status_proves_life() -> None:
    _, reg = make(1)
    reg.observe("r0", hs("r0", WALL), recv=0.0)
    reg.probe_result("r0", ProbeOutcome.TIMEOUT, recv=20.0)
    reg.probe_result("r0", ProbeOutcome.ANSWERED, recv=30.0)
    h = reg.get("r0", 30.0)
    assert h is not None and h.probe_timeouts == 0 and h.fresh_until == 45.0


def test_hold_suppresses_absence_verdicts_but_not_facts() -> None:
    _, reg = make(4)
    for rid in ("r0", "r1", "r2", "r3"):
        reg.observe(rid, hs(rid, WALL), recv=0.0)
    for t in (20.0, 40.0, 60.0):
        reg.probe_result("r0", ProbeOutcome.TIMEOUT, recv=t)
    reg.probe_result("r1", ProbeOutcome.NO_RESPONDERS, recv=60.0)
    reg.observe("r2", hs("r2", WALL + 1, False, 3), recv=60.0)
    reg.mark_exited("r3", 60.0)
    ev = reg.evaluate(60.0, hold_verdicts=True)
    assert dict(zip(ev.unhealthy_slots.tolist(), ev.unhealthy_reasons.tolist(), strict=True)) == {
        2: VerdictReason.FAILURES,
        3: VerdictReason.EXITED,
    }
    assert ev.held == 2
    assert set(ev.stale_slots.tolist()) == {0, 1}  # still listed for (capped) probes
    # timeouts seen while held were discarded: no burst of verdicts when the hold ends
    h0 = reg.get("r0", 60.0)
    assert h0 is not None and h0.probe_timeouts == 0
    # gone is kept: no report during the calm period -> the verdict comes once released
    assert new_verdicts(reg, 80.0) == {1: VerdictReason.GONE}


def test_gone_is_cleared_by_a_report_during_the_hold() -> None:
    _, reg = make(1)
    reg.observe("r0", hs("r0", WALL), recv=0.0)
    reg.probe_result("r0", ProbeOutcome.NO_RESPONDERS, recv=20.0)
    assert new_verdicts(reg, 20.0, hold=True) == {}
    batch(reg, [(0, True, WALL + 10, 0)], recv=25.0)  # reconnected, reporting again
    assert new_verdicts(reg, 40.0) == {}


# -- membership ------------------------------------------------------------------------------


def test_removed_replicas_are_cleared_and_a_reused_slot_starts_afresh() -> None:
    idx, reg = make(2)
    reg.observe("r1", hs("r1", WALL, False, 3), recv=1.0)
    assert new_verdicts(reg, 1.0) == {1: VerdictReason.FAILURES}
    idx.remove("r1")
    assert reg.get("r1", 2.0) is None
    assert reg.evaluate(2.0, hold_verdicts=False).live == 1
    assert idx.add("r9") == 1  # the freed slot, reused
    reg.sync(3.0)
    h = reg.get("r9", 3.0)
    assert h is not None and h.checked_at is None and not h.condemned
    assert h.fresh_until == 3.0 + GRACE
    # an entry meant for the old occupant, resolved by id, no longer lands
    assert not reg.observe("r1", hs("r1", WALL + 1), recv=4.0)


def test_a_reuse_between_syncs_is_seen_by_id() -> None:
    idx, reg = make(2)
    reg.mark_exited("r0", 1.0)
    idx.remove("r0")
    idx.add("fresh")  # same slot 0, without a sync in between
    assert new_verdicts(reg, 2.0) == {}
    h = reg.get(0, 2.0)
    assert h is not None and h.replica_id == "fresh" and not h.exited


def test_arrays_grow_with_the_index() -> None:
    idx, reg = make(2)
    for i in range(2, 300):
        idx.add(f"r{i}")
    slots = idx.slots_for([f"r{i}" for i in range(300)])
    n = batch(reg, [(int(s), True, WALL, 0) for s in slots], recv=5.0)
    assert n == 300
    ev = reg.evaluate(5.0, hold_verdicts=False)
    assert (ev.live, ev.unreported, ev.stale) == (300, 0, 0)


def test_ten_thousand_rows_merge_vectorised() -> None:
    idx = ReplicaIndex()
    for i in range(10_000):
        idx.add(f"r{i}")
    reg = HealthRegistry(idx, PERIOD, TIMEOUT)
    rng = np.random.default_rng(7)
    slots = rng.integers(0, 10_000, size=40_000)
    ca = WALL + rng.integers(0, 1000, size=40_000).astype(np.float64)
    reg.observe_batch(slots, np.ones(40_000, bool), ca, np.zeros(40_000, np.int32), recv=1.0)
    best = np.full(10_000, -np.inf)
    np.maximum.at(best, slots, ca)
    for s in (0, 17, 4242, 9999):
        assert (checked(reg, s) or -np.inf) == best[s]

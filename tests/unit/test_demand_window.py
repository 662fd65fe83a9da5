import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.controller.demand_window import DEFAULT_MAX_GAP_S, DemandWindow
from shared.appconfig import AutoscalingConfig
from shared.errors import UsageError


def test_time_weighting_hand_computed() -> None:
    w = DemandWindow(max_gap_s=100.0)
    w.add(0.0, 2.0)  # holds 0..4
    w.add(4.0, 6.0)  # holds 4..5
    w.add(5.0, 0.0)  # holds 5..10 (now)
    assert w.mean(10.0, 10.0) == pytest.approx((2 * 4 + 6 * 1 + 0 * 5) / 10)
    assert w.coverage(10.0, 10.0) == pytest.approx(10.0)
    # a window starting inside the first sample's hold counts only its part of it
    assert w.mean(10.0, 8.0) == pytest.approx((2 * 2 + 6 * 1) / 8)
    # a window ending before the last sample ignores the query's future
    assert w.mean(4.5, 2.0) == pytest.approx((2 * 1.5 + 6 * 0.5) / 2)


def test_sample_before_window_holds_into_it() -> None:
    w = DemandWindow(max_gap_s=100.0)
    w.add(0.0, 3.0)
    assert w.mean(50.0, 10.0) == pytest.approx(3.0)
    assert w.coverage(50.0, 10.0) == pytest.approx(10.0)


def test_no_data_is_none_not_zero() -> None:
    w = DemandWindow()
    assert w.mean(10.0, 5.0) is None
    assert w.coverage(10.0, 5.0) == 0.0
    w.add(20.0, 4.0)
    # the only sample is in the future of this query
    assert w.mean(10.0, 5.0) is None
    # a lone sample exactly at `now` covers no time yet
    assert w.mean(20.0, 5.0) is None
    assert w.mean(20.5, 5.0) == pytest.approx(4.0)


def test_duplicate_time_supersedes() -> None:
    w = DemandWindow()
    w.add(0.0, 100.0)
    w.add(0.0, 1.0)
    assert w.mean(2.0, 2.0) == pytest.approx(1.0)


def test_gap_longer_than_max_gap_is_not_covered() -> None:
    w = DemandWindow(max_gap_s=2.0)
    w.add(0.0, 4.0)  # vouches for 0..2 only; the next sample comes at 10
    w.add(10.0, 1.0)  # holds 10..12
    assert w.coverage(12.0, 12.0) == pytest.approx(4.0)
    assert w.mean(12.0, 12.0) == pytest.approx((4 * 2 + 1 * 2) / 4)
    assert not w.is_full(12.0, 12.0)
    assert w.is_full(12.0, 2.0)
    # the last sample also stops vouching max_gap_s after its time
    assert w.coverage(20.0, 10.0) == pytest.approx(2.0)
    assert w.mean(30.0, 10.0) is None


def test_window_fills_as_ticks_arrive() -> None:
    w = DemandWindow(max_gap_s=0.2)
    t = 0.0
    for i in range(301):
        t = i * 0.1
        w.add(t, 1.0)
    assert not w.is_full(t, 30.1)
    assert w.is_full(t, 30.0)
    assert w.mean(t, 30.0) == pytest.approx(1.0)


def test_for_policy_uses_two_metrics_intervals() -> None:
    w = DemandWindow.for_policy(AutoscalingConfig(metrics_interval_s=3.0))
    assert w.max_gap_s == 6.0
    assert DemandWindow().max_gap_s == DEFAULT_MAX_GAP_S


@pytest.mark.parametrize(
    ("t", "v"), [(1.0, -1.0), (1.0, math.nan), (1.0, math.inf), (math.nan, 1.0)]
)
def test_bad_samples_raise(t: float, v: float) -> None:
    w = DemandWindow()
    with pytest.raises(UsageError):
        w.add(t, v)
    assert len(w) == 0


def test_time_going_backwards_raises() -> None:
    w = DemandWindow()
    w.add(5.0, 1.0)
    with pytest.raises(UsageError):
        w.add(4.9, 1.0)
    with pytest.raises(UsageError):
        w.add_many([6.0, 5.5], [1.0, 1.0])
    with pytest.raises(UsageError):
        w.add_many([4.0, 6.0], [1.0, 1.0])
    with pytest.raises(UsageError):
        w.add_many([6.0, 7.0], [1.0, -1.0])
    with pytest.raises(UsageError):
        w.add_many([6.0, 7.0], [1.0])
    assert len(w) == 1  # a bad batch appends nothing


def test_bad_query_arguments_raise() -> None:
    w = DemandWindow()
    with pytest.raises(UsageError):
        w.mean(1.0, 0.0)
    with pytest.raises(UsageError):
        w.coverage(math.nan, 1.0)
    with pytest.raises(UsageError):
        w.trim(1.0, -1.0)
    with pytest.raises(UsageError):
        DemandWindow(max_gap_s=0.0)


def test_trim_keeps_the_sample_that_holds_into_the_window() -> None:
    w = DemandWindow(max_gap_s=100.0)
    for i in range(10):
        w.add(float(i), float(i))
    before = w.mean(9.5, 3.0)
    w.trim(9.5, 3.0)
    # samples at 6.5 or later would do; 6 holds into [6.5, 9.5] so it stays, 0..5 go
    assert len(w) == 4
    assert w.mean(9.5, 3.0) == before
    w.trim(100.0, 1.0)
    assert len(w) == 1
    assert w.last_time == 9.0 and w.last_value == 9.0


def test_trim_and_growth_keep_the_series_intact() -> None:
    w = DemandWindow(max_gap_s=100.0, capacity=4)
    ref = DemandWindow(max_gap_s=100.0)
    for i in range(1000):
        t = i * 0.5
        w.add(t, float(i % 7))
        ref.add(t, float(i % 7))
        if i % 13 == 0:
            w.trim(t, 10.0)
        assert w.mean(t, 10.0) == ref.mean(t, 10.0)
    # 21 samples span a 10 s window at 0.5 s spacing, plus up to 12 added since the last trim
    assert len(w) <= 21 + 12
    # trimmed space is reused (compaction) instead of the buffer growing with the history
    assert w._t.shape[0] <= 128


def _reference(
    samples: list[tuple[float, float]], now: float, period: float, max_gap: float
) -> tuple[float, float]:
    """Slow, obvious integral: (covered seconds, integral of demand)."""
    start = now - period
    covered = integral = 0.0
    live = [s for s in samples if s[0] <= now]
    for i, (t, v) in enumerate(live):
        end = live[i + 1][0] if i + 1 < len(live) else now
        end = min(end, t + max_gap)
        d = max(0.0, end - max(t, start))
        covered += d
        integral += d * v
    return covered, integral


times = st.floats(0, 100, allow_nan=False)
demands = st.floats(0, 1000, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(times, demands), max_size=40),
    times,
    st.floats(0.01, 120),
    st.floats(0.01, 50),
)
def test_matches_slow_reference(
    samples: list[tuple[float, float]], now: float, period: float, max_gap: float
) -> None:
    samples.sort(key=lambda s: s[0])
    w = DemandWindow(max_gap_s=max_gap, capacity=2)
    for t, v in samples:
        w.add(t, v)
    covered, integral = _reference(samples, now, period, max_gap)
    assert w.coverage(now, period) == pytest.approx(covered, rel=1e-9, abs=1e-9)
    mean = w.mean(now, period)
    if covered <= 0:
        assert mean is None
    else:
        assert mean == pytest.approx(integral / covered, rel=1e-9, abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(times, demands), max_size=40),
    st.integers(0, 40),
    times,
    st.floats(0.01, 120),
)
def test_add_many_equals_repeated_add(
    samples: list[tuple[float, float]], split: int, now: float, period: float
) -> None:
    samples.sort(key=lambda s: s[0])
    one = DemandWindow(max_gap_s=5.0, capacity=1)
    for t, v in samples:
        one.add(t, v)
    bulk = DemandWindow(max_gap_s=5.0, capacity=1)
    head, tail = samples[:split], samples[split:]
    bulk.add_many([t for t, _ in head], np.array([v for _, v in head]))
    bulk.add_many(np.array([t for t, _ in tail]), [v for _, v in tail])
    assert len(one) == len(bulk) == len(samples)
    assert one.mean(now, period) == bulk.mean(now, period)
    assert one.coverage(now, period) == bulk.coverage(now, period)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(times, demands), min_size=1, max_size=40),
    st.floats(0, 60),
    st.floats(0.01, 60),
)
def test_trim_does_not_change_windows_it_promises_to_keep(
    samples: list[tuple[float, float]], keep: float, period: float
) -> None:
    samples.sort(key=lambda s: s[0])
    now = samples[-1][0] + 1.0
    period = min(period, keep) if keep > 0 else period
    w = DemandWindow(max_gap_s=3.0)
    for t, v in samples:
        w.add(t, v)
    before = (w.mean(now, period), w.coverage(now, period))
    w.trim(now, keep)
    if period <= keep:
        assert (w.mean(now, period), w.coverage(now, period)) == before


# -- a rise is averaged from its onset ---------------------------------------------------------


def _step_window(step_at: float, until: float, low: float, high: float) -> DemandWindow:
    w = DemandWindow(max_gap_s=2.0)
    for i in range(round(until * 10) + 1):
        t = i / 10
        w.add(t, high if t >= step_at else low)
    return w


def test_ray_diff_rise_is_averaged_from_its_onset() -> None:
    # idle until 10 s, then 8: one second later the 5 s mean is 1.6, the rise's own mean 8
    w = _step_window(10.0, 11.0, 0.0, 8.0)
    assert w.mean(11.0, 5.0) == pytest.approx(1.6)
    assert w.mean(11.0, 5.0, rise_above=2.0) == pytest.approx(8.0)
    mean, full = w.mean_and_full(11.0, 5.0, rise_above=2.0)
    assert mean == pytest.approx(8.0) and full  # coverage is the whole window's
    # the first tick of the rise has not held yet: it reads as itself, not as "no data"
    w = _step_window(10.0, 10.0, 0.0, 8.0)
    assert w.mean(10.0, 5.0, rise_above=2.0) == 8.0


def test_rise_level_is_the_targets_capacity() -> None:
    w = _step_window(10.0, 11.0, 1.0, 3.0)
    # 3 is not above what 2 replicas x 2 serve: the whole window counts
    assert w.mean(11.0, 5.0, rise_above=4.0) == pytest.approx((1 * 4 + 3 * 1) / 5)
    # a sample exactly at the level is not a rise: the onset is after the last one at or below
    w = DemandWindow(max_gap_s=2.0)
    for t, v in [(0.0, 4.0), (1.0, 4.0), (2.0, 6.0), (3.0, 4.0), (4.0, 6.0), (5.0, 6.0)]:
        w.add(t, v)
    assert w.mean(6.0, 6.0, rise_above=4.0) == pytest.approx(6.0)
    assert w.mean(6.0, 6.0) == pytest.approx((4 + 4 + 6 + 4 + 6 + 6) / 6)


def test_a_fall_is_judged_on_the_whole_window() -> None:
    w = _step_window(10.0, 11.0, 8.0, 0.0)
    assert w.mean(11.0, 5.0, rise_above=2.0) == pytest.approx(8 * 4 / 5)


def test_a_rise_older_than_the_window_is_the_whole_window() -> None:
    w = _step_window(2.0, 11.0, 0.0, 8.0)
    assert w.mean(11.0, 5.0, rise_above=2.0) == pytest.approx(8.0)
    assert w.mean(11.0, 5.0, rise_above=2.0) == w.mean(11.0, 5.0)


def test_policy_demand_reads_short_window_only_in_panic_mode() -> None:
    w = _step_window(10.0, 11.0, 0.0, 8.0)
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=8, look_back_period_s=5.0)
    mean, short, full = w.policy_demand(cfg, 1, 11.0)
    assert (mean, short, full) == (pytest.approx(8.0), None, True)
    panic = AutoscalingConfig(
        min_replicas=1, max_replicas=8, look_back_period_s=5.0, panic_mode=True
    )
    _, short, _ = w.policy_demand(panic, 1, 11.0)
    assert short == pytest.approx(8.0)
    # at 4 replicas (capacity 8) the same samples are no rise: the plain 5 s mean
    mean, _, _ = w.policy_demand(cfg, 4, 11.0)
    assert mean == pytest.approx(1.6)


def test_a_stale_rise_is_no_data() -> None:
    # the only sample is older than the gap limit: no time is covered, rise or not
    w = DemandWindow(max_gap_s=2.0)
    w.add(0.0, 8.0)
    assert w.mean(100.0, 5.0, rise_above=2.0) is None
    assert w.mean(100.0, 5.0) is None

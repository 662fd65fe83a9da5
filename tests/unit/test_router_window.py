import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.router.window import TimeWeightedCounts, TimeWeightedGauge


def test_time_weighted_average_per_key() -> None:
    w = TimeWeightedCounts(now=0.0)
    w.add("a", 1, 0.0)  # one request on a for the whole window
    w.add("b", 2, 5.0)  # two on b for the second half
    w.add("b", -2, 10.0)
    assert w.roll(10.0) == pytest.approx({"a": 1.0, "b": 1.0})
    # the next window carries current values over
    assert w.roll(20.0) == pytest.approx({"a": 1.0, "b": 0.0})


def test_zero_length_window_reports_current_values() -> None:
    w = TimeWeightedCounts(now=3.0)
    w.add("a", 4, 3.0)
    assert w.roll(3.0) == {"a": 4.0}
    g = TimeWeightedGauge(now=3.0)
    g.add(2, 3.0)
    assert g.roll(3.0) == 2.0


def test_forget_idle_drops_only_idle_keys_outside_keep() -> None:
    w = TimeWeightedCounts(now=0.0)
    w.add("gone_idle", 1, 0.0)
    w.add("gone_idle", -1, 1.0)
    w.add("gone_busy", 1, 0.0)
    w.add("member", 0, 0.0)
    w.forget_idle(keep={"member"})
    # gone_idle is at zero but was busy in this window: its average must still be reported
    assert set(w.keys()) == {"gone_idle", "gone_busy", "member"}
    assert w.roll(2.0) == pytest.approx({"gone_idle": 0.5, "gone_busy": 1.0, "member": 0.0})
    w.forget_idle(keep={"member"})
    assert set(w.keys()) == {"gone_busy", "member"}
    w.add("gone_busy", -1, 3.0)
    assert w.roll(4.0) == pytest.approx({"gone_busy": 0.5, "member": 0.0})
    w.forget_idle(keep={"member"})
    assert w.keys() == ("member",)
    assert w.roll(5.0) == {"member": 0.0}


def test_gauge_average() -> None:
    g = TimeWeightedGauge(now=0.0)
    g.add(1, 2.0)
    g.add(1, 6.0)
    assert g.average(8.0) == pytest.approx((1 * 4 + 2 * 2) / 8)
    assert g.roll(8.0) == pytest.approx(1.0)
    assert g.value == 2.0


@given(st.lists(st.tuples(st.floats(0, 10), st.integers(-3, 3)), max_size=30))
def test_matches_a_direct_integral(steps: list[tuple[float, int]]) -> None:
    steps = sorted(steps)
    w = TimeWeightedCounts(now=0.0)
    g = TimeWeightedGauge(now=0.0)
    for t, d in steps:
        w.add("k", d, t)
        g.add(d, t)
    end = 10.0
    area, value, last = 0.0, 0.0, 0.0
    for t, d in steps:
        area += value * (t - last)
        value, last = value + d, t
    area += value * (end - last)
    assert w.roll(end).get("k", 0.0) == pytest.approx(area / end, abs=1e-9)
    assert g.roll(end) == pytest.approx(area / end, abs=1e-9)

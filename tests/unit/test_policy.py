from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.controller.policy import (
    DOWN,
    NONE,
    UP,
    Decision,
    PolicyInputs,
    PolicyState,
    decide,
    desired_replicas,
    initial_state,
)
from shared.appconfig import AutoscalingConfig
from shared.errors import UsageError

TICK = 0.1
AS_TARGET = -1  # inputs(): as many replicas running as the target


def config(**kw: Any) -> AutoscalingConfig:
    base: dict[str, Any] = dict(
        min_replicas=0,
        max_replicas=10,
        target_ongoing_requests=2.0,
        upscale_delay_s=3.0,
        downscale_delay_s=10.0,
        downscale_to_zero_delay_s=20.0,
    )
    base.update(kw)
    return AutoscalingConfig(**base)


def inputs(
    mean: float | None,
    *,
    short: float | None = None,
    full: bool = True,
    cold: bool = False,
    running: int = AS_TARGET,
) -> PolicyInputs:
    return PolicyInputs(
        demand_mean=mean,
        demand_short=short,
        window_full=full,
        cold_start=cold,
        running_replicas=running,
    )


def step(
    cfg: AutoscalingConfig, s: PolicyState, inp: PolicyInputs, now: float
) -> tuple[PolicyState, Decision]:
    """`decide`, with every replica of the target running unless the inputs say otherwise."""
    if inp.running_replicas == AS_TARGET:
        inp = dataclasses.replace(inp, running_replicas=s.target)
    return decide(cfg, s, inp, now)


def state(target: int, **kw: Any) -> PolicyState:
    return PolicyState(target=target, watch_start=kw.pop("watch_start", 0.0), **kw)


def run(
    cfg: AutoscalingConfig, st0: PolicyState, inp: PolicyInputs, start: float, ticks: int
) -> tuple[PolicyState, list[tuple[float, Decision]]]:
    """Feed the same inputs every TICK, accumulating time by addition as a control loop does."""
    out = []
    now = start
    s = st0
    for _ in range(ticks):
        s, d = step(cfg, s, inp, now)
        out.append((now, d))
        now += TICK
    return s, out


def first_change(log: list[tuple[float, Decision]]) -> tuple[int, Decision]:
    for i, (_, d) in enumerate(log):
        if d.changed:
            return i, d
    raise AssertionError("no change")


# -- desired replicas and smoothing ------------------------------------------------------------


@pytest.mark.parametrize(
    ("current", "demand", "up", "down", "expected"),
    [
        (2, 7.6, 1.0, 1.0, 4),  # ceil(3.8)
        (2, 4.0, 1.0, 1.0, 2),  # exactly at target
        (2, 12.0, 0.5, 1.0, 4),  # 2 + 0.5 * (6 - 2)
        (2, 12.0, 0.1, 1.0, 3),  # ceil(2.4): a growing change moves at least one
        (2, 6.0, 2.0, 1.0, 4),  # 2 + 2 * (3 - 2): factors above 1 overshoot, as in Ray
        (8, 4.0, 1.0, 0.5, 5),  # ceil(8 - 0.5 * 6)
        (8, 4.0, 1.0, 0.1, 7),  # ceil(7.4) == 8 would be stuck: Ray moves one
        (8, 1.0, 1.0, 1.0, 1),  # ceil(0.5)
        (2, 3.0, 1.0, 3.0, 2),  # ceil(1.5) == current: no change, whatever the factor
        (0, 1e-6, 1.0, 1.0, 1),
        (3, 0.0, 1.0, 1.0, 0),
    ],
)
def test_desired_replicas_follows_ray_smoothing(
    current: int, demand: float, up: float, down: float, expected: int
) -> None:
    cfg = config(upscaling_factor=up, downscaling_factor=down)
    assert desired_replicas(cfg, current, demand) == expected


def test_desired_replicas_is_not_fooled_by_float_ratio() -> None:
    cfg = config(target_ongoing_requests=0.1, max_replicas=100)
    assert desired_replicas(cfg, 1, 1.1) == 11  # 1.1 / 0.1 == 11.000000000000002


def test_desired_replicas_clipped_to_bounds() -> None:
    cfg = config(min_replicas=2, max_replicas=5)
    assert desired_replicas(cfg, 3, 100.0) == 5
    assert desired_replicas(cfg, 3, 0.0) == 2


def test_initial_state() -> None:
    assert initial_state(config(), 5.0) == PolicyState(target=0, watch_start=5.0)
    assert initial_state(config(min_replicas=1, initial_replicas=3), 1.0).target == 3


def test_state_validation() -> None:
    with pytest.raises(UsageError):
        PolicyState(target=-1, watch_start=0.0)
    with pytest.raises(UsageError):
        PolicyState(target=1, watch_start=0.0, pending=UP)


# -- delays ------------------------------------------------------------------------------------


def test_upscale_waits_exactly_the_delay() -> None:
    cfg = config()
    s = state(2)
    s, d = step(cfg, s, inputs(7.6), 100.0)
    assert (d.target, d.desired, d.changed) == (2, 4, False)
    assert (s.pending, s.pending_since) == (UP, 100.0)
    s1, d = step(cfg, s, inputs(7.6), 102.9)
    assert (d.target, d.changed) == (2, False)
    assert d.reason == "hold: waiting 2.9/3.0 s upscale delay (2->4)"
    assert d.rule == "waiting"
    s2, d = step(cfg, s1, inputs(7.6), 103.0)
    assert (d.target, d.changed) == (4, True)
    assert d.reason == "upscale 2->4: demand 7.6 / target 2 for 3.0 s"
    assert d.rule == "upscale"
    assert (s2.target, s2.pending, s2.pending_since) == (4, NONE, None)


def test_delay_on_accumulated_ticks_acts_on_the_boundary_tick() -> None:
    # 0.1 added 30 times is 2.9999999999999996: the 31st tick is the one at the delay.
    _, log = run(config(), state(2), inputs(7.6), 0.0, 40)
    i, d = first_change(log)
    assert i == 30
    assert d.target == 4


def test_zero_delay_acts_on_the_first_tick() -> None:
    cfg = config(upscale_delay_s=0.0, downscale_delay_s=0.0, downscale_to_zero_delay_s=0.0)
    _, d = step(cfg, state(2), inputs(7.6), 1.0)
    assert d.target == 4
    _, d = step(cfg, state(4), inputs(2.0), 1.0)
    assert d.target == 1


def test_downscale_waits_exactly_the_delay() -> None:
    cfg = config()
    s, d = step(cfg, state(4), inputs(3.1), 50.0)
    assert (d.target, d.desired, s.pending) == (4, 2, DOWN)
    _, d = step(cfg, s, inputs(3.1), 59.9)
    assert d.target == 4
    assert d.reason == "hold: waiting 9.9/10.0 s downscale delay (4->2)"
    _, d = step(cfg, s, inputs(3.1), 60.0)
    assert (d.target, d.changed) == (2, True)
    assert d.reason == "downscale 4->2: demand 3.1 / target 2 for 10.0 s"


def test_to_zero_goes_through_one_and_uses_the_to_zero_delay() -> None:
    cfg = config()  # downscale 10 s, to zero 20 s
    s = state(3)
    s, log = run(cfg, s, inputs(0.0), 0.0, 101)
    i, d = first_change(log)
    assert (i, d.target) == (100, 1)  # N -> 1 after the downscale delay, never straight to 0
    s, log = run(cfg, s, inputs(0.0), 10.1, 201)
    changes = [(t, d) for t, d in log if d.changed]
    assert [d.target for _, d in changes] == [0]
    assert changes[0][0] == pytest.approx(30.1)
    assert "to-zero delay" in log[5][1].reason


def test_to_zero_delay_defaults_to_downscale_delay() -> None:
    cfg = config(downscale_to_zero_delay_s=None, downscale_delay_s=4.0)
    _, log = run(cfg, state(1), inputs(0.0), 0.0, 50)
    i, d = first_change(log)
    assert (i, d.target) == (40, 0)


def test_reversal_resets_the_timer() -> None:
    cfg = config(upscale_delay_s=3.0, downscale_delay_s=3.0)
    s, _ = step(cfg, state(4), inputs(20.0), 0.0)  # wants up
    s, _ = step(cfg, s, inputs(20.0), 2.5)
    s, d = step(cfg, s, inputs(1.0), 2.6)  # wants down: the up timer is gone
    assert (s.pending, s.pending_since, d.target) == (DOWN, 2.6, 4)
    s, d = step(cfg, s, inputs(20.0), 2.7)  # up again: starts from here
    assert (s.pending, s.pending_since) == (UP, 2.7)
    s, d = step(cfg, s, inputs(20.0), 5.6)
    assert d.target == 4
    _, d = step(cfg, s, inputs(20.0), 5.7)
    assert d.target == 10


def test_steady_tick_and_missing_data_reset_the_timer() -> None:
    cfg = config()
    s, _ = step(cfg, state(2), inputs(7.6), 0.0)
    s, d = step(cfg, s, inputs(4.0), 1.0)  # exactly at target: steady
    assert (s.pending, d.reason) == (NONE, "hold: steady at 2 (demand 4.0 / target 2)")
    s, _ = step(cfg, s, inputs(7.6), 2.0)
    s, d = step(cfg, s, inputs(None), 3.0)
    assert (s.pending, d.target, d.changed) == (NONE, 2, False)
    _, d = step(cfg, s, inputs(7.6), 5.5)
    assert d.target == 2  # the timer restarted at 5.5


def test_missing_data_never_reads_as_zero_load() -> None:
    cfg = config(downscale_delay_s=0.0, downscale_to_zero_delay_s=0.0)
    _, log = run(cfg, state(3), inputs(None), 0.0, 50)
    assert all(d.target == 3 and not d.changed for _, d in log)
    assert log[0][1].reason == "hold: no demand data in the look-back window"


# -- cold start, restart grace -----------------------------------------------------------------


def test_cold_start_is_immediate() -> None:
    cfg = config(upscale_delay_s=1000.0)
    _, d = step(cfg, state(0), inputs(None, cold=True, full=False), 5.0)
    assert (d.target, d.changed) == (1, True)
    assert d.reason == "cold start from zero 0->1: queued request"
    assert d.rule == "cold_start"
    _, d = step(cfg, state(0), inputs(9.0), 5.0)
    assert d.target == 5
    # short-window demand wakes it only in panic mode (the short window may reach back to load
    # that the look-back window has already forgotten)
    _, d = step(cfg, state(0), inputs(None, short=0.5, full=False), 5.0)
    assert d.target == 0
    panic = config(upscale_delay_s=1000.0, panic_mode=True)
    _, d = step(panic, state(0), inputs(None, short=0.5, full=False), 5.0)
    assert d.target == 1


def test_cold_start_respects_min_and_max() -> None:
    # a target of 0 with min 2 is out of bounds and clipped anyway; min 0 but desired above max:
    _, d = step(config(max_replicas=3), state(0), inputs(100.0, cold=True), 0.0)
    assert d.target == 3


def test_no_demand_at_zero_stays_at_zero() -> None:
    _, log = run(config(upscale_delay_s=0.0), state(0), inputs(0.0, short=0.0), 0.0, 5)
    assert all(d.target == 0 and not d.changed for _, d in log)


def test_window_not_full_forbids_decrease_but_allows_increase() -> None:
    cfg = config(upscale_delay_s=1.0, downscale_delay_s=0.0, downscale_to_zero_delay_s=0.0)
    s0 = state(4, watch_start=100.0)
    s, log = run(cfg, s0, inputs(0.0, full=False), 100.0, 50)
    assert all(d.target == 4 for _, d in log)
    assert s.pending == NONE  # the downscale timer does not run on a partial window
    assert log[12][1].reason == "hold: window not full (rebuilding after start, 1.2 s ago)"
    _, log = run(cfg, s0, inputs(20.0, full=False), 100.0, 20)
    i, d = first_change(log)
    assert (i, d.target) == (10, 10)


def test_downscale_timer_starts_when_the_window_fills() -> None:
    cfg = config(downscale_delay_s=2.0)
    s, _ = run(cfg, state(4), inputs(0.0, full=False), 0.0, 100)
    s, log = run(cfg, s, inputs(0.0, full=True), 10.0, 30)
    i, d = first_change(log)
    assert (i, d.target) == (20, 1)


# -- panic -------------------------------------------------------------------------------------


def test_panic_scales_up_at_once() -> None:
    cfg = config(panic_mode=True, upscale_delay_s=1000.0)
    s, d = step(cfg, state(2), inputs(4.0, short=9.0, running=2), 10.0)
    assert (d.target, d.changed) == (5, True)
    assert d.reason == "panic 2->5: short-window demand 9.0 >= 2x capacity 4"
    assert s.panic_until == 16.0


def test_panic_threshold_boundary_and_mode_off() -> None:
    cfg = config(panic_mode=True, upscale_delay_s=1000.0)
    _, d = step(cfg, state(2), inputs(4.0, short=7.9, running=2), 0.0)
    assert d.target == 2
    _, d = step(cfg, state(2), inputs(4.0, short=8.0, running=2), 0.0)
    assert d.target == 4
    _, d = step(config(upscale_delay_s=1000.0), state(2), inputs(4.0, short=9.0, running=2), 0.0)
    assert d.target == 2


def test_panic_waits_for_a_running_replica() -> None:
    cfg = config(panic_mode=True, upscale_delay_s=1000.0)
    s, d = step(cfg, state(2), inputs(1.0, short=10.0, running=0), 0.0)
    assert (d.target, d.rule) == (2, "starting")
    _, d = step(cfg, s, inputs(1.0, short=10.0, running=1), 1.0)
    assert (d.target, d.rule) == (5, "panic")


def test_no_downscale_until_panic_calms() -> None:
    cfg = config(panic_mode=True, downscale_delay_s=0.0)
    s, d = step(cfg, state(2), inputs(4.0, short=9.0, running=2), 10.0)
    assert d.target == 5
    s, d = step(cfg, s, inputs(0.5, short=0.0, running=5), 15.9)
    assert d.target == 5
    assert d.reason == "hold: no scale-down while panicking (0.1 s left)"
    assert d.rule == "panic_hold"
    s, d = step(cfg, s, inputs(0.5, short=0.0, running=5), 16.0)
    assert (d.target, s.panic_until) == (1, None)


def test_panic_never_lowers_and_normal_upscale_still_waits() -> None:
    cfg = config(panic_mode=True, upscale_delay_s=2.0)
    # panicking, but the panic target (3) is below the current target: keep 6, no decrease
    s, d = step(cfg, state(6), inputs(30.0, short=6.0, running=1), 0.0)
    assert (d.target, s.pending, s.panic_until) == (6, UP, 6.0)
    _, d = step(cfg, s, inputs(30.0, short=6.0, running=1), 2.0)
    assert d.target == 10


# -- bounds and fixed size ---------------------------------------------------------------------


def test_fixed_size_always_returns_that_size() -> None:
    cfg = config(min_replicas=3, max_replicas=3)
    for inp in (inputs(None), inputs(100.0, short=100.0), inputs(0.0, cold=True)):
        _, d = step(cfg, state(3), inp, 0.0)
        assert (d.target, d.changed, d.reason) == (3, False, "fixed size 3")
    _, d = step(cfg, state(1), inputs(0.0, full=False), 0.0)
    assert (d.target, d.changed) == (3, True)


def test_target_outside_new_bounds_is_clipped_at_once() -> None:
    cfg = config(min_replicas=2, max_replicas=5)
    _, d = step(cfg, state(8), inputs(None, full=False), 0.0)
    assert (d.target, d.changed, d.reason) == (5, True, "bounds 8->5: min 2, max 5")
    _, d = step(cfg, state(0), inputs(None), 0.0)
    assert d.target == 2


# -- differences from Ray Serve (docs/deploy.md): one test per row ----------------------------


def test_ray_diff_jump_from_zero_goes_to_the_need() -> None:
    # Ray: max(ceil(upscaling_factor), target) = 1; here the need, ceil(10 / 2), at once
    _, d = step(config(upscale_delay_s=1000.0), state(0), inputs(10.0), 0.0)
    assert (d.target, d.rule) == (5, "cold_start")
    # Ray: ceil(3 * 1) = 3 for demand 1; here the factor does not multiply a jump from zero
    _, d = step(config(upscaling_factor=3.0), state(0), inputs(1.0), 0.0)
    assert d.target == 1


def test_ray_diff_starting_replicas_hold_the_target() -> None:
    # matches Ray: with none running the target holds, however large or small the demand
    cfg = config(min_replicas=1, target_ongoing_requests=1.0, upscale_delay_s=0.5)
    s, log = run(cfg, state(1), inputs(10.0, running=0), 0.0, 20)
    assert all(d.target == 1 and d.rule == "starting" for _, d in log)
    cfg = config(target_ongoing_requests=3.0, downscale_delay_s=0.0, downscale_to_zero_delay_s=0.0)
    _, log = run(cfg, state(3), inputs(0.0, running=0), 0.0, 20)
    assert all(d.target == 3 for _, d in log)
    # the first running replica ends the hold: 1 running, need 10, after the delay
    _, log = run(
        config(target_ongoing_requests=1.0, upscale_delay_s=0.5),
        s,
        inputs(10.0, running=1),
        2.0,
        10,
    )
    _, d = first_change(log)
    assert d.target == 10


def test_ray_diff_factors_smooth_from_the_running_count() -> None:
    # matches Ray: target 4 with 2 running, demand 12 (need 6), factor 0.5: 2 + 0.5 * 4 = 4, hold
    cfg = config(upscaling_factor=0.5, upscale_delay_s=0.0)
    _, d = step(cfg, state(4), inputs(12.0, running=2), 0.0)
    assert (d.target, d.rule) == (4, "steady")
    # once they run: 4 + 0.5 * 2 = 5
    _, d = step(cfg, state(4), inputs(12.0, running=4), 0.0)
    assert d.target == 5


def test_ray_diff_ratio_rounding_near_integers() -> None:
    # kept: 1.8 / 0.3 is 6.000000000000001 in floats; Ray asks for 7, we keep 6
    cfg = config(target_ongoing_requests=0.3, upscale_delay_s=0.0)
    _, d = step(cfg, state(6), inputs(1.8), 0.0)
    assert (d.target, d.rule) == (6, "steady")
    assert desired_replicas(config(target_ongoing_requests=0.1, max_replicas=20), 1, 1.1) == 11


def test_ray_diff_downscaling_factor_needs_a_lower_ceil() -> None:
    # kept: 4 running, need 3.5 (ceil 4): Ray with downscaling_factor 2 shrinks to 3
    cfg = config(downscaling_factor=2.0, downscale_delay_s=0.0)
    _, d = step(cfg, state(4), inputs(7.0), 0.0)
    assert (d.target, d.rule) == (4, "steady")


def test_ray_diff_no_scale_down_until_the_window_is_full() -> None:
    # kept: Ray would start its downscale timer on the first tick after a restart
    cfg = config(downscale_delay_s=0.0)
    _, d = step(cfg, state(4), inputs(0.0, full=False), 0.0)
    assert (d.target, d.rule) == (4, "window_not_full")


def test_ray_diff_missing_data_is_not_zero_load() -> None:
    # kept: Ray reads "no metrics" as 0 requests and scales down; we hold
    cfg = config(downscale_delay_s=0.0)
    _, d = step(cfg, state(4), inputs(None), 0.0)
    assert (d.target, d.rule) == (4, "no_data")


# -- properties --------------------------------------------------------------------------------


@st.composite
def configs(draw: st.DrawFn) -> AutoscalingConfig:
    lo = draw(st.integers(0, 4))
    hi = lo + draw(st.integers(0, 6))
    return AutoscalingConfig(
        min_replicas=lo,
        max_replicas=max(hi, 1),
        target_ongoing_requests=draw(st.sampled_from([0.5, 1.0, 2.0, 3.5])),
        upscale_delay_s=draw(st.sampled_from([0.0, 0.3, 1.0])),
        downscale_delay_s=draw(st.sampled_from([0.0, 0.5, 2.0])),
        downscale_to_zero_delay_s=draw(st.sampled_from([None, 0.0, 1.0, 3.0])),
        upscaling_factor=draw(st.sampled_from([0.3, 1.0, 2.0])),
        downscaling_factor=draw(st.sampled_from([0.3, 1.0, 2.0])),
        panic_mode=draw(st.booleans()),
        panic_window_s=draw(st.sampled_from([0.5, 2.0])),
    )


demand = st.one_of(st.none(), st.floats(0, 40, allow_nan=False))
tick_inputs = st.builds(
    PolicyInputs,
    demand_mean=demand,
    demand_short=demand,
    window_full=st.booleans(),
    cold_start=st.booleans(),
    running_replicas=st.integers(0, 12),
)


@st.composite
def states(draw: st.DrawFn, cfg: AutoscalingConfig, now: float) -> PolicyState:
    target = draw(st.integers(cfg.min_replicas, cfg.max_replicas))
    pending = draw(st.sampled_from([NONE, UP, DOWN]))
    since = None if pending == NONE else now - draw(st.floats(0, 5))
    panic = draw(st.one_of(st.none(), st.floats(now - 3, now + 3)))
    return PolicyState(target, now - 10.0, pending, since, panic)


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_single_step_properties(data: st.DataObject) -> None:
    cfg = data.draw(configs())
    now = data.draw(st.floats(0, 1000))
    s0 = data.draw(states(cfg, now))
    inp = data.draw(tick_inputs)
    s1, d = decide(cfg, s0, inp, now)
    assert cfg.min_replicas <= d.target <= cfg.max_replicas
    assert cfg.min_replicas <= d.desired <= cfg.max_replicas
    assert s1.target == d.target
    assert d.changed == (d.target != s0.target)
    assert decide(cfg, s0, inp, now) == (s1, d)  # deterministic
    if not inp.window_full:
        assert d.target >= s0.target
    if s0.panic_until is not None and now < s0.panic_until:
        assert d.target >= s0.target
    if inp.demand_mean is None and not (s0.target == 0 and d.changed):
        assert d.target == s0.target
    if cfg.min_replicas == cfg.max_replicas:
        assert d.target == cfg.min_replicas
    elif s0.target == 0 and (inp.cold_start or (inp.demand_mean or 0) > 0):
        assert d.target >= 1 and d.rule == "cold_start"


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_no_decrease_while_panicking(data: st.DataObject) -> None:
    cfg = dataclasses.replace(
        data.draw(configs()),
        panic_mode=True,
        downscale_delay_s=0.0,
        downscale_to_zero_delay_s=0.0,
    )
    now = data.draw(st.floats(0, 1000))
    s0 = dataclasses.replace(data.draw(states(cfg, now)), panic_until=now + 0.01)
    inp = dataclasses.replace(data.draw(tick_inputs), window_full=True)
    _, d = decide(cfg, s0, inp, now)
    assert d.target >= s0.target


@settings(max_examples=200, deadline=None)
@given(
    configs(),
    st.lists(st.tuples(st.sampled_from([0.1, 0.2, 0.5]), tick_inputs), min_size=1, max_size=60),
)
def test_sequence_changes_only_after_their_delay(
    cfg: AutoscalingConfig, ticks: list[tuple[float, PolicyInputs]]
) -> None:
    s = initial_state(cfg, 0.0)
    now = 0.0
    history: list[tuple[float, PolicyInputs, int]] = []  # (time, inputs, target before the tick)
    for dt, inp in ticks:
        now += dt
        before = s.target
        s, d = decide(cfg, s, inp, now)
        history.append((now, inp, before))
        if not d.changed or cfg.min_replicas == cfg.max_replicas:
            continue
        if d.reason.startswith(("cold start", "panic", "bounds")):
            assert d.target > before
            continue
        if d.target > before:
            delay = cfg.upscale_delay_s
        else:
            delay = cfg.to_zero_delay_s if d.target == 0 else cfg.downscale_delay_s
        # some earlier tick started a run, at least `delay` ago, of ticks that all had data,
        # the same target, and (for a decrease) a full window
        ok = False
        for t0, _, _ in reversed(history):
            run_ = [h for h in history if h[0] >= t0]
            if not all(h[1].demand_mean is not None and h[2] == before for h in run_):
                break
            if d.target < before and not all(h[1].window_full for h in run_):
                break
            if now - t0 >= delay - 1e-9:
                ok = True
                break
        assert ok, (d, delay, history[-5:])


def test_decision_and_state_are_frozen() -> None:
    s, d = step(config(), state(1), inputs(1.0), 0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.target = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.target = 3  # type: ignore[misc]

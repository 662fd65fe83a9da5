"""Step response of the pure core (DemandWindow + decide) on a fake clock.

The loop below is the controller's, reduced to what decides: every 0.1 s tick it samples the
demand the latest report carries (reports arrive every metrics interval, at a phase the test
varies), reads the window as the controller does (`policy_demand`) and applies the decision;
a replica runs `START_S` after the target asks for it.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from services.controller.demand_window import DemandWindow
from services.controller.policy import PolicyInputs, PolicyState, decide
from shared.appconfig import AutoscalingConfig

TICK = 0.1
START_S = 0.5


def config(**kw: float | bool) -> AutoscalingConfig:
    base: dict[str, float | bool] = dict(
        min_replicas=0,
        max_replicas=16,
        target_ongoing_requests=2.0,
        look_back_period_s=5.0,
        metrics_interval_s=1.0,
        upscale_delay_s=2.0,
        downscale_delay_s=10.0,
        downscale_to_zero_delay_s=5.0,
    )
    base.update(kw)
    return AutoscalingConfig(**base)  # type: ignore[arg-type]


@dataclass
class Run:
    times: list[float]
    targets: list[int]

    def first_at_least(self, n: int) -> float:
        return next(t for t, x in zip(self.times, self.targets, strict=True) if x >= n)

    def changes(self) -> list[int]:
        out = [self.targets[0]]
        for x in self.targets[1:]:
            if x != out[-1]:
                out.append(x)
        return out


def simulate(
    cfg: AutoscalingConfig,
    demand_at: Callable[[float], float],
    *,
    initial: int,
    start: float,
    until: float,
    phase: float,
) -> Run:
    window = DemandWindow.for_policy(cfg)
    state = PolicyState(target=initial, watch_start=start)
    ready_at = [-math.inf] * initial
    times: list[float] = []
    targets: list[int] = []
    interval = cfg.metrics_interval_s
    for i in range(round((until - start) / TICK) + 1):
        now = start + i * TICK
        last_report = math.floor((now - phase) / interval) * interval + phase
        window.add(now, demand_at(last_report))
        mean, short, full = window.policy_demand(cfg, state.target, now)
        running = bisect.bisect_right(ready_at, now)
        inputs = PolicyInputs(mean, short, full, False, running)
        state, decision = decide(cfg, state, inputs, now)
        while len(ready_at) < decision.target:
            ready_at.append(now + START_S)
        del ready_at[decision.target :]
        window.trim(now, max(cfg.look_back_period_s, cfg.panic_window_s))
        if now >= 0:
            times.append(now)
            targets.append(decision.target)
    return Run(times, targets)


PHASES = [0.05, 0.5, 0.95]


@pytest.mark.parametrize("phase", PHASES)
def test_step_reaches_the_need_in_one_move_within_delay_plus_one_interval(phase: float) -> None:
    cfg = config(min_replicas=1)
    run = simulate(
        cfg, lambda t: 8.0 if t >= 0 else 0.0, initial=1, start=-20.0, until=30.0, phase=phase
    )
    assert run.changes() == [1, 4]  # no 1 -> 3 -> 4, no overshoot
    reached = run.first_at_least(4)
    assert reached <= cfg.upscale_delay_s + cfg.metrics_interval_s + TICK + 1e-9
    assert reached >= cfg.upscale_delay_s  # the delay still protects against blips


@pytest.mark.parametrize("phase", PHASES)
def test_ramp_never_overshoots_or_scales_back(phase: float) -> None:
    cfg = config(min_replicas=1)

    def ramp(t: float) -> float:
        return min(max(t, 0.0) * 0.8, 8.0)  # 0 -> 8 over 10 s, then 8

    run = simulate(cfg, ramp, initial=1, start=-20.0, until=60.0, phase=phase)
    assert run.targets == sorted(run.targets)  # never scales back
    assert max(run.targets) == 4 == run.targets[-1]


@pytest.mark.parametrize("phase", PHASES)
def test_fall_to_zero_goes_down_once_through_one(phase: float) -> None:
    cfg = config()
    run = simulate(
        cfg, lambda t: 0.0 if t >= 0 else 8.0, initial=4, start=-20.0, until=40.0, phase=phase
    )
    assert run.changes() == [4, 1, 0]
    t1 = next(t for t, x in zip(run.times, run.targets, strict=True) if x == 1)
    t0 = next(t for t, x in zip(run.times, run.targets, strict=True) if x == 0)
    # the 5 s mean must drop below 3 replicas' worth, then the downscale and to-zero delays
    assert cfg.downscale_delay_s < t1 <= cfg.downscale_delay_s + cfg.look_back_period_s + 1.5
    assert t0 - t1 == pytest.approx(cfg.to_zero_delay_s, abs=TICK + 1e-9)


def test_a_blip_shorter_than_the_delay_does_not_scale() -> None:
    cfg = config(min_replicas=1)
    run = simulate(
        cfg, lambda t: 8.0 if 0 <= t < 1.0 else 0.0, initial=1, start=-20.0, until=30.0, phase=0.5
    )
    assert run.changes() == [1]


def test_panic_jumps_at_the_first_report_of_the_step() -> None:
    cfg = config(min_replicas=1, panic_mode=True)
    run = simulate(
        cfg, lambda t: 8.0 if t >= 0 else 0.0, initial=1, start=-20.0, until=30.0, phase=0.5
    )
    assert run.changes() == [1, 4]
    assert run.first_at_least(4) <= 0.5 + TICK + 1e-9

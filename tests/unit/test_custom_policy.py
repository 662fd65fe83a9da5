"""The custom policy wrapper: loading, the context, the controller rules over it, isolation."""

from __future__ import annotations

import math
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import pytest
from prometheus_client import REGISTRY

from services.controller import custom_policy as cp
from services.controller.custom_policy import (
    AutoscalingContext,
    CustomMetric,
    CustomPolicy,
    PolicyLoadError,
    PolicyTelemetry,
    load_policy,
    policy_problem,
)
from services.controller.deployment_state import StateEvent
from services.controller.metrics import Exporter
from services.controller.policy import Decision, PolicyInputs, PolicyState, decide
from services.controller.policy_runner import InlineRunner
from shared.appconfig import AutoscalingConfig

CFG = AutoscalingConfig(
    min_replicas=1, max_replicas=8, upscale_delay_s=5, policy="tests.unit.test_custom_policy:seen"
)
KV = (MappingProxyType({"kv_cache_use": CustomMetric(1.8, 0.9, 2)}), 3.0)
SEEN: list[AutoscalingContext] = []


def seen(ctx: AutoscalingContext) -> int:
    SEEN.append(ctx)
    return 5


class Timer:
    """A fake perf counter: each read moves it by `step`."""

    def __init__(self, step: float = 0.001) -> None:
        self.t, self.step = 0.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def inputs(**change: Any) -> PolicyInputs:
    values: dict[str, Any] = dict(
        demand_mean=4.0, demand_short=None, window_full=True, cold_start=False, running_replicas=2
    )
    values.update(change)
    return PolicyInputs(**values)


class Wrapped:
    """A CustomPolicy with the in-process runner that calls its function."""

    def __init__(self, policy: CustomPolicy, runner: InlineRunner) -> None:
        self.policy, self.runner = policy, runner

    def decide(
        self, cfg: AutoscalingConfig, state: PolicyState, inputs: PolicyInputs, metrics: Any,
        now: float,
    ) -> tuple[PolicyState, Decision, list[StateEvent]]:  # fmt: skip
        return self.policy.decide(cfg, state, inputs, metrics, now, self.runner)


def wrapper(
    fn: Callable[[AutoscalingContext], Any] | None,
    *,
    timer: Timer | None = None,
    telemetry: PolicyTelemetry | None = None,
) -> Wrapped:
    def loader(path: str) -> Callable[[AutoscalingContext], Any]:
        if fn is None:
            raise PolicyLoadError("cannot import 'nowhere': ModuleNotFoundError")
        return fn

    tel = telemetry if telemetry is not None else PolicyTelemetry()
    policy = CustomPolicy("shop", "Model", "pkg.mod:fn", telemetry=tel)
    return Wrapped(policy, InlineRunner(loader=loader, timer=timer or Timer()))


STATE = PolicyState(target=2, watch_start=0.0)


def test_the_policy_sees_documented_inputs_and_its_count_is_the_target() -> None:
    SEEN.clear()
    tel = PolicyTelemetry()
    p = Wrapped(CustomPolicy("shop", "Model", CFG.policy or "", telemetry=tel), InlineRunner())
    state, d, events = p.decide(CFG, STATE, inputs(), KV, 100.0)
    assert (d.target, d.rule, d.changed, state.target) == (5, "custom", True, 5)
    assert "policy tests.unit.test_custom_policy:seen says 5" in d.reason and events == []
    ctx = SEEN[-1]
    assert (ctx.app_name, ctx.deployment_name) == ("shop", "Model")
    assert (ctx.current_num_replicas, ctx.target_num_replicas) == (2, 2)
    assert (ctx.total_num_requests, ctx.total_queued_requests) == (4.0, 3.0)
    assert ctx.custom_metrics["kv_cache_use"] == CustomMetric(1.8, 0.9, 2)
    assert (ctx.capacity_adjusted_min_replicas, ctx.capacity_adjusted_max_replicas) == (1, 8)
    assert ctx.current_time == 100.0 and ctx.config is CFG and ctx.window_full
    assert ctx.policy_state == {}
    with pytest.raises(AttributeError):
        ctx.target_num_replicas = 3  # type: ignore[misc]
    assert tel.calls[("shop", "Model", cp.OK)] == 1


def test_no_delay_applies_to_a_custom_count() -> None:
    p = wrapper(lambda ctx: 1)
    # the default policy would wait upscale_delay_s / downscale_delay_s; a custom one decides
    _, d, _ = p.decide(CFG, PolicyState(target=4, watch_start=0.0), inputs(), KV, 1.0)
    assert d.target == 1


def test_rays_pair_carries_policy_state_to_the_next_call() -> None:
    states: list[dict[str, Any]] = []

    def counting(ctx: AutoscalingContext) -> tuple[int, dict[str, Any]]:
        states.append(dict(ctx.policy_state))
        n = int(ctx.policy_state.get("calls", 0)) + 1
        return 3, {"calls": n}

    p = wrapper(counting)
    for t in range(3):
        p.decide(CFG, STATE, inputs(), KV, float(t))
    assert states == [{}, {"calls": 1}, {"calls": 2}]


def test_a_float_is_rounded_up_as_ray_does() -> None:
    _, d, _ = wrapper(lambda ctx: 2.1).decide(CFG, STATE, inputs(), KV, 0.0)
    assert d.target == 3 and d.rule == "custom"


@pytest.mark.parametrize(("said", "target"), [(50, 8), (0, 1)])
def test_a_count_outside_the_bounds_is_clipped_and_counted(said: int, target: int) -> None:
    tel = PolicyTelemetry()
    p = wrapper(lambda ctx: said, telemetry=tel)
    _, d, events = p.decide(CFG, STATE, inputs(), KV, 0.0)
    assert d.target == target and d.rule == "custom"
    assert tel.calls[("shop", "Model", cp.CLIPPED)] == 1
    assert [e.kind for e in events] == ["custom_policy_clipped"]
    assert f"{said} -> {target} [1, 8]" in events[0].detail


def test_at_zero_a_queued_request_wakes_the_deployment_whatever_the_policy_says() -> None:
    cfg = AutoscalingConfig(min_replicas=0, max_replicas=4, policy="pkg.mod:fn")
    p = wrapper(lambda ctx: 0)
    at_zero = PolicyState(target=0, watch_start=0.0)
    _, d, _ = p.decide(cfg, at_zero, inputs(cold_start=True, running_replicas=0), KV, 0.0)
    assert d.target == 1 and "wakes" in d.reason
    _, d, _ = p.decide(cfg, at_zero, inputs(running_replicas=0), KV, 0.0)
    assert d.target == 0  # no queued request: the policy's 0 stands


def test_no_scale_down_before_the_window_is_full() -> None:
    p = wrapper(lambda ctx: 1)
    state, d, _ = p.decide(CFG, PolicyState(4, 0.0), inputs(window_full=False), KV, 0.0)
    assert (d.target, state.target, d.desired) == (4, 4, 1) and "window not full" in d.reason
    _, d, _ = wrapper(lambda ctx: 6).decide(
        CFG, PolicyState(4, 0.0), inputs(window_full=False), KV, 0.0
    )
    assert d.target == 6  # increases are allowed meanwhile


def raises(ctx: AutoscalingContext) -> int:
    raise ZeroDivisionError("division by zero")


def exits(ctx: AutoscalingContext) -> int:
    raise SystemExit(3)


@pytest.mark.parametrize("fn", [raises, exits])
def test_an_exception_falls_back_to_the_default_policy(fn: Any) -> None:
    tel = PolicyTelemetry()
    p = wrapper(fn, telemetry=tel)
    state, d, events = p.decide(CFG, STATE, inputs(demand_mean=9.0), KV, 50.0)
    want_state, want = decide(CFG, STATE, inputs(demand_mean=9.0), 50.0)
    assert state == want_state and (d.target, d.desired) == (want.target, want.desired)
    assert d.rule == "custom_fallback" and "default policy: hold: waiting" in d.reason
    assert tel.calls[("shop", "Model", cp.RAISED)] == 1
    assert [e.kind for e in events] == ["custom_policy_fallback"]


def test_the_default_policy_keeps_its_delay_across_failing_ticks() -> None:
    p = wrapper(raises)
    state = STATE
    targets = []
    for t in range(0, 7):  # upscale_delay_s 5: the fallback's timer must run across ticks
        state, d, _ = p.decide(CFG, state, inputs(demand_mean=9.0), KV, float(t))
        targets.append(d.target)
    assert targets == [2, 2, 2, 2, 2, 5, 5]


def test_fallback_events_are_rate_limited_on_now_and_every_call_is_counted() -> None:
    tel = PolicyTelemetry()
    p = wrapper(raises, telemetry=tel)
    kinds: list[str] = []
    details: list[str] = []
    for i in range(25):  # ten ticks a second for 2.5 s, then one past the interval
        _, _, events = p.decide(CFG, STATE, inputs(), KV, i * 0.1)
        kinds += [e.kind for e in events]
        details += [e.detail for e in events]
    _, _, events = p.decide(CFG, STATE, inputs(), KV, 10.0)
    details += [e.detail for e in events]
    assert kinds == ["custom_policy_fallback"] and len(details) == 2
    assert "24 more since the last report" in details[1]
    assert tel.calls[("shop", "Model", cp.RAISED)] == 26


@pytest.mark.parametrize(
    "answer",
    [None, "3", -1, -0.5, math.nan, math.inf, 10**400, True, (3,), (3, "x"), [3], {"n": 3}, 1j],
)
def test_a_silly_answer_falls_back_and_is_counted(answer: Any) -> None:
    tel = PolicyTelemetry()
    _, d, events = wrapper(lambda ctx: answer, telemetry=tel).decide(CFG, STATE, inputs(), KV, 0.0)
    assert d.rule == "custom_fallback" and "bad_value" in d.reason
    assert tel.calls[("shop", "Model", cp.BAD_VALUE)] == 1
    assert [e.kind for e in events] == ["custom_policy_fallback"]


def test_a_policy_that_cannot_load_says_why_in_the_decision_and_falls_back() -> None:
    tel = PolicyTelemetry()
    p = wrapper(None, telemetry=tel)
    _, d, events = p.decide(CFG, STATE, inputs(), KV, 0.0)
    assert d.rule == "custom_fallback" and "not_loaded" in d.reason
    assert "ModuleNotFoundError" in d.reason and "default policy" in d.reason
    assert tel.calls[("shop", "Model", cp.NOT_LOADED)] == 1 and events


def test_a_slow_policy_is_measured_flagged_and_still_obeyed() -> None:
    tel = PolicyTelemetry()
    p = wrapper(lambda ctx: 4, timer=Timer(step=0.03), telemetry=tel)
    _, d, events = p.decide(CFG, STATE, inputs(), KV, 0.0)
    assert d.target == 4  # the decision never depends on the measured time (replay)
    assert tel.durations == [pytest.approx(0.03)] and tel.slow[("shop", "Model")] == 1
    assert [e.kind for e in events] == ["custom_policy_slow"] and "30.0 ms" in events[0].detail
    _, _, events = wrapper(lambda ctx: 4, timer=Timer(step=0.001), telemetry=tel).decide(
        CFG, STATE, inputs(), KV, 0.0
    )
    assert events == [] and tel.slow[("shop", "Model")] == 1


def test_the_exporter_moves_telemetry_into_prometheus() -> None:
    def value(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    cp.TELEMETRY.drain()  # what other tests left there is not this test's
    labels = {"app": "xp", "deployment": "D"}
    before = value("fleetpulse_controller_custom_policy_calls_total", **labels, outcome="raised")
    count = value("fleetpulse_controller_custom_policy_seconds_count")
    restarts = value("fleetpulse_controller_custom_policy_worker_restarts_total", reason="timeout")
    p = CustomPolicy("xp", "D", "pkg.mod:fn")
    p.decide(
        CFG, STATE, inputs(), KV, 0.0, InlineRunner(loader=lambda path: raises, timer=Timer(0.02))
    )
    cp.TELEMETRY.restarts["timeout"] += 1
    Exporter()._custom_policies()
    after = value("fleetpulse_controller_custom_policy_calls_total", **labels, outcome="raised")
    assert after == before + 1
    assert value("fleetpulse_controller_custom_policy_slow_total", **labels) >= 1
    assert value("fleetpulse_controller_custom_policy_seconds_count") == count + 1
    now = value("fleetpulse_controller_custom_policy_worker_restarts_total", reason="timeout")
    assert now == restarts + 1


def not_callable() -> None:
    pass


NOT_A_FUNCTION = 3


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("tests.unit.no_such_module:fn", "ModuleNotFoundError"),
        ("tests.unit.test_custom_policy:missing", "has no attribute 'missing'"),
        ("tests.unit.test_custom_policy:NOT_A_FUNCTION", "is a int, not a function"),
        ("tests.unit.broken_policy_module:fn", "cannot import"),
    ],
)
def test_load_errors_say_what_is_wrong(path: str, words: str) -> None:
    with pytest.raises(PolicyLoadError, match=words.replace("(", r"\(")):
        load_policy(path)
    problem = policy_problem(path)
    assert problem is not None and words in problem


def test_the_example_policy_loads_and_scales_on_kv_cache_use() -> None:
    path = "services.examples.kv_policy:scale_on_kv_cache"
    p = Wrapped(CustomPolicy("shop", "Model", path), InlineRunner())
    assert policy_problem(path) is None
    high = (MappingProxyType({"kv_cache_use": CustomMetric(1.8, 0.9, 2)}), 0.0)
    low = (MappingProxyType({"kv_cache_use": CustomMetric(0.2, 0.1, 2)}), 0.0)
    _, d, _ = p.decide(CFG, STATE, inputs(demand_mean=0.0), high, 0.0)
    assert d.target == 3  # ceil(2 * 0.9 / 0.6)
    _, d, _ = p.decide(CFG, PolicyState(3, 0.0), inputs(demand_mean=0.0), low, 1.0)
    assert d.target == 1
    none: tuple[Any, float] = (MappingProxyType({}), 0.0)
    _, d, _ = p.decide(CFG, PolicyState(3, 0.0), inputs(), none, 2.0)
    assert d.target == 3  # no values yet: hold


def test_a_policy_that_did_not_import_is_tried_again_later() -> None:
    attempts: list[str] = []
    available = False
    clock = [0.0]

    def loader(path: str) -> Callable[[AutoscalingContext], Any]:
        attempts.append(path)
        if not available:
            raise PolicyLoadError("cannot import 'late': ModuleNotFoundError")
        return lambda ctx: 3

    runner = InlineRunner(loader=loader, timer=Timer(), clock=lambda: clock[0])
    p = Wrapped(CustomPolicy("shop", "Model", "late.pkg:fn"), runner)
    _, d, _ = p.decide(CFG, STATE, inputs(), KV, 0.0)
    assert d.rule == "custom_fallback" and len(attempts) == 1
    available = True  # installed meanwhile
    clock[0] = cp.RELOAD_AFTER_S - 1
    _, d, _ = p.decide(CFG, STATE, inputs(), KV, 1.0)
    assert d.rule == "custom_fallback" and len(attempts) == 1  # not every tick
    clock[0] = cp.RELOAD_AFTER_S
    _, d, _ = p.decide(CFG, STATE, inputs(), KV, 2.0)
    assert (d.rule, d.target, len(attempts)) == ("custom", 3, 2)

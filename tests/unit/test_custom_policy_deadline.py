"""A custom policy that misses its deadline or crashes its worker: fallback, strikes, quarantine
(the pure part; the worker process itself: tests/integration/test_policy_worker.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from types import MappingProxyType

from services.controller import custom_policy as cp
from services.controller.core import ControllerConfig, ControllerCore, Event
from services.controller.custom_policy import Answer, CustomPolicy, PolicyCall, PolicyTelemetry
from services.controller.policy import PolicyInputs, PolicyState, decide
from shared.appconfig import AppConfig, AutoscalingConfig
from tests.unit.test_controller_core import app_with

CFG = AutoscalingConfig(min_replicas=1, max_replicas=8, upscale_delay_s=5, policy="pkg.mod:fn")
INPUTS = PolicyInputs(
    demand_mean=9.0, demand_short=None, window_full=True, cold_start=False, running_replicas=2
)
STATE = PolicyState(target=2, watch_start=0.0)
METRICS = (MappingProxyType({}), 0.0)
OK5 = Answer(cp.OK, 5, seconds=0.001)
TIMEOUT = Answer(cp.TIMEOUT, detail="no answer within 0.5 s (the worker was killed)")
CRASHED = Answer(cp.CRASHED, detail="the policy worker died during the call (killed by SIGSEGV)")


class Policy:
    """A CustomPolicy fed scripted answers: `tick(answer)` as the core would run it."""

    def __init__(self) -> None:
        self.tel = PolicyTelemetry()
        self.p = CustomPolicy("shop", "Model", "pkg.mod:fn", telemetry=self.tel)
        self.now = 0.0
        self.calls: list[PolicyCall] = []
        self.kinds: list[str] = []

    def tick(self, answer: Answer, dt: float = 0.1) -> tuple[str, str]:
        """(rule, reason) of the tick; `answer` is what the runner says if the policy is called."""
        self.now += dt
        call = self.p.call(CFG, STATE, INPUTS, METRICS, self.now)
        if call is not None:
            self.calls.append(call)
        got = answer if call is not None else None
        _, d, events = self.p.settle(CFG, STATE, INPUTS, got, self.now)
        self.kinds += [e.kind for e in events]
        return d.rule, d.reason

    @property
    def quarantined(self) -> bool:
        return self.p.call(CFG, STATE, INPUTS, METRICS, self.now) is None


def test_a_call_past_its_deadline_is_decided_by_the_default_policy() -> None:
    pol = Policy()
    p = pol.p
    call = p.call(CFG, STATE, INPUTS, METRICS, 50.0)
    assert call is not None and not call.suspect
    state, d, events = p.settle(CFG, STATE, INPUTS, TIMEOUT, 50.0)
    want_state, want = decide(CFG, STATE, INPUTS, 50.0)
    assert state == want_state and (d.target, d.desired) == (want.target, want.desired)
    assert d.rule == "custom_fallback"
    assert "custom policy pkg.mod:fn timeout (no answer within 0.5 s" in d.reason
    assert f"default policy: {want.reason}" in d.reason
    assert [e.kind for e in events] == ["custom_policy_fallback"]
    assert pol.tel.calls[("shop", "Model", cp.TIMEOUT)] == 1
    assert pol.tel.durations == []  # it did not answer: no duration to report


def test_three_strikes_in_a_row_quarantine_the_policy() -> None:
    pol = Policy()
    for answer in (TIMEOUT, CRASHED, TIMEOUT):
        assert pol.tick(answer)[0] == "custom_fallback"
    assert pol.kinds.count("custom_policy_quarantined") == 1
    assert pol.tel.quarantines[("shop", "Model")] == 1
    assert pol.calls[1].suspect and pol.calls[2].suspect  # run after the clean ones
    # not called any more: the runner never sees it, the default policy decides
    for _ in range(50):
        rule, reason = pol.tick(OK5)
        assert rule == "custom_fallback"
    assert len(pol.calls) == 3
    assert "custom policy pkg.mod:fn quarantined (for 300 s after 3 timeouts in a row" in reason
    assert pol.tel.calls[("shop", "Model", cp.QUARANTINED)] == 50
    assert pol.kinds.count("custom_policy_quarantined") == 1  # said once, not every tick


def test_a_call_that_returns_clears_the_strikes() -> None:
    pol = Policy()
    for answer in (TIMEOUT, TIMEOUT, OK5, TIMEOUT, TIMEOUT, Answer(cp.RAISED, detail="x"), TIMEOUT):
        pol.tick(answer)
    assert not pol.quarantined and "custom_policy_quarantined" not in pol.kinds
    assert pol.tick(OK5)[0] == "custom"


def test_ticks_it_was_not_run_neither_add_nor_clear_strikes() -> None:
    pol = Policy()
    unavailable = Answer(cp.UNAVAILABLE, detail="the policy worker restarts")
    for answer in (TIMEOUT, unavailable, TIMEOUT, Answer(cp.NOT_LOADED, detail="x"), unavailable):
        pol.tick(answer)
    assert not pol.quarantined
    pol.tick(TIMEOUT)
    assert pol.quarantined
    assert "custom_policy_fallback" in pol.kinds
    # a worker restart is not news for every deployment at every tick: no event for it
    fresh = Policy()
    fresh.tick(unavailable)
    assert fresh.kinds == [] and fresh.tel.calls[("shop", "Model", cp.UNAVAILABLE)] == 1


def test_after_a_quarantine_one_call_is_tried_and_another_strike_doubles_it() -> None:
    pol = Policy()
    for _ in range(3):
        pol.tick(TIMEOUT)
    pol.tick(OK5, dt=cp.QUARANTINE_S - 1.0)
    assert len(pol.calls) == 3
    pol.tick(TIMEOUT, dt=1.0)  # the quarantine is over: one call, and it hangs again
    assert len(pol.calls) == 4 and pol.calls[-1].suspect
    assert pol.kinds.count("custom_policy_quarantined") == 2
    pol.tick(OK5, dt=2 * cp.QUARANTINE_S - 1.0)
    assert len(pol.calls) == 4  # twice as long this time
    assert pol.tick(OK5, dt=1.0)[0] == "custom"  # it answers: cleared
    assert pol.calls[-1].suspect and len(pol.calls) == 5
    for _ in range(2):
        pol.tick(TIMEOUT)
    assert not pol.quarantined  # three in a row again before the next quarantine
    pol.tick(TIMEOUT)
    assert pol.quarantined
    pol.tick(OK5, dt=cp.QUARANTINE_S)  # and it starts at the first length again
    assert len(pol.calls) == 9


def test_the_quarantine_length_stops_doubling_at_the_cap() -> None:
    pol = Policy()
    for _ in range(3):
        pol.tick(TIMEOUT)
    lengths = []
    for _ in range(6):
        start = pol.now
        while pol.quarantined:
            pol.now += 60.0
        lengths.append(round(pol.now - start, -2))
        pol.tick(TIMEOUT, dt=0.0)
    assert lengths == [300, 600, 1200, 2400, 3600, 3600]


def test_a_redeploy_lifts_the_quarantine() -> None:
    pol = Policy()
    for _ in range(3):
        pol.tick(TIMEOUT)
    assert pol.quarantined
    pol.p.pardon()
    assert pol.tick(OK5)[0] == "custom" and not pol.calls[-1].suspect


# -- in the core: one batch per tick; one policy's trouble is not the others' ------------------


class ScriptedRunner:
    """Answers every call of `hung` with a timeout and the others with 3; records each batch."""

    def __init__(self, hung: str) -> None:
        self.hung = hung
        self.batches: list[list[str]] = []

    def run(self, calls: Sequence[PolicyCall]) -> list[Answer]:
        self.batches.append([c.ctx.app_name for c in calls])
        return [TIMEOUT if c.path == self.hung else Answer(cp.OK, 3) for c in calls]


def named(name: str, policy: str) -> AppConfig:
    scaling = AutoscalingConfig(
        min_replicas=1, max_replicas=4, look_back_period_s=1.0, metrics_interval_s=0.5,
        policy=policy,
    )  # fmt: skip
    return dataclasses.replace(app_with(scaling), name=name, route_prefix=f"/{name}")


def test_the_core_asks_a_ticks_policies_in_one_batch_and_quarantines_the_one_that_hangs() -> None:
    runner = ScriptedRunner(hung="tests.stuck:policy")
    core = ControllerCore(ControllerConfig(), policies=runner)
    apps = {
        "stuck": named("stuck", "tests.stuck:policy"),
        "good": named("good", "tests.good:policy"),
        "plain": app_with(None),  # the default policy: never handed to the runner
    }
    t = 100.0
    core.set_apps(apps, t)
    actions = []
    for _ in range(20):
        t = round(t + 0.1, 6)
        actions += core.tick(t, 1e9 + t)
    assert runner.batches[:3] == [["stuck", "good"]] * 3  # one round trip per tick
    assert runner.batches[3:] == [["good"]] * 17  # quarantined after three timeouts
    stuck, good = core.deployments[("stuck", "Model")], core.deployments[("good", "Model")]
    assert good.decision.rule == "custom" and good.state.target == 3
    assert stuck.decision.rule == "custom_fallback" and stuck.state.target == 1
    assert "quarantined" in stuck.status_view().last_decision
    events = [a for a in actions if isinstance(a, Event) and a.kind.startswith("custom_policy")]
    assert [(e.kind, e.app) for e in events] == [
        ("custom_policy_fallback", "stuck"),
        ("custom_policy_quarantined", "stuck"),
    ]
    # a redeploy (a new config) lifts the quarantine: the policy is asked again
    changed = dataclasses.replace(
        apps["stuck"],
        deployments=(dataclasses.replace(apps["stuck"].deployments[0], max_ongoing_requests=7),),
    )
    core.update_app("stuck", changed, t)
    core.tick(round(t + 0.1, 6), 1e9 + t)
    assert runner.batches[-1] == ["stuck", "good"]

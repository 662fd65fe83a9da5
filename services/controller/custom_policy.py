"""Custom autoscaling policies: what a policy sees and answers, and how the controller uses it.

How it works. A deployment whose autoscaling_config says `policy: {policy_function:
"package.module:function"}` (Ray Serve's key) gets a `CustomPolicy` in the controller member that
owns it. Each control tick it is asked for a `PolicyCall` (`call`): a frozen `AutoscalingContext`
built from documented inputs only (demand, the custom metrics of the running replicas, the
current and running replica counts, the config, `now`), the policy's own state from its last
answer and two hints for the runner. The core hands every call of the tick to its `PolicyRunner`
in one batch (policy_runner.py runs them in this process; the controller service's runner,
policy_host.py, runs them in a worker process under a deadline) and gives each `Answer` back to
`settle`, which decides the tick. A policy returns a replica count: an int >= 0, a finite float
(rounded up, as Ray Serve does), or Ray's `(count, policy_state)` pair, whose mapping becomes the
next call's `ctx.policy_state` (`count_of` checks it where the policy ran). Then:

1. The count is clipped into [min_replicas, max_replicas] (Ray's bounds) and counted as clipped.
2. Two controller rules hold over any policy: at target 0 a queued request wakes the deployment
   (scale-to-zero never strands a caller), and no scale-down before the look-back window is full
   after a start or failover (missing data is not zero load).
3. Nothing else: no delays and no smoothing factors. The policy owns its timing (it sees
   `current_time` and keeps `policy_state`), as a plain custom policy does in Ray Serve.

Whatever goes wrong, this tick is decided by the default policy (policy.decide) instead, with the
same state, so a failing policy degrades to Ray-compatible behaviour rather than freezing the
target: the import failed (the runner tries again every RELOAD_AFTER_S), the call raised, the
answer is not a count, the call missed its deadline (`timeout`) or took the worker process down
with it (`crashed`), the runner could not call it this tick (`unavailable`: its worker is
starting or importing), or it is quarantined. Quarantine: `timeout` and `crashed` are strikes
(such a call costs the member its deadline and the other policies a worker restart);
QUARANTINE_AFTER in a row and the policy is not called for QUARANTINE_S, doubled each time its
first call after a quarantine strikes again (up to MAX_QUARANTINE_S). A call that returns
anything clears the strikes; a new config or version of the deployment (a redeploy) lifts a
quarantine (`pardon`).

Every answer is counted by outcome and its duration (measured by the runner) kept in
`PolicyTelemetry`, which the shell drains into Prometheus; a call slower than `SLOW_POLICY_S` is
flagged. Problems come back as events, at most one per kind per `EVENT_INTERVAL_S` of `now`
(with the count suppressed meanwhile), for the shell to log. The decision depends on the answers
and `now` only, never on a measured duration, so the same answers decide the same.
"""

from __future__ import annotations

import math
import numbers
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Protocol

from shared.appconfig import AutoscalingConfig
from shared.policyapi import AutoscalingContext as AutoscalingContext
from shared.policyapi import CustomMetric as CustomMetric
from shared.policyapi import Policy as Policy
from shared.policyapi import PolicyLoadError as PolicyLoadError
from shared.policyapi import load_policy as load_policy
from shared.policyapi import policy_problem as policy_problem

from .deployment_state import StateEvent
from .policy import Decision, PolicyInputs, PolicyState, decide

SLOW_POLICY_S: Final = 0.01
"""A call longer than this is flagged: a tenth of the default control interval (0.1 s)."""
RELOAD_AFTER_S: Final = 30.0
"""A policy that did not import is tried again this often (its package may be installed late)."""
MAX_DURATION_SAMPLES: Final = 100_000
"""Durations kept between two drains: a core run without the service's exporter stays bounded."""
EVENT_INTERVAL_S: Final = 10.0
"""At most one event per kind per deployment this often (the rest are counted)."""
QUARANTINE_AFTER: Final = 3
"""Strikes (timeouts, crashes) in a row that quarantine a policy: one may be a hiccup of a
loaded host, three in a row is the policy."""
QUARANTINE_S: Final = 300.0
"""How long a quarantined policy is not called the first time..."""
MAX_QUARANTINE_S: Final = 3600.0
"""...doubling while its first call after a quarantine strikes again, up to this."""

OK: Final = "ok"
CLIPPED: Final = "clipped"
RAISED: Final = "raised"
BAD_VALUE: Final = "bad_value"
NOT_LOADED: Final = "not_loaded"
TIMEOUT: Final = "timeout"
CRASHED: Final = "crashed"
UNAVAILABLE: Final = "unavailable"
QUARANTINED: Final = "quarantined"
OUTCOMES: Final = (
    OK, CLIPPED, RAISED, BAD_VALUE, NOT_LOADED, TIMEOUT, CRASHED, UNAVAILABLE, QUARANTINED
)  # fmt: skip
"""Outcome labels of one tick's call; all but the first two fall back to the default policy."""
STRIKES: Final = frozenset({TIMEOUT, CRASHED})
"""Outcomes that count towards quarantine."""
NEUTRAL: Final = frozenset({NOT_LOADED, UNAVAILABLE, QUARANTINED})
"""Outcomes of a call that did not run: they neither add nor clear strikes."""

EMPTY_STATE: Final[Mapping[str, Any]] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class PolicyCall:
    """One call a runner is asked to make."""

    path: str
    ctx: AutoscalingContext
    """The context, with an empty `policy_state`: the runner puts `state` in its place."""
    state: object
    """What the runner's last answer for this deployment carried as its state (None: none yet).
    Opaque here: the process runner keeps it pickled, so user objects never load in the
    controller."""
    suspect: bool = False
    """Its last call was a strike: a runner runs it after the others of its batch."""


@dataclass(frozen=True, slots=True)
class Answer:
    """What became of one call."""

    outcome: str
    """OK (the count is the answer), or why not: RAISED, BAD_VALUE, NOT_LOADED, TIMEOUT,
    CRASHED, UNAVAILABLE."""
    count: int = 0
    state: object = None
    """The state for the next call (None: keep the last)."""
    detail: str = ""
    seconds: float | None = None
    """How long the call ran (None: it did not run)."""


class PolicyRunner(Protocol):
    def run(self, calls: Sequence[PolicyCall]) -> list[Answer]:
        """One answer per call, in order; never raises for what a policy did."""
        ...


@dataclass(slots=True)
class PolicyTelemetry:
    """Counts and durations since the shell last drained them (plain data; no Prometheus)."""

    calls: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    """(app, deployment, outcome) -> calls."""
    slow: Counter[tuple[str, str]] = field(default_factory=Counter)
    durations: list[float] = field(default_factory=list)
    quarantines: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(app, deployment) -> quarantines begun."""
    restarts: Counter[str] = field(default_factory=Counter)
    """Policy worker restarts by reason (policy_host.py)."""
    batches: list[float] = field(default_factory=list)
    """How long the control loop waited for each tick's calls (policy_host.py)."""

    def drain(self) -> PolicyTelemetry:
        out = PolicyTelemetry(
            self.calls, self.slow, self.durations, self.quarantines, self.restarts, self.batches
        )
        self.calls, self.slow, self.durations = Counter(), Counter(), []
        self.quarantines, self.restarts, self.batches = Counter(), Counter(), []
        return out


TELEMETRY: Final = PolicyTelemetry()
"""The process's sink (like Prometheus' default registry): the controller's exporter drains it."""


class BadAnswer(Exception):
    """A policy's answer is not a replica count."""


def count_of(answer: Any) -> tuple[int, Mapping[str, Any] | None]:
    """The replica count (and new policy state) in a policy's answer; BadAnswer if none."""
    state = None
    if isinstance(answer, tuple):
        if len(answer) != 2 or not isinstance(answer[1], Mapping):
            raise BadAnswer(f"a tuple must be (count, policy_state mapping), got {answer!r:.80}")
        answer, state = answer
    if isinstance(answer, bool) or not isinstance(answer, numbers.Real):
        raise BadAnswer(f"not a number: {type(answer).__name__} {answer!r:.80}")
    try:
        value = float(answer)
    except OverflowError:  # an int too large for a float: no fleet is that large either
        value = math.inf
    if not math.isfinite(value) or value < 0:
        raise BadAnswer(f"not a replica count: {answer!r}")
    return math.ceil(value), state


class CustomPolicy:
    """One deployment's custom policy: its state, strikes, quarantine and events (no I/O: the
    runner calls the function)."""

    def __init__(
        self, app: str, deployment: str, path: str, *, telemetry: PolicyTelemetry = TELEMETRY
    ) -> None:
        self.app, self.deployment, self.path = app, deployment, path
        self._telemetry = telemetry
        self.policy_state: object = None
        self.strikes = 0
        self.quarantined_until: float | None = None
        self._quarantine_s = QUARANTINE_S
        self._last_strike = ""
        self._logged: dict[str, float] = {}
        self._suppressed: Counter[str] = Counter()

    def call(
        self,
        cfg: AutoscalingConfig,
        state: PolicyState,
        inputs: PolicyInputs,
        metrics: tuple[Mapping[str, CustomMetric], float],
        now: float,
    ) -> PolicyCall | None:
        """This tick's call, or None while quarantined (`settle(..., None, ...)` decides)."""
        if self.quarantined_until is not None and now < self.quarantined_until:
            return None
        custom, queued = metrics
        ctx = AutoscalingContext(
            app_name=self.app,
            deployment_name=self.deployment,
            current_num_replicas=inputs.running_replicas,
            target_num_replicas=state.target,
            total_num_requests=inputs.demand_mean or 0.0,
            total_queued_requests=queued,
            custom_metrics=custom,
            capacity_adjusted_min_replicas=cfg.min_replicas,
            capacity_adjusted_max_replicas=cfg.max_replicas,
            policy_state=EMPTY_STATE,
            current_time=now,
            config=cfg,
            window_full=inputs.window_full,
        )
        return PolicyCall(self.path, ctx, self.policy_state, self.strikes > 0)

    def settle(
        self,
        cfg: AutoscalingConfig,
        state: PolicyState,
        inputs: PolicyInputs,
        answer: Answer | None,
        now: float,
    ) -> tuple[PolicyState, Decision, list[StateEvent]]:
        """This tick's decision from the answer to `call` (None: it made none)."""
        events: list[StateEvent] = []
        if answer is None:
            why = f"for {self._quarantine_s:g} s after {self._last_strike}"
            return self._fallback(cfg, state, inputs, now, QUARANTINED, why, events)
        if answer.seconds is not None:
            self._timed(answer.seconds, now, events)
        outcome = answer.outcome
        if outcome in STRIKES:
            self._strike(outcome, answer.detail, now, events)
        elif outcome not in NEUTRAL:  # it returned: whatever hung before is over
            self.strikes, self.quarantined_until, self._quarantine_s = 0, None, QUARANTINE_S
        if outcome != OK:
            return self._fallback(cfg, state, inputs, now, outcome, answer.detail, events)
        if answer.state is not None:
            self.policy_state = answer.state
        count = answer.count
        clipped = max(cfg.min_replicas, min(cfg.max_replicas, count))
        if clipped != count:
            outcome = CLIPPED
            bounds = f"[{cfg.min_replicas}, {cfg.max_replicas}]"
            self._event(events, now, "custom_policy_clipped", f"{count} -> {clipped} {bounds}")
        self._telemetry.calls[(self.app, self.deployment, outcome)] += 1
        return self._apply(state, inputs, clipped, count, events)

    def decide(
        self,
        cfg: AutoscalingConfig,
        state: PolicyState,
        inputs: PolicyInputs,
        metrics: tuple[Mapping[str, CustomMetric], float],
        now: float,
        runner: PolicyRunner,
    ) -> tuple[PolicyState, Decision, list[StateEvent]]:
        """`call`, the runner and `settle` for this deployment alone."""
        call = self.call(cfg, state, inputs, metrics, now)
        answer = None if call is None else runner.run([call])[0]
        return self.settle(cfg, state, inputs, answer, now)

    def pardon(self) -> None:
        """A redeploy: strikes and quarantine are forgotten."""
        self.strikes, self.quarantined_until, self._quarantine_s = 0, None, QUARANTINE_S

    def _strike(self, outcome: str, detail: str, now: float, events: list[StateEvent]) -> None:
        self.strikes += 1
        self._last_strike = f"{self.strikes} {outcome}s in a row ({detail:.120})"
        if self.strikes < QUARANTINE_AFTER:
            return
        if self.quarantined_until is not None:  # its first call after a quarantine
            self._quarantine_s = min(self._quarantine_s * 2, MAX_QUARANTINE_S)
        self.quarantined_until = now + self._quarantine_s
        self._telemetry.quarantines[(self.app, self.deployment)] += 1
        detail = (
            f"{self.path} quarantined: {self._last_strike}; not called for"
            f" {self._quarantine_s:g} s, the default policy decides meanwhile"
        )
        events.append(StateEvent("custom_policy_quarantined", "", detail))

    def _apply(
        self, state: PolicyState, inputs: PolicyInputs, want: int, said: int,
        events: list[StateEvent],
    ) -> tuple[PolicyState, Decision, list[StateEvent]]:  # fmt: skip
        cur = state.target
        why = f"policy {self.path} says {said}"
        if cur == 0 and want == 0 and inputs.cold_start:
            want, why = 1, f"{why}; a queued request wakes it"
        if want < cur and not inputs.window_full:
            reason = f"hold at {cur}: {why}; window not full (rebuilding after start)"
            return self._state(state, cur), Decision(cur, want, reason, False, "custom"), events
        verb = f"{cur}->{want}" if want != cur else f"hold at {cur}"
        decision = Decision(want, want, f"custom {verb}: {why}", want != cur, "custom")
        return self._state(state, want), decision, events

    @staticmethod
    def _state(state: PolicyState, target: int) -> PolicyState:
        # no pending delay or panic: should the policy fail later, the default one starts afresh
        return PolicyState(target=target, watch_start=state.watch_start)

    def _fallback(
        self,
        cfg: AutoscalingConfig,
        state: PolicyState,
        inputs: PolicyInputs,
        now: float,
        outcome: str,
        why: str,
        events: list[StateEvent],
    ) -> tuple[PolicyState, Decision, list[StateEvent]]:
        self._telemetry.calls[(self.app, self.deployment, outcome)] += 1
        if outcome not in (UNAVAILABLE, QUARANTINED):  # the worker's restart and the
            # quarantine are logged once each, not once per deployment and tick
            self._event(events, now, "custom_policy_fallback", f"{self.path} {outcome}: {why}")
        new_state, d = decide(cfg, state, inputs, now)
        reason = f"custom policy {self.path} {outcome} ({why:.200}); default policy: {d.reason}"
        decision = Decision(d.target, d.desired, reason, d.changed, "custom_fallback")
        return new_state, decision, events

    def _timed(self, took: float, now: float, events: list[StateEvent]) -> None:
        if len(self._telemetry.durations) < MAX_DURATION_SAMPLES:
            self._telemetry.durations.append(took)
        if took > SLOW_POLICY_S:
            self._telemetry.slow[(self.app, self.deployment)] += 1
            self._event(
                events,
                now,
                "custom_policy_slow",
                f"{self.path} took {took * 1000:.1f} ms (> {SLOW_POLICY_S * 1000:g} ms)",
            )

    def _event(self, events: list[StateEvent], now: float, kind: str, detail: str) -> None:
        last = self._logged.get(kind)
        if last is not None and now - last < EVENT_INTERVAL_S:
            self._suppressed[kind] += 1
            return
        self._logged[kind] = now
        more = self._suppressed.pop(kind, 0)
        suffix = f" ({more} more since the last report)" if more else ""
        events.append(StateEvent(kind, "", f"{detail}{suffix}"))

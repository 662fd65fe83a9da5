"""Custom autoscaling policies: loading by import path, the inputs they see, and isolation.

How it works. A deployment whose autoscaling_config says `policy: {policy_function:
"package.module:function"}` (Ray Serve's key) gets a `CustomPolicy` in the controller member that
owns it. Each control tick, `CustomPolicy.decide` builds a frozen `AutoscalingContext` from
documented inputs only (demand, the custom metrics of the running replicas, the current and running
replica counts, the config, `now` and the policy's own state) and calls the function. It must
return a replica count: an int >= 0, a finite float (rounded up, as Ray Serve does), or Ray's
`(count, policy_state)` pair, whose mapping becomes the next call's `ctx.policy_state`. Then:

1. The count is clipped into [min_replicas, max_replicas] (Ray's bounds) and counted as clipped.
2. Two controller rules hold over any policy: at target 0 a queued request wakes the deployment
   (scale-to-zero never strands a caller), and no scale-down before the look-back window is full
   after a start or failover (missing data is not zero load).
3. Nothing else: no delays and no smoothing factors. The policy owns its timing (it sees
   `current_time` and keeps `policy_state`), as a plain custom policy does in Ray Serve.

Whatever goes wrong — the import failed (it is retried every RELOAD_AFTER_S), the call raised,
the answer is not a count — this tick
is decided by the default policy (policy.decide) instead, with the same state, so a failing policy
degrades to Ray-compatible behaviour rather than freezing the target. Every call is counted by
outcome and timed (`timer`, injected) into `PolicyTelemetry`, which the shell drains into
Prometheus; a call slower than `SLOW_POLICY_S` is flagged. Problems come back as events, at most
one per kind per `EVENT_INTERVAL_S` of `now` (with the count suppressed meanwhile), for the shell
to log. The decision depends on the policy's answer and `now` only, never on the measured
duration, so a replay decides the same.

The policy runs in the controller's process and thread: a slow one delays the member's tick (it
is measured and flagged, not preempted), and its state lives in memory (a failover starts it empty).
"""

from __future__ import annotations

import importlib
import math
import numbers
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from shared.appconfig import AutoscalingConfig

from .deployment_state import StateEvent
from .metrics_store import DeploymentMetrics
from .policy import Decision, PolicyInputs, PolicyState, decide

SLOW_POLICY_S: Final = 0.01
"""A call longer than this is flagged: a tenth of the default control interval (0.1 s)."""
RELOAD_AFTER_S: Final = 30.0
"""A policy that did not import is tried again this often (its package may be installed late)."""
MAX_DURATION_SAMPLES: Final = 100_000
"""Durations kept between two drains: a core run without the service's exporter stays bounded."""
EVENT_INTERVAL_S: Final = 10.0
"""At most one event per kind per deployment this often (the rest are counted)."""

OK: Final = "ok"
CLIPPED: Final = "clipped"
RAISED: Final = "raised"
BAD_VALUE: Final = "bad_value"
NOT_LOADED: Final = "not_loaded"
OUTCOMES: Final = (OK, CLIPPED, RAISED, BAD_VALUE, NOT_LOADED)
"""Outcome labels of one call; the last three fall back to the default policy."""

Policy = Callable[["AutoscalingContext"], Any]


class PolicyLoadError(Exception):
    """The import path names nothing callable that can be imported here."""


@dataclass(frozen=True, slots=True)
class CustomMetric:
    """One custom metric over the running replicas: each one's latest reported value."""

    total: float
    """Sum over the running replicas that reported a value."""
    mean: float
    """total / replicas."""
    replicas: int
    """Running replicas with a value (a replica that just started may have none yet)."""


@dataclass(frozen=True, slots=True)
class AutoscalingContext:
    """What a custom policy sees (the names follow Ray Serve's AutoscalingContext)."""

    app_name: str
    deployment_name: str
    current_num_replicas: int
    """Running replicas (Ray: len(running_replicas))."""
    target_num_replicas: int
    """The target the controller holds now (starting replicas included)."""
    total_num_requests: float
    """Ongoing + queued requests, time-weighted mean over look_back_period_s (0 without data)."""
    total_queued_requests: float
    """Requests queued at routers now, not yet sent to a replica."""
    custom_metrics: Mapping[str, CustomMetric]
    """By name: what the replicas' `record_autoscaling_stats()` returned last."""
    capacity_adjusted_min_replicas: int
    """min_replicas (fleetpulse has no target_capacity: Ray's name, the plain bound)."""
    capacity_adjusted_max_replicas: int
    policy_state: Mapping[str, Any]
    """What the previous call returned as the second item of its pair (empty at first)."""
    current_time: float
    """The controller's monotonic clock in seconds: for intervals, not the time of day."""
    config: AutoscalingConfig
    window_full: bool
    """The look-back window is covered by data (a scale-down is held until it is)."""


@dataclass(slots=True)
class PolicyTelemetry:
    """Counts and durations since the shell last drained them (plain data; no Prometheus)."""

    calls: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    """(app, deployment, outcome) -> calls."""
    slow: Counter[tuple[str, str]] = field(default_factory=Counter)
    durations: list[float] = field(default_factory=list)

    def drain(self) -> tuple[Counter[tuple[str, str, str]], Counter[tuple[str, str]], list[float]]:
        out = (self.calls, self.slow, self.durations)
        self.calls, self.slow, self.durations = Counter(), Counter(), []
        return out


TELEMETRY: Final = PolicyTelemetry()
"""The process's sink (like Prometheus' default registry): the controller's exporter drains it."""


def load_policy(path: str) -> Policy:
    """Import `package.module:function`; PolicyLoadError saying why not."""
    module_name, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise PolicyLoadError(f"module {module_name!r} has no attribute {attr!r}") from None
    except (Exception, SystemExit) as exc:  # any import-time failure of user code
        raise PolicyLoadError(
            f"cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    if not callable(obj):
        raise PolicyLoadError(f"{path} is a {type(obj).__name__}, not a function")
    return obj  # type: ignore[no-any-return]


def policy_problem(path: str) -> str | None:
    """For `fleetpulse deploy`: why `path` cannot be used as a policy here, or None."""
    try:
        load_policy(path)
    except PolicyLoadError as exc:
        return f"{exc} (the controller imports it; run deploy where the code is importable)"
    return None


def read_metrics(store: DeploymentMetrics) -> tuple[Mapping[str, CustomMetric], float]:
    """The custom metrics and the queued requests of one deployment, as a policy sees them."""
    out: dict[str, CustomMetric] = {}
    for name in store.custom_names():
        summary = store.custom_summary(name)
        if summary is not None:
            total, n = summary
            out[name] = CustomMetric(total, total / n, n)
    return MappingProxyType(out), store.queued()


class _BadAnswer(Exception):
    pass


def _count_of(answer: Any) -> tuple[int, Mapping[str, Any] | None]:
    """The replica count (and new policy state) in a policy's answer; _BadAnswer if none."""
    state = None
    if isinstance(answer, tuple):
        if len(answer) != 2 or not isinstance(answer[1], Mapping):
            raise _BadAnswer(f"a tuple must be (count, policy_state mapping), got {answer!r:.80}")
        answer, state = answer
    if isinstance(answer, bool) or not isinstance(answer, numbers.Real):
        raise _BadAnswer(f"not a number: {type(answer).__name__} {answer!r:.80}")
    try:
        value = float(answer)
    except OverflowError:  # an int too large for a float: no fleet is that large either
        value = math.inf
    if not math.isfinite(value) or value < 0:
        raise _BadAnswer(f"not a replica count: {answer!r}")
    return math.ceil(value), state


class CustomPolicy:
    """One deployment's custom policy: its function (or why it has none), state and events."""

    def __init__(
        self,
        app: str,
        deployment: str,
        path: str,
        *,
        timer: Callable[[], float] = time.perf_counter,
        telemetry: PolicyTelemetry = TELEMETRY,
        loader: Callable[[str], Policy] = load_policy,
    ) -> None:
        self.app, self.deployment, self.path = app, deployment, path
        self._timer, self._telemetry, self._loader = timer, telemetry, loader
        self.fn: Policy | None = None
        self.load_error = ""
        self._reload_at: float | None = None
        self._load()
        self.policy_state: Mapping[str, Any] = MappingProxyType({})
        self._logged: dict[str, float] = {}
        self._suppressed: Counter[str] = Counter()

    def _load(self) -> None:
        try:
            self.fn = self._loader(self.path)
        except PolicyLoadError as exc:
            self.load_error = str(exc)

    def _retry_load(self, now: float) -> None:
        if self._reload_at is None:
            self._reload_at = now + RELOAD_AFTER_S
        elif now >= self._reload_at:
            self._reload_at = now + RELOAD_AFTER_S
            importlib.invalidate_caches()  # else a package installed meanwhile stays unseen
            self._load()

    def decide(
        self,
        cfg: AutoscalingConfig,
        state: PolicyState,
        inputs: PolicyInputs,
        metrics: tuple[Mapping[str, CustomMetric], float],
        now: float,
    ) -> tuple[PolicyState, Decision, list[StateEvent]]:
        events: list[StateEvent] = []
        if self.fn is None:
            self._retry_load(now)
        if self.fn is None:
            return self._fallback(cfg, state, inputs, now, NOT_LOADED, self.load_error, events)
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
            policy_state=self.policy_state,
            current_time=now,
            config=cfg,
            window_full=inputs.window_full,
        )
        started = self._timer()
        try:
            answer = self.fn(ctx)
            count, new_state = _count_of(answer)
        except _BadAnswer as exc:
            self._timed(started, now, events)
            return self._fallback(cfg, state, inputs, now, BAD_VALUE, str(exc), events)
        except (Exception, SystemExit) as exc:  # user code: nothing it raises may stop the member
            self._timed(started, now, events)
            why = f"{type(exc).__name__}: {exc}"
            return self._fallback(cfg, state, inputs, now, RAISED, why, events)
        self._timed(started, now, events)
        if new_state is not None:
            self.policy_state = MappingProxyType(dict(new_state))
        clipped = max(cfg.min_replicas, min(cfg.max_replicas, count))
        outcome = OK
        if clipped != count:
            outcome = CLIPPED
            bounds = f"[{cfg.min_replicas}, {cfg.max_replicas}]"
            self._event(events, now, "custom_policy_clipped", f"{count} -> {clipped} {bounds}")
        self._telemetry.calls[(self.app, self.deployment, outcome)] += 1
        return self._apply(state, inputs, clipped, count, events)

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
        self._event(events, now, "custom_policy_fallback", f"{self.path} {outcome}: {why}")
        new_state, d = decide(cfg, state, inputs, now)
        reason = f"custom policy {self.path} {outcome} ({why:.200}); default policy: {d.reason}"
        decision = Decision(d.target, d.desired, reason, d.changed, "custom_fallback")
        return new_state, decision, events

    def _timed(self, started: float, now: float, events: list[StateEvent]) -> None:
        took = self._timer() - started
        if len(self._telemetry.durations) < MAX_DURATION_SAMPLES:
            self._telemetry.durations.append(took)
        if took > SLOW_POLICY_S:
            self._telemetry.slow[(self.app, self.deployment)] += 1
            self._event(
                events,
                now,
                "custom_policy_slow",
                f"{self.path} took {took * 1000:.1f} ms (> {SLOW_POLICY_S * 1000:g} ms): "
                "it delays every deployment of this controller member",
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

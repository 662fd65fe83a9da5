"""The autoscaling policy: a pure function from (config, state, inputs, now) to a decision.

How it works. Each control-loop tick the controller calls `decide` with the deployment's
`AutoscalingConfig`, the `PolicyState` it got back last time, the demand it measured and the
monotonic `now`. The rules are checked in this order; the first that applies decides:

1. Fixed size (min_replicas == max_replicas): the target is that size, always.
2. Bounds: a target outside [min, max] (the config changed) is clipped at once.
3. Cold start: at target 0, a queued request (`cold_start`) or any demand scales at once, with
   no delay, to what the demand needs: max(1, min_replicas, ceil(demand / target)). The
   smoothing factor is not applied (there is no running count to smooth from).
4. Starting: a target above 0 with no replica running yet holds, up and down (as Ray Serve):
   with nothing served, queued demand grows with the start time and overstates the need; the
   first running replica gives a measurement.
5. No data (`demand_mean` None): hold. Missing data is not zero load.
6. Panic (only with `panic_mode`): short-window demand at `panic_threshold` x capacity
   (running replicas x target_ongoing_requests) scales up at once to ceil(demand_short /
   target), and forbids scale-down until `panic_window_s` after the last panicking tick.
7. Normal path, Ray Serve's arithmetic: raw = demand_mean / target_ongoing_requests, smoothed
   from the RUNNING count r (not the target, so replicas still starting are not counted twice):
   desired = ceil(r + factor * (raw - r)), at least r + 1 when growing and at most r - 1 when
   shrinking, clipped to [min, max]. Deliberate differences (docs/deploy.md, "Differences from
   Ray Serve"): when ceil(raw) == r the count is kept whatever the factor (Ray lets a
   downscaling factor above 1 shrink a deployment whose demand still needs every replica), and
   ratios are rounded to 9 digits before ceil so float noise (1.8 / 0.3 = 6.000000000000001)
   never costs a replica. A downscale from more than one replica stops at one; from one to zero
   the to-zero delay applies, so N -> 0 takes downscale_delay_s then downscale_to_zero_delay_s.
   A change of the target waits until the desired direction has held continuously for the
   delay, measured on `now` (wall time, not ticks): one tick short holds, at the delay it acts.
   A reversal, a steady tick or a tick without data resets the timer (a change of size in the
   same direction does not, as in Ray). No scale-down without a full window of data
   (`window_full`): after a start or a failover the controller rebuilds first, and the
   downscale timer only starts once the window is full (nor does it run while panicking);
   increases are allowed meanwhile. A change that acts clears the timer.

What `demand_mean` averages is the controller's business (demand_window.py): a rise above what
the target serves is averaged from its onset (`rise_level`), so idle time before a step does not
dilute it; otherwise it is the mean over the whole look-back window.

`Decision.reason` is a short human sentence for logs and status; `Decision.rule` is a stable token
saying which rule decided (the shell logs when `changed` or when the rule changes: the reason text
carries live numbers). Nothing here reads a clock, logs or does I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from shared.appconfig import AutoscalingConfig
from shared.errors import UsageError

Direction = Literal[-1, 0, 1]
UP: Direction = 1
DOWN: Direction = -1
NONE: Direction = 0

# Delays compare differences of float monotonic times (0.3 - 0.1 < 0.2): the boundary tick must act.
TIME_EPS_S = 1e-9
# demand / target in floats can land a hair above an integer (1.1 / 0.1 = 11.000000000000002);
# that must not cost a replica.
RATIO_DIGITS = 9


@dataclass(frozen=True, slots=True)
class PolicyState:
    """What the policy remembers between ticks for one deployment."""

    target: int
    watch_start: float  # when this controller started watching the deployment (window start)
    pending: Direction = NONE  # direction of a change waiting for its delay
    pending_since: float | None = None
    panic_until: float | None = None

    def __post_init__(self) -> None:
        if self.target < 0:
            raise UsageError(f"target must be >= 0, got {self.target}")
        if (self.pending == NONE) != (self.pending_since is None):
            raise UsageError("pending and pending_since must be set together")


@dataclass(frozen=True, slots=True)
class PolicyInputs:
    """What the controller measured this tick."""

    demand_mean: float | None  # time-weighted total demand over look_back_period_s
    demand_short: float | None  # same over panic_window_s (only read with panic_mode)
    window_full: bool  # the look-back window is fully covered by data
    cold_start: bool  # a router queued a request while the deployment has zero replicas
    running_replicas: int


# Which rule decided: a stable token for metric labels and log de-duplication (the reason text
# carries live numbers and changes every tick while a delay runs).
Rule = Literal[
    "fixed",
    "bounds",
    "cold_start",
    "starting",
    "no_data",
    "panic",
    "steady",
    "window_not_full",
    "panic_hold",
    "waiting",
    "upscale",
    "downscale",
    "custom",  # a custom policy decided (custom_policy.py)
    "custom_fallback",  # it failed: the rules above decided instead
]


@dataclass(frozen=True, slots=True)
class Decision:
    target: int  # the target after this tick
    desired: int  # where the target heads once delays allow (== target when nothing pends)
    reason: str
    changed: bool
    rule: Rule = "steady"


def initial_state(cfg: AutoscalingConfig, now: float) -> PolicyState:
    return PolicyState(target=cfg.initial, watch_start=now)


def _ceil(x: float) -> int:
    return math.ceil(round(x, RATIO_DIGITS))


def _clip(n: int, cfg: AutoscalingConfig) -> int:
    return max(cfg.min_replicas, min(cfg.max_replicas, n))


def _fmt(x: float) -> str:
    return f"{x:g}"


def needed_replicas(cfg: AutoscalingConfig, demand: float) -> int:
    """ceil(demand / target_ongoing_requests), not fooled by float noise."""
    return _ceil(demand / cfg.target_ongoing_requests)


def desired_replicas(cfg: AutoscalingConfig, running: int, demand: float) -> int:
    """The smoothed desired count for `demand` with `running` replicas, clipped to [min, max].

    The factor multiplies the gap between the need and the running count (rule 7).
    """
    raw = demand / cfg.target_ongoing_requests
    need = _ceil(raw)
    if need == running:
        return _clip(running, cfg)
    delta = raw - running
    if need > running:
        scaled = max(_ceil(running + cfg.upscaling_factor * delta), running + 1)
    else:
        scaled = min(_ceil(running + cfg.downscaling_factor * delta), running - 1)
    return _clip(scaled, cfg)


def rise_level(cfg: AutoscalingConfig, target: int) -> float:
    """The demand `target` replicas serve: a sample above it is a rise that needs more.

    The controller averages demand from the onset of a rise above this level (demand_window.py);
    the margin keeps a sample exactly at capacity, up to float rounding, from counting as a rise.
    """
    return target * cfg.target_ongoing_requests * (1 + 10.0**-RATIO_DIGITS)


def _panic_level(cfg: AutoscalingConfig, inputs: PolicyInputs) -> str | None:
    """Why this tick panics, or None."""
    short = inputs.demand_short
    if not cfg.panic_mode or short is None or short <= 0:
        return None
    capacity = inputs.running_replicas * cfg.target_ongoing_requests
    if short >= cfg.panic_threshold * capacity:
        return (
            f"short-window demand {short:.1f} >= {_fmt(cfg.panic_threshold)}x"
            f" capacity {_fmt(capacity)}"
        )
    return None


def decide(
    cfg: AutoscalingConfig, state: PolicyState, inputs: PolicyInputs, now: float
) -> tuple[PolicyState, Decision]:
    """One policy step; see the module docstring for the rules and their order."""
    cur = state.target
    panic_until = state.panic_until
    if panic_until is not None and now >= panic_until:
        panic_until = None

    def done(
        rule: Rule,
        target: int,
        desired: int,
        reason: str,
        pending: Direction = NONE,
        since: float | None = None,
    ) -> tuple[PolicyState, Decision]:
        new_state = PolicyState(
            target=target,
            watch_start=state.watch_start,
            pending=pending,
            pending_since=since,
            panic_until=panic_until,
        )
        return new_state, Decision(target, desired, reason, target != cur, rule)

    # 1. fixed size
    lo, hi = cfg.min_replicas, cfg.max_replicas
    if lo == hi:
        return done("fixed", lo, lo, f"fixed size {lo}")

    # 2. bounds
    if not lo <= cur <= hi:
        clipped = _clip(cur, cfg)
        return done("bounds", clipped, clipped, f"bounds {cur}->{clipped}: min {lo}, max {hi}")

    mean = inputs.demand_mean
    short = inputs.demand_short

    # 3. cold start
    # the short window counts only in panic mode: it may reach further back than the look-back
    # window and would otherwise wake a deployment that just went idle on stale load
    short_demand = cfg.panic_mode and (short or 0.0) > 0
    if cur == 0 and (inputs.cold_start or (mean or 0.0) > 0 or short_demand):
        want = max(1, lo, needed_replicas(cfg, mean or 0.0))
        if cfg.panic_mode and short is not None:
            want = max(want, needed_replicas(cfg, short))
        want = _clip(want, cfg)
        why = "queued request" if inputs.cold_start else f"demand {(mean or short or 0.0):.1f}"
        return done("cold_start", want, want, f"cold start from zero 0->{want}: {why}")

    # 4. starting
    running = inputs.running_replicas
    if running <= 0 < cur:
        return done("starting", cur, cur, f"hold: {cur} starting, none running yet")

    # 5. no data
    if mean is None:
        return done("no_data", cur, cur, "hold: no demand data in the look-back window")

    # 6. panic
    panic = _panic_level(cfg, inputs)
    if panic is not None and short is not None:
        panic_until = now + cfg.panic_window_s
        panic_target = _clip(needed_replicas(cfg, short), cfg)
        if panic_target > cur:
            return done(
                "panic", panic_target, panic_target, f"panic {cur}->{panic_target}: {panic}"
            )

    # 7. normal path
    desired = desired_replicas(cfg, running, mean)
    demand_txt = f"demand {mean:.1f} / target {_fmt(cfg.target_ongoing_requests)}"
    if desired == cur:
        return done("steady", cur, cur, f"hold: steady at {cur} ({demand_txt})")

    if desired > cur:
        direction: Direction = UP
        delay = cfg.upscale_delay_s
        delay_name = "upscale delay"
        verb: Rule = "upscale"
    else:
        if cur > 1:
            # Like Ray: only 1 -> 0 goes to zero, so the to-zero delay always governs that step.
            desired = max(1, desired)
        if not inputs.window_full:
            elapsed = now - state.watch_start
            return done(
                "window_not_full",
                cur,
                desired,
                f"hold: window not full (rebuilding after start, {elapsed:.1f} s ago)",
            )
        if panic_until is not None:
            left = panic_until - now
            return done(
                "panic_hold",
                cur,
                desired,
                f"hold: no scale-down while panicking ({left:.1f} s left)",
            )
        direction = DOWN
        if cur == 1 and desired == 0:
            delay = cfg.to_zero_delay_s
            delay_name = "to-zero delay"
        else:
            delay = cfg.downscale_delay_s
            delay_name = "downscale delay"
        verb = "downscale"

    since = state.pending_since if state.pending == direction else None
    if since is None:
        since = now
    elapsed = now - since
    if elapsed + TIME_EPS_S >= delay:
        return done(
            verb, desired, desired, f"{verb} {cur}->{desired}: {demand_txt} for {elapsed:.1f} s"
        )
    return done(
        "waiting",
        cur,
        desired,
        f"hold: waiting {elapsed:.1f}/{delay:.1f} s {delay_name} ({cur}->{desired})",
        direction,
        since,
    )

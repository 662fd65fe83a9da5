"""fleetpulse's default autoscaling policy against Ray Serve's own, on identical inputs.

    .venv/bin/pip install -e '.[ray]'          # ray[serve]==2.60.0, only this benchmark needs it
    .venv/bin/python -m scripts.bench.ray_policy [--runs 3000] [--seed 1] [--policy-file PATH]
    .venv/bin/python -m scripts.bench.ray_policy --smoke     # 200 runs, seconds

Each run draws a random config (min 0 half the time, factors other than 1, delays from 0 to 5 s)
and a random demand trace (idle stretches, plateaus, multiples of the target that land near
integers in floats, bursts, gaps without data) and steps both policies every 0.1 s of a fake
clock on the same inputs: the demand, the target, and the running count of a simulated
deployment whose replicas start after a random delay (so replicas start with none running).
Ray's side is its real code: `_apply_autoscaling_config(default policy)` as its
`AutoscalingState` builds it, then its bounds, with the module's clock pinned to the fake one.

A step agrees when both give the same target and the same pending delay timer (direction and
start; a timer toward a bound it cannot pass is invisible and ignored). At a disagreement the
step is classified by the documented difference that explains it (docs/deploy.md, "Differences
from Ray Serve") and fleetpulse is resynchronised to Ray's state, so every step is compared from
the same state. Output: agreement over all steps and runs, agreement outside the documented
differences (the target is 100%), every class with its count and a minimal example,
bench-results/ray_policy.json, and `RESULT bench=ray_policy ...`. `--policy-file` runs another
policy.py (for example main's, to measure before and after). `--smoke` runs 200 runs through
the same code (Ray's real policy) and writes its JSON to $FLEETPULSE_BENCH_OUT (else a temporary
directory), never over bench-results/; it exits 1 on an undocumented disagreement, as a full run.

Ray runs in-process only (no cluster is started); RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 is set.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import random
import sys
import tempfile
import time
import types
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from scripts.bench.common import OUT_ENV, add_smoke, print_table, result_line, shown, write_json
from shared.appconfig import AutoscalingConfig

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

TICK_S = 0.1
T0 = 1000.0
NEAR_INT = 1e-9
SMOKE_RUNS = 200

CLASSES = {
    "missing_data": "no data: Ray reads it as 0 requests, fleetpulse holds",
    "jump_from_zero": "none running, demand > 0: Ray max(ceil(upscaling_factor), target), "
    "fleetpulse the need from zero / hold while starting",
    "window_not_full": "fleetpulse starts no scale-down before the look-back window is full",
    "rounding": "a ratio a float hair off an integer: Ray's ceil takes the hair",
    "downscale_factor_gate": "ceil(need) == running: Ray still applies the downscaling factor",
    "undocumented": "not explained by any documented difference",
}


@dataclass
class Clock:
    now: float = T0

    def time(self) -> float:
        return self.now


@dataclass
class Tally:
    steps: int = 0
    agree: int = 0
    runs: int = 0
    runs_agree: int = 0
    by_class: Counter[str] = field(default_factory=Counter)
    runs_by_class: Counter[str] = field(default_factory=Counter)
    examples: dict[str, tuple[tuple[float, ...], dict[str, Any]]] = field(default_factory=dict)


class RayPolicy:
    """Ray Serve's default policy as its AutoscalingState wraps it, on a pinned clock."""

    def __init__(self, clock: Clock) -> None:
        from ray.serve import autoscaling_policy
        from ray.serve._private.autoscaling_state import _resolve_policy_callable
        from ray.serve._private.common import DeploymentID
        from ray.serve._private.constants import (
            SERVE_AUTOSCALING_DECISION_COUNTERS_KEY,
            SERVE_AUTOSCALING_DECISION_TIMESTAMP_KEY,
        )
        from ray.serve.config import AutoscalingConfig as RayConfig
        from ray.serve.config import AutoscalingContext

        # the delay logic reads time.time() of its own module: pin that module's view only
        autoscaling_policy.time = types.SimpleNamespace(time=clock.time)  # type: ignore[attr-defined,assignment]
        self._wrap = autoscaling_policy._apply_autoscaling_config
        self._resolve = _resolve_policy_callable
        self._ctx = AutoscalingContext
        self._ray_config = RayConfig
        self._dep = DeploymentID(name="d", app_name="a")
        self.counter_key = SERVE_AUTOSCALING_DECISION_COUNTERS_KEY
        self.ts_key = SERVE_AUTOSCALING_DECISION_TIMESTAMP_KEY
        self.clock = clock

    def config(self, c: AutoscalingConfig) -> Any:
        return self._ray_config(
            min_replicas=c.min_replicas,
            max_replicas=c.max_replicas,
            initial_replicas=c.initial_replicas,
            target_ongoing_requests=c.target_ongoing_requests,
            upscale_delay_s=c.upscale_delay_s,
            downscale_delay_s=c.downscale_delay_s,
            downscale_to_zero_delay_s=c.downscale_to_zero_delay_s,
            upscaling_factor=c.upscaling_factor,
            downscaling_factor=c.downscaling_factor,
            look_back_period_s=c.look_back_period_s,
            metrics_interval_s=c.metrics_interval_s,
        )

    def policy(self, ray_cfg: Any) -> Any:
        return self._wrap(self._resolve(ray_cfg.policy))

    def step(
        self,
        policy: Any,
        ray_cfg: Any,
        state: dict[str, Any],
        *,
        target: int,
        running: int,
        demand: float,
    ) -> tuple[int, dict[str, Any]]:
        ctx = self._ctx(
            deployment_id=self._dep,
            deployment_name="d",
            app_name="a",
            current_num_replicas=running,
            target_num_replicas=target,
            running_replicas=[],
            total_num_requests=demand,
            total_queued_requests=0.0,
            aggregated_metrics={},
            raw_metrics={},
            capacity_adjusted_min_replicas=ray_cfg.min_replicas,
            capacity_adjusted_max_replicas=ray_cfg.max_replicas,
            policy_state=dict(state),
            last_scale_up_time=None,
            last_scale_down_time=None,
            current_time=self.clock.now,
            config=ray_cfg,
        )
        n, new_state = policy(ctx)
        if isinstance(n, float):  # as AutoscalingState.get_decision_num_replicas
            n = math.ceil(n)
        return max(ray_cfg.min_replicas, min(ray_cfg.max_replicas, n)), dict(new_state)

    def timer(self, state: dict[str, Any], target: int, cfg: AutoscalingConfig) -> tuple[int, Any]:
        counter = state.get(self.counter_key, 0)
        ts = state.get(self.ts_key)
        if ts is None or counter == 0:
            return 0, None
        direction = 1 if counter > 0 else -1
        if (direction > 0 and target >= cfg.max_replicas) or (
            direction < 0 and target <= cfg.min_replicas
        ):
            return 0, None  # a timer toward a bound it cannot pass changes nothing
        return direction, ts


def load_policy(path: str | None) -> types.ModuleType:
    if path is None:
        from services.controller import policy

        return policy
    spec = importlib.util.spec_from_file_location("policy_under_test", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def random_config(rng: random.Random) -> tuple[AutoscalingConfig, float]:
    lo = rng.choice([0, 0, 0, 1, 2])
    hi = max(1, lo + rng.randint(0, 12))
    factors = [1.0, 1.0, 0.3, 0.5, 0.7, 1.5, 2.0, 3.0]
    cfg = AutoscalingConfig(
        min_replicas=lo,
        max_replicas=hi,
        initial_replicas=rng.choice([None, None, rng.randint(lo, hi)]),
        target_ongoing_requests=rng.choice([0.1, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 2.5, 3.0, 5.0]),
        upscale_delay_s=rng.choice([0.0, 0.1, 0.5, 1.0, 2.0, 3.0]),
        downscale_delay_s=rng.choice([0.0, 0.5, 1.0, 3.0, 5.0]),
        downscale_to_zero_delay_s=rng.choice([None, 0.0, 0.5, 2.0]),
        look_back_period_s=rng.choice([1.0, 2.0, 5.0]),
        metrics_interval_s=rng.choice([0.5, 1.0]),
        upscaling_factor=rng.choice(factors),
        downscaling_factor=rng.choice(factors),
    )
    start_s = rng.choice([0.0, 0.1, 0.3, 1.0, 2.0])
    return cfg, start_s


def random_trace(rng: random.Random, cfg: AutoscalingConfig, ticks: int) -> list[float | None]:
    out: list[float | None] = []
    t = cfg.target_ongoing_requests
    while len(out) < ticks:
        kind = rng.random()
        if kind < 0.2:
            level: float | None = 0.0
        elif kind < 0.45:
            # multiples of the target, as decimals: 1.8 / 0.3 lands a hair above 6
            level = round(rng.randint(1, 3 * cfg.max_replicas) * t, 6)
        elif kind < 0.55:
            level = rng.uniform(5, 50) * t  # a burst
            out += [level] * rng.randint(1, 4)
            continue
        elif kind < 0.6:
            level = None  # no data
        else:
            level = rng.uniform(0, 1.5 * cfg.max_replicas * t)
        out += [level] * rng.randint(2, 40)
    return out[:ticks]


def near_int(x: float) -> bool:
    return x != round(x) and abs(x - round(x)) < NEAR_INT


def classify(
    cfg: AutoscalingConfig,
    *,
    target: int,
    running: int,
    demand: float | None,
    rule: str,
    fp_target: int,
    fp_desired: int,
) -> str:
    """The documented row that explains a disagreement, checking that fleetpulse did what the
    row says it does (else it is undocumented)."""
    held = fp_target == target
    if demand is None:
        return "missing_data" if held else "undocumented"
    if running == 0 and demand > 0:
        need = math.ceil(round(demand / cfg.target_ongoing_requests, 9))
        jump = max(cfg.min_replicas, min(cfg.max_replicas, max(1, need)))
        ok = fp_target == (jump if target == 0 else target)
        return "jump_from_zero" if ok else "undocumented"
    if rule == "window_not_full":
        return "window_not_full" if held else "undocumented"
    if running > 0:
        raw = running * (demand / (cfg.target_ongoing_requests * running))  # Ray's arithmetic
        for f in (cfg.upscaling_factor, cfg.downscaling_factor):
            if near_int(raw) or near_int(running + f * (raw - running)):
                return "rounding"
        if raw < running and math.ceil(round(raw, 9)) == running:
            kept = fp_desired == max(cfg.min_replicas, min(cfg.max_replicas, running))
            return "downscale_factor_gate" if kept else "undocumented"
    return "undocumented"


def run_one(seed: int, ray: RayPolicy, pol: types.ModuleType, tally: Tally, ticks: int) -> None:
    rng = random.Random(seed)
    cfg, start_s = random_config(rng)
    trace = random_trace(rng, cfg, ticks)
    restart_at = rng.choice([None, None, rng.randint(0, ticks - 1)])  # a failover: rebuild
    ray_cfg = ray.config(cfg)
    ray_policy = ray.policy(ray_cfg)
    clock = ray.clock
    clock.now = T0
    target = max(cfg.min_replicas, min(cfg.max_replicas, cfg.initial))
    ray_state: dict[str, Any] = {}
    fp_state = pol.PolicyState(target=target, watch_start=T0)
    ready_at = [T0] * target  # the first replicas start with the run
    classes_this_run: set[str] = set()
    for i, demand in enumerate(trace):
        now = T0 + i * TICK_S
        clock.now = now
        if restart_at == i:
            fp_state = pol.PolicyState(
                target=fp_state.target,
                watch_start=now,
                pending=fp_state.pending,
                pending_since=fp_state.pending_since,
            )
        running = sum(1 for r in ready_at if r <= now + 1e-9)
        full = now - fp_state.watch_start + 1e-9 >= cfg.look_back_period_s
        inputs = pol.PolicyInputs(
            demand_mean=demand,
            demand_short=None,
            window_full=full,
            cold_start=False,
            running_replicas=running,
        )
        timer_before = ray.timer(ray_state, target, cfg)
        fp_state, decision = pol.decide(cfg, fp_state, inputs, now)
        ray_target, ray_state = ray.step(
            ray_policy,
            ray_cfg,
            ray_state,
            target=target,
            running=running,
            demand=0.0 if demand is None else demand,
        )
        ray_timer = ray.timer(ray_state, ray_target, cfg)
        fp_timer = (
            (0, None) if fp_state.pending == 0 else (int(fp_state.pending), fp_state.pending_since)
        )
        tally.steps += 1
        if ray_target == decision.target and ray_timer == fp_timer:
            tally.agree += 1
        else:
            cls = classify(
                cfg,
                target=target,
                running=running,
                demand=demand,
                rule=decision.rule,
                fp_target=decision.target,
                fp_desired=decision.desired,
            )
            tally.by_class[cls] += 1
            classes_this_run.add(cls)
            example = {
                "config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
                "target": target,
                "running": running,
                "demand": demand,
                "window_full": full,
                "timer_before": timer_before,
                "ray": ray_target,
                "ray_timer": ray_timer,
                "fleetpulse": decision.target,
                "fleetpulse_timer": fp_timer,
                "rule": decision.rule,
            }
            size = (cfg.max_replicas, target, demand or 0.0, i)
            if cls not in tally.examples or size < tally.examples[cls][0]:
                tally.examples[cls] = (size, example)
            # resynchronise fleetpulse to Ray's state: the next step compares from the same place
            direction, since = ray_timer
            fp_state = pol.PolicyState(
                target=ray_target,
                watch_start=fp_state.watch_start,
                pending=direction,
                pending_since=since,
            )
        target = ray_target
        while len(ready_at) < target:
            ready_at.append(now + start_s)
        del ready_at[target:]
    tally.runs += 1
    if not classes_this_run:
        tally.runs_agree += 1
    for c in classes_this_run:
        tally.runs_by_class[c] += 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=3000)
    ap.add_argument("--ticks", type=int, default=200, help="0.1 s steps per run")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--policy-file", help="a policy.py to compare instead of this tree's")
    ap.add_argument("--name", default="ray_policy", help="name of the JSON and RESULT line")
    add_smoke(ap, f"{SMOKE_RUNS} runs")
    args = ap.parse_args(argv)
    if args.smoke:
        args.runs = SMOKE_RUNS
        if not os.environ.get(OUT_ENV):
            os.environ[OUT_ENV] = tempfile.mkdtemp(prefix="fleetpulse-smoke-")
    # Ray's config warns that look_back_period_s should exceed metrics_interval_s: not a policy input
    warnings.filterwarnings("ignore", category=FutureWarning)
    try:
        ray = RayPolicy(Clock())
    except ImportError as e:
        print(f"ray[serve] is not installed ({e}): pip install -e '.[ray]'", file=sys.stderr)
        return 2
    pol = load_policy(args.policy_file)
    tally = Tally()
    started = time.perf_counter()
    for k in range(args.runs):
        run_one(args.seed * 1_000_003 + k, ray, pol, tally, args.ticks)
    elapsed = time.perf_counter() - started

    documented = sum(n for c, n in tally.by_class.items() if c != "undocumented")
    undocumented = tally.by_class["undocumented"]
    outside = tally.steps - documented
    step_agree = tally.agree / tally.steps
    outside_agree = (outside - undocumented) / outside if outside else 1.0
    runs_undoc = tally.runs_by_class["undocumented"]
    rows = [
        ["all steps", tally.steps, tally.agree, f"{100 * step_agree:.2f}%"],
        ["steps outside documented differences", outside, outside - undocumented,
         f"{100 * outside_agree:.3f}%"],
        ["runs agreeing at every step", tally.runs, tally.runs_agree,
         f"{100 * tally.runs_agree / tally.runs:.1f}%"],
        ["runs without an undocumented step", tally.runs, tally.runs - runs_undoc,
         f"{100 * (tally.runs - runs_undoc) / tally.runs:.1f}%"],
    ]  # fmt: skip
    print_table(
        f"fleetpulse vs Ray Serve 2.60 default policy ({args.runs} runs x {args.ticks} steps,"
        f" {elapsed:.1f} s)",
        ["", "n", "agree", "rate"],
        rows,
    )
    class_rows = [
        [c, tally.by_class[c], tally.runs_by_class[c], CLASSES[c]]
        for c in CLASSES
        if tally.by_class[c]
    ]
    print_table("disagreements by class", ["class", "steps", "runs", "meaning"], class_rows)
    for c in CLASSES:
        if c in tally.examples:
            print(f"\nminimal example, {c}:")
            ex = tally.examples[c][1]
            cfg = {k: v for k, v in ex["config"].items() if v != getattr(AutoscalingConfig(), k)}
            print(f"  config (non-defaults): {cfg}")
            print(
                "  target {target}, running {running}, demand {demand}, window full"
                " {window_full}, Ray timer before {timer_before}".format(**ex)
            )
            print(
                "  Ray -> {ray} (timer {ray_timer}); fleetpulse -> {fleetpulse}"
                " (timer {fleetpulse_timer}, rule {rule})".format(**ex)
            )
    path = write_json(
        args.name,
        {
            "runs": tally.runs,
            "ticks": args.ticks,
            "seed": args.seed,
            "policy_file": args.policy_file,
            "steps": tally.steps,
            "steps_agree": tally.agree,
            "steps_outside_documented": outside,
            "undocumented_steps": undocumented,
            "runs_agree": tally.runs_agree,
            "by_class": dict(tally.by_class),
            "runs_by_class": dict(tally.runs_by_class),
            "examples": {c: e for c, (_, e) in tally.examples.items()},
        },
    )
    print(f"\nwrote {shown(path)}")
    result_line(
        args.name,
        step_agreement=step_agree,
        outside_documented_agreement=outside_agree,
        run_agreement=tally.runs_agree / tally.runs,
        undocumented_steps=undocumented,
    )
    return 0 if undocumented == 0 or args.policy_file else 1


if __name__ == "__main__":
    sys.exit(main())

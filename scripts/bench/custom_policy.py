"""What running custom policies in the policy worker process costs the control loop, against
calling them inline (in the loop's own thread, as before the worker existed).

How it works: N deployments' calls of the example policy (services/examples/kv_policy.py, a few
microseconds of Python) are made as one tick's batch, T ticks in a row, by the in-process runner
(policy_runner.InlineRunner) and by the worker-process runner (policy_host.ProcessRunner, one
round trip per tick), each policy's state carried from answer to call as the core does. Per tick:
the wall time the loop waits (the whole batch, worker included) and the loop thread's CPU time.
The per-call overhead is (process - inline) / N. The default (built-in) policy never reaches a
runner, so it is not measured here (fleet_core.py measures the tick with it).

    .venv/bin/python -m scripts.bench.custom_policy [--calls 1,10,100,1000] [--ticks 300] [--smoke]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from scripts.bench.common import add_smoke, print_table, result_line, write_json
from services.controller import custom_policy as cp
from services.controller.custom_policy import (
    EMPTY_STATE,
    AutoscalingContext,
    CustomMetric,
    PolicyCall,
    PolicyRunner,
    PolicyTelemetry,
)
from services.controller.policy_host import ProcessRunner
from services.controller.policy_runner import InlineRunner
from shared.appconfig import AutoscalingConfig

POLICY = "services.examples.kv_policy:scale_on_kv_cache"
START_S = 60.0
SMOKE_CALLS, SMOKE_TICKS = [1, 10], 20


def calls_for(n: int, states: list[object], now: float) -> list[PolicyCall]:
    out = []
    for i in range(n):
        cfg = CONFIGS[i % len(CONFIGS)]
        metrics = MappingProxyType({"kv_cache_use": CustomMetric(1.6 + i % 3 * 0.1, 0.8, 2)})
        ctx = AutoscalingContext(
            f"app{i}", "Model", 2, 2, 4.0, 0.0, metrics, 1, 8, EMPTY_STATE, now, cfg, True
        )
        out.append(PolicyCall(POLICY, ctx, states[i]))
    return out


CONFIGS = [AutoscalingConfig(min_replicas=1, max_replicas=8 + i, policy=POLICY) for i in range(50)]
"""Distinct configs, as distinct deployments have (each is sent to the worker once)."""


def measure(runner: PolicyRunner, n: int, ticks: int) -> dict[str, Any]:
    states: list[object] = [None] * n
    wall, cpu = [], []
    deadline = time.monotonic() + START_S
    warm = 0
    while warm < 5:  # the worker starts and imports; then a few ticks to warm up
        answers = runner.run(calls_for(n, states, time.monotonic()))
        warm = warm + 1 if all(a.outcome == cp.OK for a in answers) else 0
        if time.monotonic() > deadline:
            raise SystemExit(f"the runner did not answer within {START_S:g} s: {answers[:1]}")
        if warm == 0:
            time.sleep(0.05)
    for _ in range(ticks):
        calls = calls_for(n, states, time.monotonic())  # built by the core either way: not timed
        t0, c0 = time.perf_counter(), time.thread_time()
        answers = runner.run(calls)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
        for i, a in enumerate(answers):
            assert a.outcome == cp.OK, a
            if a.state is not None:
                states[i] = a.state
        time.sleep(0.005)  # ticks are apart in a member: the worker is idle between them
    w, c = np.asarray(wall) * 1e6, np.asarray(cpu) * 1e6
    return {
        "wall_p50_us": float(np.percentile(w, 50)),
        "wall_p99_us": float(np.percentile(w, 99)),
        "cpu_p50_us": float(np.percentile(c, 50)),
    }


def run(sizes: Sequence[int], ticks: int) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    process = ProcessRunner(telemetry=PolicyTelemetry())
    try:
        for n in sizes:
            inline = measure(InlineRunner(), n, ticks)
            worker = measure(process, n, ticks)
            rows[str(n)] = {
                "inline": inline,
                "process": worker,
                "overhead_per_call_us": (worker["wall_p50_us"] - inline["wall_p50_us"]) / n,
                "loop_cpu_per_call_us": (worker["cpu_p50_us"] - inline["cpu_p50_us"]) / n,
            }
    finally:
        process.close()
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", default="1,10,100,1000", help="calls per tick, a comma list")
    ap.add_argument("--ticks", type=int, default=300)
    add_smoke(ap, "1 and 10 calls per tick, 20 ticks")
    args = ap.parse_args(argv)
    sizes = SMOKE_CALLS if args.smoke else [int(x) for x in args.calls.split(",")]
    ticks = SMOKE_TICKS if args.smoke else args.ticks
    rows = run(sizes, ticks)
    print_table(
        f"custom policy calls per tick: inline vs the worker process ({ticks} ticks, p50)",
        ["calls", "inline us", "process us", "p99 us", "overhead us/call", "loop CPU us/call"],
        [
            [
                int(n), r["inline"]["wall_p50_us"], r["process"]["wall_p50_us"],
                r["process"]["wall_p99_us"], r["overhead_per_call_us"], r["loop_cpu_per_call_us"],
            ]
            for n, r in rows.items()
        ],
    )  # fmt: skip
    path = write_json("custom_policy", {"ticks": ticks, "by_calls": rows})
    print(f"\nwrote {path}")
    last = rows[str(sizes[-1])]
    one = rows[str(sizes[0])]
    result_line(
        "custom_policy",
        round_trip_us=one["process"]["wall_p50_us"] - one["inline"]["wall_p50_us"],
        calls=sizes[-1],
        overhead_per_call_us=last["overhead_per_call_us"],
    )


if __name__ == "__main__":
    main()

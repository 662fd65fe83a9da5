"""The Ray Serve baseline of scripts/bench/step_response.py: the same step on Ray Serve 2.60.

    .venv/bin/python -m scripts.bench.step_response_ray [--runs 3] [--smoke]

Used by `step_response --ray`, or alone (needs `pip install -e '.[ray]'`). A local Ray instance
on loopback (no dashboard, no usage stats), one deployment with the same latency and autoscaling
config, 8 closed-loop callers through its DeploymentHandle from this process; `serve.status()`
polled for the replica counts: every replica not stopping counts toward the target, RUNNING ones
as running. Alone it prints `RESULT bench=step_response_ray ...` and writes
bench-results/step_response_ray.json; it exits 1 when a step never reaches a target of 4 or 4
running. `--smoke`: one step (2 s idle, 10 s held) on the same real Ray Serve, its JSON to
$FLEETPULSE_BENCH_OUT (else a temporary directory), never over bench-results/.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from dataclasses import asdict
from typing import Any

from scripts.bench.common import OUT_ENV, add_smoke, shown, write_json
from scripts.bench.step_response import (
    CALLERS,
    LATENCY_S,
    NEED,
    POLL_S,
    SMOKE,
    Callers,
    Sizes,
    Timeline,
    ray_result_line,
    step_metrics,
    step_problems,
)

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

AUTOSCALING = {
    "min_replicas": 1,
    "max_replicas": 8,
    "target_ongoing_requests": 2,
    "upscale_delay_s": 2,
    "downscale_delay_s": 5,
    "downscale_to_zero_delay_s": 5,
    "look_back_period_s": 5,
    "metrics_interval_s": 1,
}


def ray_step_runs(
    runs: int, *, hold_s: float, latency_s: float, callers: int, idle_s: float = 6.0
) -> dict[str, Any]:
    import ray
    from ray import serve

    ray.init(
        num_cpus=8,  # logical slots for the replicas (each asks 0.1); the machine's cores are 2
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
    )
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": 0})

        @serve.deployment(
            max_ongoing_requests=4,
            autoscaling_config=AUTOSCALING,
            ray_actor_options={"num_cpus": 0.1},
            graceful_shutdown_timeout_s=2,
        )
        class Model:
            async def predict(self, x: float) -> dict[str, float]:
                await asyncio.sleep(latency_s)
                return {"y": 2 * x}

        handle = serve.run(Model.bind(), name="step", route_prefix=None)  # type: ignore[attr-defined]
        return asyncio.run(_runs(handle, runs, hold_s, callers, idle_s))
    finally:
        serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()


def _counts() -> tuple[int, int]:
    from ray import serve

    app = serve.status().applications.get("step")
    if app is None or "Model" not in app.deployments:
        return -1, -1
    states = {str(k).split(".")[-1]: v for k, v in app.deployments["Model"].replica_states.items()}
    running = states.get("RUNNING", 0)
    target = running + states.get("STARTING", 0) + states.get("UPDATING", 0)
    return target, running


async def _runs(
    handle: Any, runs: int, hold_s: float, n_callers: int, idle_s: float
) -> dict[str, Any]:
    predict = handle.options(method_name="predict")
    out: list[dict[str, Any]] = []
    for i in range(runs):
        deadline = time.monotonic() + 120
        while await asyncio.to_thread(_counts) != (1, 1):
            if time.monotonic() > deadline:
                raise TimeoutError("Ray Serve did not come back to 1 replica")
            await asyncio.sleep(0.2)
        await asyncio.sleep(idle_s)
        callers = Callers(lambda: predict.remote(1.0))
        tl = Timeline()
        t0 = time.monotonic()
        callers.add(n_callers)
        while time.monotonic() - t0 < hold_s:
            target, running = await asyncio.to_thread(_counts)
            tl.points.append((time.monotonic() - t0, target, running))
            await asyncio.sleep(POLL_S)
        await callers.stop()
        m = step_metrics(tl, hold_s)
        m["failed"] = callers.failed
        out.append(m)
        print(f"ray serve step {i + 1}/{runs}: {m} (need {NEED})", flush=True)
    return {"step": out}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="step repetitions")
    add_smoke(ap, "1 step of 10 s")
    args = ap.parse_args(argv)
    sizes = SMOKE if args.smoke else Sizes(runs=args.runs)
    if args.smoke and not os.environ.get(OUT_ENV):
        os.environ[OUT_ENV] = tempfile.mkdtemp(prefix="fleetpulse-smoke-")
    try:
        import ray  # noqa: F401
    except ImportError as e:
        print(f"ray[serve] is not installed ({e}): pip install -e '.[ray]'", file=sys.stderr)
        return 2
    res = ray_step_runs(
        sizes.runs, hold_s=sizes.hold_s, latency_s=LATENCY_S, callers=CALLERS, idle_s=sizes.idle_s
    )
    path = write_json(
        "step_response_ray", {"ray": res, "runs": sizes.runs, "smoke": args.smoke,
                              "sizes": asdict(sizes)},
    )  # fmt: skip
    print(f"\nwrote {shown(path)}")
    ray_result_line(res["step"])
    problems = step_problems("ray serve", res["step"])
    for p in problems:
        print(f"FAILED: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

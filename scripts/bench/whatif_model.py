"""Closed-loop what-if speed: simulated time per second of wall time for a 1,000-replica fleet.

    .venv/bin/python -m scripts.bench.whatif_model [--quick] [--replicas 1000] [--deployments 1]
        [--routers 10] [--duration-s 3600]
    .venv/bin/python -m scripts.bench.whatif_model --smoke   # seconds: 20 replicas, 2 routers

The recording: `--deployments` deployments sharing `--replicas` replicas, each behind
`--routers` routers that send a columnar handle report every 10 s covering their share, with
request stats (seeded Poisson arrivals following whatif.py's compressed day, service time
0.2 s growing by half per extra request in flight). Measured: loading the rows, calibrating,
and the closed-loop simulation at the controller's 0.1 s step, twice to check the JSON is
byte-identical. Target: >= 100x real time for load + calibrate + simulate.

Output: a table, bench-results/whatif_model.json and `RESULT bench=whatif_model ...`. With
$FLEETPULSE_BENCH_OUT set the JSON goes there; `--smoke` (20 replicas, 2 routers, 5 minutes)
never writes over bench-results (a temporary directory if the variable is unset) and fails
(exit 1) if the rerun is not byte-identical; the speed target is only reported.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from scripts.bench.common import print_table, result_line, write_json
from scripts.bench.whatif import (
    REPORT_INTERVAL_S,
    START_WALL,
    TARGET_SPEEDUP,
    bench_out,
    load_per_replica,
)
from services.whatif import closedloop
from services.whatif.run import load_report_rows
from services.whatif.simulate import ModelOptions, simulate_closed
from shared.appconfig import AppConfig, AutoscalingConfig, DeploymentConfig
from shared.recording import RecordingWriter, WriterConfig, wall_to_us
from shared.subjects import DEFAULT_SUBJECTS
from shared.wire.columnar import handle_report_to_columnar
from shared.wire.messages import HandleReport, RequestStats

SEED = 20240518
APP = "bench"
BASE_S = 0.2
SLOPE = 0.5


def service_s(c: float) -> float:
    return BASE_S * (1 + SLOPE * max(c - 1.0, 0.0))


def generate(out: Path, replicas: int, deployments: int, routers: int, duration_s: float) -> int:
    rng = np.random.default_rng(SEED)
    per_dep = math.ceil(replicas / deployments)
    per_router = math.ceil(per_dep / routers)
    writer = RecordingWriter(WriterConfig(out, prefix="bench", batch_rows=500))
    events = sorted(
        (float(t), d, r, seq)
        for d in range(deployments)
        for r in range(routers)
        for seq, t in enumerate(
            np.arange(
                (d * routers + r) * REPORT_INTERVAL_S / (deployments * routers),
                duration_s,
                REPORT_INTERVAL_S,
            )
        )
    )
    counters = np.zeros((deployments, routers, 6))  # arrived, s, s^2, c, c^2, c*s
    for t, d, r, seq in events:
        dep = f"d{d:03d}"
        mine = [f"{dep}-{r:02d}-{i:04d}" for i in range(per_router)]
        level = float(load_per_replica(np.array([t]), duration_s)[0])
        s = service_s(level)
        n = int(rng.poisson(level * per_router / s * REPORT_INTERVAL_S))
        k = max(1, round(level))
        s = service_s(k)
        counters[d, r] += (n, n * s, n * s * s, n * k, n * k * k, n * k * s)
        arrived, total_s, total_sq, c, cc, cs = counters[d, r].tolist()
        stats = RequestStats(int(arrived), int(arrived), total_s, total_sq, 0.0, 0, 0, int(c),
                             int(cc), cs)  # fmt: skip
        running = np.clip(rng.normal(level, 0.1 * level, per_router), 0.0, None)
        report = HandleReport(
            f"router-{dep}-{r}", APP, dep, START_WALL + t, seq + 1, 0.0,
            dict(zip(mine, running.tolist(), strict=True)), (), 1, stats=stats,
        )  # fmt: skip
        for part in handle_report_to_columnar(report):
            writer.append(wall_to_us(START_WALL + t + 0.002),
                          DEFAULT_SUBJECTS.report("handle", APP, dep), part)  # fmt: skip
    writer.close()
    return writer.messages


def config(replicas: int, deployments: int) -> list[AppConfig]:
    per = math.ceil(replicas / deployments)
    scaling = AutoscalingConfig(min_replicas=1, max_replicas=2 * per, target_ongoing_requests=2)
    deps = tuple(
        DeploymentConfig(f"d{d:03d}", "services.examples.model:Model", autoscaling=scaling)
        for d in range(deployments)
    )
    return [AppConfig(APP, deps)]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--replicas", type=int, default=1000)
    ap.add_argument("--deployments", type=int, default=1)
    ap.add_argument("--routers", type=int, default=10)
    ap.add_argument("--duration-s", type=float, default=3600.0)
    ap.add_argument("--interval-s", type=float, default=0.1)
    ap.add_argument("--quick", action="store_true", help="10 minutes instead of an hour")
    ap.add_argument("--smoke", action="store_true", help="seconds: 20 replicas, 2 routers, 5 min")
    args = ap.parse_args(argv)
    if args.smoke:
        args.replicas, args.routers, args.duration_s, args.quick = 20, 2, 300.0, False
    duration = 600.0 if args.quick else args.duration_s
    apps = config(args.replicas, args.deployments)
    opts = ModelOptions(interval_s=args.interval_s)
    with tempfile.TemporaryDirectory(prefix="fp-model-") as tmp:
        messages = generate(Path(tmp), args.replicas, args.deployments, args.routers, duration)
        t = time.perf_counter()
        rows = load_report_rows(tmp)
        load_s = time.perf_counter() - t
        t = time.perf_counter()
        cals = closedloop.calibrate_for(rows, [apps], opts.namespace)
        cal_s = time.perf_counter() - t
        t = time.perf_counter()
        start_us, span = closedloop.recording_span(rows)
        result = simulate_closed(cals, apps, span, start_us, opts)
        sim_s = time.perf_counter() - t
        first = closedloop.closed_json([("bench", result)])
        again = closedloop.closed_json(closedloop.run_closed(rows, [("bench", apps)], opts))
    total = load_s + cal_s + sim_s
    speedup = duration / total
    print_table(
        f"closed-loop what-if: {args.replicas} replicas in {args.deployments} deployment(s), "
        f"{args.routers} routers each, {duration:.0f} s, step {args.interval_s:g} s",
        ["phase", "seconds", "vs real time"],
        [
            ["load rows", load_s, f"{duration / load_s:,.0f}x"],
            ["calibrate", cal_s, f"{duration / cal_s:,.0f}x"],
            ["simulate", sim_s, f"{duration / sim_s:,.0f}x"],
            ["total", total, f"{speedup:,.0f}x"],
        ],
    )
    peak = max(int(r.running.max()) for r in result.deployments.values())
    fleet_peak = int(sum(r.running.max() for r in result.deployments.values()))
    deterministic = first == again
    print(f"\nmessages {messages}, peak running {peak} per deployment ({fleet_peak} summed), "
          f"byte-identical rerun: {deterministic}")  # fmt: skip
    ok = speedup >= TARGET_SPEEDUP
    print(f"target: >= {TARGET_SPEEDUP:.0f}x real time: {'met' if ok else 'NOT met'}")
    path = write_json(
        "whatif_model",
        {
            "params": vars(args) | {"duration_s": duration},
            "messages": messages,
            "load_s": load_s,
            "calibrate_s": cal_s,
            "simulate_s": sim_s,
            "speedup_vs_realtime": speedup,
            "deterministic": deterministic,
            "peak_running_summed": fleet_peak,
        },
        bench_out(args.smoke),
    )
    print(f"wrote {path}")
    result_line("whatif_model", deployments=args.deployments, speedup_vs_realtime=float(speedup))
    return 0 if deterministic else 1


if __name__ == "__main__":
    sys.exit(main())

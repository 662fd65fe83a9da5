"""What-if replay benchmark: simulated time per second of wall time on a synthetic recording.

The recording: R routers, each sending a columnar handle report every 10 s that covers its own
share of the fleet (default 10 routers x 100 replicas = 1,000 replicas) for one hour, under a
diurnal-ish load curve (one compressed "day" per hour: a night trough, a morning ramp, a midday
bump, an evening decline) with seeded noise. The reports are encoded exactly as routers encode
them (`handle_report_to_columnar`) and written with the recorder's `RecordingWriter`. Measured:
loading the recording's report rows (read, validate, filter, sort) and the simulation itself
(`whatif.simulate` with the controller's 0.1 s control interval), run twice to check the JSON is
byte-identical. The target is 100x faster than real time.

    .venv/bin/python -m scripts.bench.whatif [--quick] [--replicas 1000] [--routers 10]
        [--duration-s 3600] [--plot docs/img/whatif.png]
    .venv/bin/python -m scripts.bench.whatif --smoke    # seconds: 20 replicas, 2 routers, 5 min

Output: a table, bench-results/whatif.json, the PNG if asked for, and
`RESULT bench=whatif speedup_vs_realtime=X`. With $FLEETPULSE_BENCH_OUT set, the JSON and the
PNG go there instead (the PNG under its own file name); `--smoke` also draws the PNG, there or
in a temporary directory, and never writes over bench-results or docs/img. A smoke run fails
(exit 1) if the rerun is not byte-identical; the speed target is only reported.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from scripts.bench.common import print_table, result_line, write_json
from services.whatif import model as whatif
from services.whatif.run import load_report_rows
from shared.appconfig import AppConfig, AutoscalingConfig, DeploymentConfig
from shared.recording import RecordingWriter, WriterConfig, wall_to_us
from shared.subjects import DEFAULT_SUBJECTS
from shared.wire.columnar import handle_report_to_columnar
from shared.wire.messages import HandleReport

TARGET_SPEEDUP = 100.0
REPORT_INTERVAL_S = 10.0
START_WALL = 1_714_521_600.0  # 2024-05-01T00:00:00Z: a fixed start keeps the input identical
SEED = 20240501
APP, DEPLOYMENT = "bench", "model"


def load_per_replica(t: np.ndarray, duration_s: float) -> np.ndarray:
    """Mean running requests per replica at times `t`: 0.2 at night up to ~2.4 at midday."""
    phase = t / duration_s
    day = 0.5 - 0.5 * np.cos(2 * np.pi * phase)
    midday = 0.35 * np.exp(-(((phase - 0.5) / 0.08) ** 2))
    return np.asarray(0.2 + 1.9 * day + midday, dtype=np.float64)


def generate(out_dir: Path, replicas: int, routers: int, duration_s: float) -> tuple[int, int]:
    """Write the synthetic recording; returns (messages, bytes written)."""
    rng = np.random.default_rng(SEED)
    per_router = math.ceil(replicas / routers)
    ids = [f"{DEPLOYMENT}-{i:05x}" for i in range(replicas)]
    subject = DEFAULT_SUBJECTS.report("handle", APP, DEPLOYMENT)
    writer = RecordingWriter(WriterConfig(out_dir, prefix="bench", batch_rows=500))
    events = []
    for r in range(routers):
        offset = r * REPORT_INTERVAL_S / routers  # routers do not report in lockstep
        for seq, t in enumerate(np.arange(offset, duration_s, REPORT_INTERVAL_S)):
            events.append((float(t), r, seq))
    events.sort()
    for t, r, seq in events:
        mine = ids[r * per_router : (r + 1) * per_router]
        level = float(load_per_replica(np.array([t]), duration_s)[0])
        running = np.clip(rng.normal(level, 0.3 * level, len(mine)), 0.0, None)
        report = HandleReport(
            handle_id=f"router-{r}",
            app=APP,
            deployment=DEPLOYMENT,
            sent_at=START_WALL + t,
            seq=seq + 1,
            queued_requests=float(max(0.0, rng.normal(level - 2.0, 0.5))) * 10,
            running=dict(zip(mine, running.tolist(), strict=True)),
            health=(),
            membership_epoch=1,
        )
        for part in handle_report_to_columnar(report):
            writer.append(wall_to_us(START_WALL + t + 0.002), subject, part)
    writer.close()
    return writer.messages, writer.bytes_written


def config(replicas: int) -> list[AppConfig]:
    scaling = AutoscalingConfig(
        min_replicas=1, max_replicas=2 * replicas, target_ongoing_requests=2
    )
    dep = DeploymentConfig(DEPLOYMENT, "services.examples.echo:Echo", autoscaling=scaling)
    return [AppConfig(APP, (dep,))]


def bench_out(smoke: bool) -> Path | None:
    """Where a bench writes: $FLEETPULSE_BENCH_OUT if set; else a temporary directory for a
    smoke run (never bench-results or docs/img); else None (bench-results, paths as given)."""
    env = os.environ.get("FLEETPULSE_BENCH_OUT")
    if env:
        out = Path(env)
        out.mkdir(parents=True, exist_ok=True)
        return out
    return Path(tempfile.mkdtemp(prefix="fp-bench-smoke-")) if smoke else None


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--replicas", type=int, default=1000)
    ap.add_argument("--routers", type=int, default=10)
    ap.add_argument("--duration-s", type=float, default=3600.0)
    ap.add_argument("--interval-s", type=float, default=whatif.DEFAULT_INTERVAL_S)
    ap.add_argument("--quick", action="store_true", help="10 minutes instead of an hour")
    ap.add_argument("--plot", type=Path, default=None, help="write demand vs replicas here")
    ap.add_argument("--smoke", action="store_true", help="seconds: 20 replicas, 2 routers, 5 min")
    args = ap.parse_args(argv)
    if args.smoke:
        args.replicas, args.routers, args.duration_s, args.quick = 20, 2, 300.0, False
    duration = 600.0 if args.quick else args.duration_s
    out_dir = bench_out(args.smoke)
    if out_dir is not None and (args.plot is not None or args.smoke):
        args.plot = out_dir / (args.plot.name if args.plot is not None else "whatif.png")
    apps = config(args.replicas)
    opts = whatif.WhatIfOptions(interval_s=args.interval_s)
    with tempfile.TemporaryDirectory(prefix="fp-whatif-") as tmp:
        t = time.perf_counter()
        messages, size = generate(Path(tmp), args.replicas, args.routers, duration)
        gen_s = time.perf_counter() - t

        t = time.perf_counter()
        rows = load_report_rows(tmp)
        load_s = time.perf_counter() - t
        t = time.perf_counter()
        result = whatif.simulate(rows, apps, opts)
        sim_s = time.perf_counter() - t
        first = whatif.timeline_json(result)
        again = whatif.timeline_json(whatif.simulate(load_report_rows(tmp), apps, opts))
    total_s = load_s + sim_s
    speedup = duration / total_s
    run = result.deployments[f"{APP}.{DEPLOYMENT}"]
    ticks = int(run.target.size)
    rows_out = [
        ["generate + write (not timed)", gen_s, messages, messages / gen_s, "-"],
        ["load rows", load_s, messages, messages / load_s, f"{duration / load_s:,.0f}x"],
        ["simulate", sim_s, messages, messages / sim_s, f"{duration / sim_s:,.0f}x"],
        ["load + simulate", total_s, messages, messages / total_s, f"{speedup:,.0f}x"],
    ]
    print_table(
        f"what-if replay: {args.replicas} replicas, {args.routers} routers, {duration:.0f} s "
        f"recording ({size / 1e6:.1f} MB), {ticks} ticks of {args.interval_s:g} s",
        ["phase", "seconds", "messages", "msg/s", "vs real time"],
        rows_out,
    )
    deterministic = first == again
    print(f"\ntarget range {int(run.target.min())}..{int(run.target.max())}, "
          f"{len(result.timeline)} timeline entries, byte-identical rerun: {deterministic}")  # fmt: skip
    ok = speedup >= TARGET_SPEEDUP
    print(f"target: >= {TARGET_SPEEDUP:.0f}x real time: {'met' if ok else 'NOT met'}")
    if args.plot is not None:
        whatif.plot([("bench", result)], args.plot, title="what-if bench")
        print(f"plot: {args.plot}")
    path = write_json(
        "whatif",
        {
            "smoke": args.smoke,
            "params": {
                "replicas": args.replicas,
                "routers": args.routers,
                "duration_s": duration,
                "report_interval_s": REPORT_INTERVAL_S,
                "interval_s": args.interval_s,
            },
            "messages": messages,
            "recording_bytes": size,
            "ticks": ticks,
            "load_s": load_s,
            "simulate_s": sim_s,
            "total_s": total_s,
            "speedup_vs_realtime": speedup,
            "target_speedup": TARGET_SPEEDUP,
            "target_met": ok,
            "deterministic": deterministic,
            "target_range": [int(run.target.min()), int(run.target.max())],
        },
        out_dir,
    )
    print(f"wrote {path}")
    result_line("whatif", speedup_vs_realtime=float(speedup))
    return 0 if deterministic else 1


if __name__ == "__main__":
    sys.exit(main())

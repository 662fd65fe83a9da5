"""The closed-loop what-if against live runs with real replica processes.

    .venv/bin/python -m scripts.bench.whatif_validate [--load-s 150] [--configs A,B1,B2,B3]
        [--tune p99=1.0] [--repeat 3] [--record-all] [--keep DIR]
    .venv/bin/python -m scripts.bench.whatif_validate --predict-only DIR [--seed 11]

One embedded nats-server, `fleetpulse controller`, `fleetpulse agent` and `fleetpulse record`
as processes (step_response.py's stack); the load comes from this process through a
DeploymentHandle as open-loop Poisson arrivals (seeded, the same script for every run): idle, a
ramp, a burst, a plateau, idle, a second step. The replicas run services.examples.model:Model
(a sleep that grows with the requests the replica serves at once, base 0.2 s, contention 0.5).

1. Config A runs live while the recorder records every report (handle reports carry the
   routers' request stats; lifecycle events the start times).
2. From A's recording the closed-loop model predicts A itself and each config B.
3. Each B runs live under the same load script.
4. Predicted vs measured: replica-seconds (running replicas, from fp_status polled every 50 ms),
   p50/p99 latency (client side, end to end) and scale events (target changes), and whether
   each pair (A, B) is ranked the same way by the model and by the live runs. The predicted p99
   is the median over the model's replications of each one's p99 (a live run is one draw),
   with their range; replica-seconds and scale events are the replications' means. With
   `--repeat N` every config runs live N times (in rounds): its live p99 is the median of the
   runs' p99s, its cost their mean, and each run's p99 is shown against the model's range.

Output: a table, bench-results/whatif_validate.json and RESULT lines. Each run takes about
`--load-s` plus the time to come back to one replica.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from scripts.bench.common import ROOT, cli_delete, cli_deploy, print_table, result_line, write_json
from scripts.bench.step_response import POLL_S, Stack, until
from services.recorder import closedloop
from services.recorder.replay import load_app_configs, load_report_rows
from services.recorder.simulate import ModelOptions
from services.router.config import RouterConfig
from services.router.handle import connect_handle

REPLICATIONS = 32
"""Model runs per prediction (seeds). A live run is one draw: its p99 is compared with the
median of the runs' own p99s, and the runs' range is reported with it."""
LATENCY_S = 0.2
CONTENTION = 0.5

BASE: dict[str, Any] = {
    "min_replicas": 1,
    "max_replicas": 8,
    "target_ongoing_requests": 2,
    "upscale_delay_s": 2,
    "downscale_delay_s": 5,
    "look_back_period_s": 5,
    "metrics_interval_s": 1,
}
CONFIGS: dict[str, dict[str, Any]] = {
    "A": BASE,
    "B1": {**BASE, "target_ongoing_requests": 3},
    "B2": {**BASE, "upscale_delay_s": 8, "downscale_delay_s": 15},
    "B3": {**BASE, "min_replicas": 2, "target_ongoing_requests": 1.5},
}

APP_YAML = """\
applications:
  - name: {app}
    route_prefix: /{app}
    deployments:
      - name: Model
        import_path: services.examples.model:Model
        init_kwargs: {{base_latency_s: {latency}, contention: {contention}}}
        max_ongoing_requests: 4
        health_check_period_s: 1
        graceful_shutdown_timeout_s: 2
        autoscaling_config:
{autoscaling}
"""


def app_yaml(app: str, autoscaling: dict[str, Any]) -> str:
    body = "\n".join(f"          {k}: {v}" for k, v in autoscaling.items())
    return APP_YAML.format(app=app, latency=LATENCY_S, contention=CONTENTION, autoscaling=body)


def load_rate(t: float, scale: float) -> float:
    """Arrivals per second at t of a run scaled to `scale` seconds (shape over 150 s)."""
    x = t * 150.0 / scale
    if x < 10:
        return 0.0
    if x < 50:
        return 18.0 * (x - 10) / 40
    if x < 62:
        return 30.0
    if x < 90:
        return 8.0
    if x < 115:
        return 0.0
    if x < 140:
        return 12.0
    return 0.0


def arrival_times(load_s: float, seed: int) -> list[float]:
    """A seeded Poisson process of rate load_rate (thinning)."""
    rng = random.Random(seed)
    peak = 30.0
    out: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= load_s:
            return out
        if rng.random() < load_rate(t, load_s) / peak:
            out.append(t)


@dataclass
class Live:
    points: list[tuple[float, int, int]] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    finished_at: list[float] = field(default_factory=list)
    failed: int = 0
    t0_wall: float = 0.0

    def summary(self, end_s: float) -> dict[str, Any]:
        pts = [p for p in self.points if 0 <= p[0] <= end_s]
        rs = sum((b[0] - a[0]) * a[2] for a, b in itertools.pairwise(pts))
        targets = [tg for _, tg, _ in pts if tg >= 0]
        events = sum(1 for a, b in itertools.pairwise(targets) if a != b)
        lat = np.asarray(self.latencies)
        return {
            "replica_seconds": rs,
            "p50_s": float(np.percentile(lat, 50)) if lat.size else None,
            "p99_s": float(np.percentile(lat, 99)) if lat.size else None,
            "scale_events": events,
            "completed": int(lat.size),
            "failed": self.failed,
        }


async def live_run(
    stack: Stack, app: str, config: str, arrivals: list[float], settle_s: float
) -> Live:
    assert stack.bus is not None
    path = stack.log_dir / f"{app}.yaml"
    path.write_text(app_yaml(app, CONFIGS[config]))
    await asyncio.to_thread(cli_deploy, path, stack.server.url)

    async def at_min() -> bool:
        target, running = await stack.model(app)
        return running >= 1 and running == target

    await until(at_min, 120, f"{app} running")
    handle = await connect_handle(
        app, "Model", bus=stack.bus, config=RouterConfig(metrics_interval_s=1.0)
    )
    predict = handle.options(method="predict", deadline_s=60)
    live = Live()
    t0 = time.monotonic()
    live.t0_wall = time.time()
    stop = asyncio.Event()

    async def poll() -> None:
        while not stop.is_set():
            target, running = await stack.model(app)
            live.points.append((time.monotonic() - t0, target, running))
            await asyncio.sleep(POLL_S)

    async def one() -> None:
        start = time.monotonic()
        try:
            await predict.remote(1.0)
            end = time.monotonic()
            live.latencies.append(end - start)
            live.finished_at.append(end - t0)
        except Exception:
            live.failed += 1

    poller = asyncio.create_task(poll())
    tasks = []
    for at in arrivals:
        delay = t0 + at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one()))
    await asyncio.gather(*tasks)
    await asyncio.sleep(max(0.0, t0 + settle_s - time.monotonic()))
    stop.set()
    await poller
    await handle.close()
    # the next run has the agent to itself: an app left at its minimum would hold slots the
    # next config may need (with the agent's 12, four idle apps capped later runs at 6 or 7)
    await asyncio.to_thread(cli_delete, app, stack.server.url)

    async def stopped() -> bool:
        return (await stack.model(app))[1] <= 0

    await until(stopped, 120, f"{app} stopped")
    return live


def predict(
    recording: Path, config: str, app: str, log_dir: Path, seed: int, window: tuple[float, float]
) -> dict[str, Any]:
    """The model's numbers for `config`, over the live window (`window` = the load's start in
    wall-clock seconds and its length: the recording also holds the deploy before it)."""
    path = log_dir / f"predict-{config}.yaml"
    path.write_text(app_yaml(app, CONFIGS[config]))
    rows = load_report_rows(recording)
    opts = ModelOptions(seed=seed, replications=REPLICATIONS)
    runs = closedloop.run_closed(rows, [(config, load_app_configs(path))], opts)
    result = runs[0][1]
    run = result.deployments[f"{app}.Model"]
    s = closedloop.summary(run, opts.interval_s)
    start = window[0] - result.start_us / 1e6
    sel = (run.times >= start) & (run.times <= start + window[1])
    reps = run.replications or (run,)
    targets = run.target[sel]
    return {
        "replica_seconds": float(np.mean([r.running[sel].sum() for r in reps])) * opts.interval_s,
        "p50_s": s["p50_s"],
        # a live run is one draw: compare it with the median run, give the runs' range
        "p99_s": s["p99_runs_s"][1],
        "p99_pooled_s": s["p99_s"],
        "p99_range_s": [s["p99_runs_s"][0], s["p99_runs_s"][2]],
        "scale_events": float(np.mean([np.count_nonzero(np.diff(r.target[sel])) for r in reps])),
        "calibration": run.calibration.doc(),
        "series": {
            "t": (run.times[sel] - start).tolist()[::5],
            "target": targets.tolist()[::5],
            "running": run.running[sel].tolist()[::5],
            "queued": run.queued[sel].tolist()[::5],
        },
    }


async def tune_on(
    recording: Path, log_dir: Path, app: str, args: argparse.Namespace
) -> dict[str, Any] | None:
    """`fleetpulse tune` on the recording (the real command); the best config's keys."""
    out = log_dir / "tuned.yaml"
    res = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "services.cli", "tune", str(recording), "--app",
         str(log_dir / f"{app}.yaml"), "--slo", args.tune, "--max-configs", str(args.tune_configs),
         "--out-yaml", str(out), "--no-progress"],
        cwd=ROOT, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    print(res.stdout, res.stderr, flush=True)
    if res.returncode != 0:
        return None  # no candidate meets the objective (or tune failed): nothing to run
    doc = yaml.safe_load(out.read_text())
    scaling: dict[str, Any] = doc["applications"][0]["deployments"][0]["autoscaling_config"]
    return scaling


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One config's live runs as one: mean cost and scale events, median p50/p99 (a p99 over
    150 s is a noisy draw: config A's ranged 2.5-4.6 s in three runs), and every run's."""
    out: dict[str, Any] = {
        "replica_seconds": float(np.mean([r["replica_seconds"] for r in runs])),
        "scale_events": float(np.mean([r["scale_events"] for r in runs])),
        "runs": len(runs),
        "completed": sum(r["completed"] for r in runs),
        "failed": sum(r["failed"] for r in runs),
    }
    for q in ("p50_s", "p99_s"):
        values = [r[q] for r in runs if r[q] is not None]
        out[q] = float(np.median(values)) if values else None
        out[q.replace("_s", "_runs_s")] = values
    out["replica_seconds_runs"] = [r["replica_seconds"] for r in runs]
    return out


def rel(pred: float | None, meas: float | None) -> float | None:
    if pred is None or meas is None or meas == 0:
        return None
    return (pred - meas) / meas


async def live_phase(args: argparse.Namespace, log_dir: Path) -> None:
    """Run every config live (the first recorded, then tuned on if asked); writes live.json."""
    names = args.configs.split(",")
    arrivals = arrival_times(args.load_s, args.seed)
    settle = args.load_s + 10.0
    rec_dir = log_dir / "rec"
    stack = Stack(log_dir)
    await stack.start()
    series: dict[str, list[dict[str, Any]]] = {}
    window = (0.0, settle)
    try:
        # rounds of every config in turn, so that the machine's drift touches them alike
        for rnd, name in ((r, n) for r in range(args.repeat) for n in names):
            app = f"run{name.lower()}"
            first = rnd == 0 and name == names[0]
            rec = None
            if first or args.record_all:
                # the first run is the one predicted from; the others only to compare with
                tag = name if rnd == 0 else f"{name}-{rnd + 1}"
                out = rec_dir if first else log_dir / f"rec-{tag}"
                stack._start(
                    ["record", "--nats", stack.server.url, "--out", str(out),
                     "--subject", "fp.v1.report.>", "--progress-interval-s", "0"],
                    f"record-{name}.log",
                )  # fmt: skip
                rec = stack.procs[-1]
                await asyncio.sleep(2.0)
            print(f"live run {name} ({rnd + 1} of {args.repeat}): {len(arrivals)} requests"
                  f" over {args.load_s:g} s", flush=True)  # fmt: skip
            res = await live_run(stack, app, name, arrivals, settle)
            if first:
                window = (res.t0_wall, settle)
            series.setdefault(name, []).append(
                {"points": res.points, "latency": res.latencies, "finished_at": res.finished_at,
                 "failed": res.failed, "t0_wall": res.t0_wall}
            )  # fmt: skip
            if rec is not None:
                rec.terminate()
                await asyncio.to_thread(rec.wait, 30)
            if first and args.tune is not None:
                tuned = await tune_on(rec_dir, log_dir, app, args)
                if tuned is None:
                    print("tune found no config meeting the objective: no run T", flush=True)
                else:
                    CONFIGS["T"] = tuned
                    names.append("T")
    finally:
        await stack.stop()
    doc = {"names": names, "window": window, "settle_s": settle, "series": series,
           "configs": {n: CONFIGS[n] for n in names}, "tune": args.tune,
           "load_seed": args.seed}  # fmt: skip
    (log_dir / "live.json").write_text(json.dumps(doc))


def evaluate(log_dir: Path, seed: int) -> dict[str, Any]:
    """Predict every config from the first one's recording and compare with the live runs."""
    doc = json.loads((log_dir / "live.json").read_text())
    # a --keep directory from before --repeat holds one run per config, not a list
    doc["series"] = {n: r if isinstance(r, list) else [r] for n, r in doc["series"].items()}
    names: list[str] = doc["names"]
    CONFIGS.update(doc["configs"])
    settle = float(doc["settle_s"])
    live = {}
    for name in names:
        live[name] = combine([
            Live([tuple(p) for p in sr["points"]], sr["latency"], sr["finished_at"],
                 sr["failed"]).summary(settle)
            for sr in doc["series"][name]
        ])  # fmt: skip
    window = (float(doc["window"][0]), settle)
    app = f"run{names[0].lower()}"
    preds = {name: predict(log_dir / "rec", name, app, log_dir, seed, window) for name in names}
    (log_dir / "predicted.json").write_text(json.dumps(preds))
    rows = []
    for name in names:
        p, m = preds[name], live[name]
        lo, hi = p["p99_range_s"]
        inside = sum(lo <= x <= hi for x in m["p99_runs_s"])
        rows.append([name, p["replica_seconds"], m["replica_seconds"], p["p50_s"], m["p50_s"],
                     p["p99_s"], f"{lo:.2f}-{hi:.2f}", m["p99_s"],
                     " ".join(f"{x:.2f}" for x in m["p99_runs_s"]),
                     f"{inside}/{len(m['p99_runs_s'])}", p["scale_events"],
                     m["scale_events"]])  # fmt: skip
    print_table(
        f"predicted (from {names[0]}'s recording) vs measured (live: mean cost, median p99"
        " of the live runs)",
        ["config", "pred rs", "live rs", "pred p50", "live p50", "pred p99", "model runs p99",
         "live p99", "live runs p99", "in range", "pred ev", "live ev"],
        rows,
    )  # fmt: skip
    pairs = []
    for name in names[1:]:
        a, b = names[0], name
        pair: dict[str, Any] = {"pair": f"{a}/{b}"}
        for metric in ("replica_seconds", "p99_s"):
            pd = preds[b][metric] - preds[a][metric]
            md = live[b][metric] - live[a][metric]
            pair[f"{metric}_ranked_right"] = math.copysign(1, pd) == math.copysign(1, md)
        pair["rs_err"] = rel(preds[b]["replica_seconds"], live[b]["replica_seconds"])
        pair["p99_err"] = rel(preds[b]["p99_s"], live[b]["p99_s"])
        pair["p99_err_runs"] = [rel(preds[b]["p99_s"], x) for x in live[b]["p99_runs_s"]]
        pair["recorded_p99_err"] = rel(preds[a]["p99_s"], live[a]["p99_s"])
        pairs.append(pair)
        result_line(
            "whatif_validate", pair=f"{a}/{b}", rs_err=pair["rs_err"] or 0.0,
            p99_err=pair["p99_err"] or 0.0, rs_rank=int(pair["replica_seconds_ranked_right"]),
            p99_rank=int(pair["p99_s_ranked_right"]),
        )  # fmt: skip
    for p in preds.values():
        p.pop("series")
    others = from_other_recordings(log_dir, doc, live, seed)
    from scripts.bench.whatif_given import given_live  # it reads this module's load script

    given = given_live(log_dir, doc)
    tuned = None
    if "T" in live and doc["tune"] is not None:
        q, bound = doc["tune"].split("=")
        # every live run of T must meet it
        measured = max(
            float(np.percentile(sr["latency"], float(q[1:]))) for sr in doc["series"]["T"]
        )
        tuned = {"config": CONFIGS["T"], "slo": doc["tune"], "measured": measured,
                 "met": measured <= float(bound)}  # fmt: skip
        print(f"tuned config live: {q} {measured:.3f} s (objective {bound} s): "
              f"{'met' if tuned['met'] else 'NOT met'}")  # fmt: skip
        result_line("whatif_tune_live", measured_s=measured, met=int(tuned["met"]))
    return {"load_s": settle - 10.0, "live": live, "predicted": preds, "pairs": pairs,
            "other_recordings": others, "given_live": given, "tuned": tuned}  # fmt: skip


def from_other_recordings(
    log_dir: Path, doc: dict[str, Any], live: dict[str, Any], seed: int
) -> dict[str, Any]:
    """The same predictions from the first config's other recorded runs (`--repeat` with
    `--record-all`): how much the answer depends on which day was recorded."""
    names: list[str] = doc["names"]
    first = doc["series"][names[0]]
    settle = float(doc["settle_s"])
    out: dict[str, Any] = {}
    rows = []
    for rnd in range(2, len(first) + 1):
        tag = f"{names[0]}-{rnd}"
        recording = log_dir / f"rec-{tag}"
        if not recording.exists():
            continue
        window = (float(first[rnd - 1]["t0_wall"]), settle)
        app = f"run{names[0].lower()}"
        preds = {n: predict(recording, n, app, log_dir, seed, window) for n in names}
        out[tag] = {}
        for n in names:
            p, m = preds[n], live[n]
            err = {"rs_err": rel(p["replica_seconds"], m["replica_seconds"]),
                   "p99_err": rel(p["p99_s"], m["p99_s"]), "p99_s": p["p99_s"],
                   "replica_seconds": p["replica_seconds"]}  # fmt: skip
            out[tag][n] = err
            rows.append([tag, n, p["replica_seconds"], err["rs_err"] or 0.0, p["p99_s"],
                         err["p99_err"] or 0.0])  # fmt: skip
            result_line("whatif_validate_recording", recording=tag, config=n,
                        rs_err=err["rs_err"] or 0.0, p99_err=err["p99_err"] or 0.0)  # fmt: skip
    if rows:
        print_table(
            "predicted from the other recordings of " + names[0] + " (errors against the live"
            " mean cost and median p99)",
            ["recording", "config", "pred rs", "rs err", "pred p99", "p99 err"],
            rows,
        )  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--load-s", type=float, default=150.0)
    ap.add_argument("--configs", default="A,B1,B2,B3", help="the first is recorded")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", type=Path, help="keep the recording, logs and live series here")
    ap.add_argument("--tune", metavar="pNN=S", help="also tune on the recording, run the best live")
    ap.add_argument("--tune-configs", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=1,
                    help="live runs of every config (rounds in turn); compared: their mean cost"
                    " and median p99")  # fmt: skip
    ap.add_argument("--record-all", action="store_true",
                    help="also record every other run (rec-NAME/ under --keep), to compare with")  # fmt: skip
    ap.add_argument("--predict-only", type=Path, metavar="DIR",
                    help="no live runs: predict again from a --keep directory")  # fmt: skip
    args = ap.parse_args(argv)
    if args.predict_only is not None:
        out = evaluate(args.predict_only, args.seed)
    else:
        with tempfile.TemporaryDirectory(prefix="fp-whatif-") as tmp:
            log_dir = Path(tmp) if args.keep is None else args.keep
            log_dir.mkdir(parents=True, exist_ok=True)
            asyncio.run(live_phase(args, log_dir))
            out = evaluate(log_dir, args.seed)
    print(f"wrote {write_json('whatif_validate', out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

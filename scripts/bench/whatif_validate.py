"""The closed-loop what-if against live runs with real replica processes.

    .venv/bin/python -m scripts.bench.whatif_validate [--load-s 150] [--configs A,B1,B2,B3]
        [--set both|in-sample|held-out] [--tune p99=1.0] [--repeat 3] [--record-all] [--keep DIR]
    .venv/bin/python -m scripts.bench.whatif_validate --predict-only DIR [--seed 11]
    .venv/bin/python -m scripts.bench.whatif_validate --smoke       # under a minute

One embedded nats-server, `fleetpulse controller`, `fleetpulse agent` and `fleetpulse record`
as processes (step_response.py's stack); the load comes from this process through a
DeploymentHandle as open-loop Poisson arrivals (seeded, the same script for every run of a set).
The replicas run services.examples.model:Model (a sleep that grows with the requests the replica
serves at once, base 0.2 s, contention 0.5).

Two load sets (`--set`, default both), each a complete validation of its own:

- **in-sample** (`load_rate`, seed `--seed`, default 1): idle, a ramp, a burst, a plateau, idle,
  a second step. Every model revision so far was checked, and tuned, against this one.
- **held-out** (`held_out_rate`, seed HELD_OUT_SEED, both fixed here): a sinusoid, a sawtooth,
  two short spikes above the in-sample peak, a low tail. It differs in kind, mean and peak from
  the in-sample script. MODEL WORK MUST NOT TUNE AGAINST IT: do not change services/whatif to
  move its numbers, and do not change it to suit the model; it is there to say how far the
  in-sample numbers carry to a load the model was not fitted on.

Per set:

1. Config A runs live while the recorder records every report (handle reports carry the
   routers' request stats; lifecycle events the start times).
2. From A's recording the closed-loop model predicts A itself and each config B.
3. Each B runs live under the same load script.
4. Predicted vs measured: replica-seconds (running replicas, from fp_status polled every 50 ms),
   p50/p99 latency (client side, end to end) and scale events (target changes), and whether
   each pair (A, B) is ranked the same way by the model and by the live runs. The predicted p99
   is the median over the model's replications of each one's p99 (a live run is one draw),
   with their range; replica-seconds and scale events are the replications' means. With
   `--repeat N` every config runs live N times (in rounds, the sets interleaved): its live p99
   is the median of the runs' p99s, its cost their mean, and each run's p99 is shown against
   the model's range. A prediction is within target when its replica-seconds are within 10% and
   its p99 within 25% of the live ones.

Output: a table per set, the two sets side by side, bench-results/whatif_validate.json and
RESULT lines (each with `set=`). Each live run takes about `--load-s` plus the time to come
back to one replica (about 3 min at the default 150 s): `--set both --repeat 3` with `--tune`
is 30 runs, about 90 min; `--keep DIR` keeps one subdirectory per set (DIR/in-sample,
DIR/held-out), each one a `--predict-only` and whatif_given directory of its own.
`--smoke`: both sets, configs A and B1, a 3 s load script, 4 replications, no tune; the JSON to
$FLEETPULSE_BENCH_OUT (else a temporary directory), never over bench-results' real run.
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from scripts.bench.common import ROOT, cli_delete, cli_deploy, print_table, result_line, write_json
from scripts.bench.step_response import POLL_S, Stack, until
from scripts.bench.whatif import bench_out
from services.router.config import RouterConfig
from services.router.handle import connect_handle
from services.whatif import closedloop
from services.whatif.run import load_app_configs, load_report_rows
from services.whatif.simulate import ModelOptions

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
    """IN-SAMPLE: arrivals per second at t of a run scaled to `scale` seconds (shape over 150 s):
    idle, a ramp to 18/s, 30/s, 8/s, idle, 12/s (mean 8.1/s, peak 30/s)."""
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


HELD_OUT_SEED = 3401
"""HELD-OUT: the seed of the held-out set's arrivals. Fixed, not a flag: see held_out_rate."""


def held_out_rate(t: float, scale: float) -> float:
    """HELD-OUT: arrivals per second at t of a run scaled to `scale` seconds (shape over 150 s).

    Model work must not tune against this shape or its seed (HELD_OUT_SEED): it exists to check
    that what the in-sample script shows carries to a load the model was not fitted on. Do not
    change services/whatif to move its numbers, and do not change it to suit the model (a new
    held-out shape would then be needed). Unlike the in-sample script (steps and one ramp, mean
    8.1/s, peak 30/s): 5 s idle, a sinusoid between 3 and 19/s (period 30 s, two cycles), a
    sawtooth of three 12 s teeth from 4 to 22/s that drop at once, two 3-4 s spikes at 40/s
    with 4/s between, a 6/s tail, 5 s idle (mean 10.8/s, peak 40/s; 1,570 requests at 150 s).
    """
    x = t * 150.0 / scale
    if x < 5:
        return 0.0
    if x < 65:
        return 11.0 - 8.0 * math.cos(2 * math.pi * (x - 5) / 30)
    if x < 101:
        return 4.0 + 18.0 * ((x - 65) % 12) / 12
    if x < 104:
        return 40.0
    if x < 120:
        return 4.0
    if x < 124:
        return 40.0
    if x < 145:
        return 6.0
    return 0.0


@dataclass(frozen=True)
class LoadSet:
    name: str
    rate: Callable[[float, float], float]
    peak: float
    seed: int | None
    """None: the run's --seed (the in-sample set); else fixed here (the held-out set)."""


LOAD_SETS: dict[str, LoadSet] = {
    "in-sample": LoadSet("in-sample", load_rate, 30.0, None),
    "held-out": LoadSet("held-out", held_out_rate, 40.0, HELD_OUT_SEED),
}
IN_SAMPLE, HELD_OUT = "in-sample", "held-out"
RS_TARGET, P99_TARGET = 0.10, 0.25
"""A prediction is within target when its replica-seconds are within 10% of the live ones and
its p99 within 25%."""


def arrival_times(load_s: float, seed: int, load: str = IN_SAMPLE) -> list[float]:
    """A seeded Poisson process of the set's rate (thinning)."""
    shape = LOAD_SETS[load]
    rng = random.Random(seed)
    out: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(shape.peak)
        if t >= load_s:
            return out
        if rng.random() < shape.rate(t, load_s) / shape.peak:
            out.append(t)


def load_seed(load: str, seed: int) -> int:
    """The seed of a set's arrivals: the held-out one's is fixed, the in-sample one's `seed`."""
    fixed = LOAD_SETS[load].seed
    return seed if fixed is None else fixed


def arrivals_of(doc: dict[str, Any]) -> list[float]:
    """The arrivals of the live runs of a live.json (older ones: in-sample, settle - 10 s)."""
    load_s = float(doc.get("load_s", float(doc["settle_s"]) - 10.0))
    return arrival_times(load_s, int(doc.get("load_seed", 1)), doc.get("set", IN_SAMPLE))


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
    stack: Stack,
    app: str,
    config: dict[str, Any],
    arrivals: list[float],
    settle_s: float,
    out_dir: Path,
) -> Live:
    assert stack.bus is not None
    path = out_dir / f"{app}.yaml"
    path.write_text(app_yaml(app, config))
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
    recording: Path,
    name: str,
    config: dict[str, Any],
    app: str,
    log_dir: Path,
    seed: int,
    window: tuple[float, float],
    replications: int = REPLICATIONS,
) -> dict[str, Any]:
    """The model's numbers for `config`, over the live window (`window` = the load's start in
    wall-clock seconds and its length: the recording also holds the deploy before it)."""
    path = log_dir / f"predict-{name}.yaml"
    path.write_text(app_yaml(app, config))
    rows = load_report_rows(recording)
    opts = ModelOptions(seed=seed, replications=replications)
    runs = closedloop.run_closed(rows, [(name, load_app_configs(path))], opts)
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


def within(rs_err: float | None, p99_err: float | None) -> bool:
    return (
        rs_err is not None
        and p99_err is not None
        and abs(rs_err) <= RS_TARGET
        and abs(p99_err) <= P99_TARGET
    )


async def wait_for_line(log: Path, text: str, within_s: float) -> None:
    """Until `text` shows in a service's log (the recorder logs once it has subscribed)."""

    def has() -> bool:
        return log.exists() and text in log.read_text(errors="replace")

    async def seen() -> bool:
        return await asyncio.to_thread(has)

    await until(seen, within_s, f"'{text}' in {log.name}")


async def live_phase(args: argparse.Namespace, log_dir: Path, sets: list[str]) -> None:
    """Run every config of every set live (the first recorded, then tuned on if asked), in
    rounds with the sets interleaved; writes one live.json per set, in log_dir/SET."""
    names = {s: args.configs.split(",") for s in sets}
    configs = {s: {n: CONFIGS[n] for n in names[s]} for s in sets}
    seeds = {s: load_seed(s, args.seed) for s in sets}
    arrivals = {s: arrival_times(args.load_s, seeds[s], s) for s in sets}
    settle = args.load_s + args.settle_s
    dirs = {s: log_dir / s for s in sets}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    stack = Stack(log_dir)
    await stack.start()
    series: dict[str, dict[str, list[dict[str, Any]]]] = {s: {} for s in sets}
    window = {s: (0.0, settle) for s in sets}
    try:
        # rounds of every config in turn, so that the machine's drift touches them alike
        for rnd in range(args.repeat):
            for s in sets:
                i = 0
                while i < len(names[s]):  # T joins the list once tuned
                    name = names[s][i]
                    i += 1
                    app = f"run{name.lower()}"
                    first = rnd == 0 and name == names[s][0]
                    rec = None
                    if first or args.record_all:
                        # the first run is the one predicted from; the others only to compare
                        tag = name if rnd == 0 else f"{name}-{rnd + 1}"
                        out = dirs[s] / ("rec" if first else f"rec-{tag}")
                        log = f"record-{s}-{tag}.log"
                        stack._start(
                            ["record", "--nats", stack.server.url, "--out", str(out),
                             "--subject", "fp.v1.report.>", "--progress-interval-s", "0"],
                            log,
                        )  # fmt: skip
                        rec = stack.procs[-1]
                        await wait_for_line(log_dir / log, "recording fp.v1.report", 60)
                    print(f"live run {s} {name} ({rnd + 1} of {args.repeat}): "
                          f"{len(arrivals[s])} requests over {args.load_s:g} s", flush=True)  # fmt: skip
                    res = await live_run(stack, app, configs[s][name], arrivals[s], settle, dirs[s])
                    if first:
                        window[s] = (res.t0_wall, settle)
                    series[s].setdefault(name, []).append(
                        {"points": res.points, "latency": res.latencies,
                         "finished_at": res.finished_at, "failed": res.failed,
                         "t0_wall": res.t0_wall}
                    )  # fmt: skip
                    if rec is not None:
                        rec.terminate()
                        await asyncio.to_thread(rec.wait, 30)
                    if first and args.tune is not None:
                        tuned = await tune_on(dirs[s] / "rec", dirs[s], app, args)
                        if tuned is None:
                            print(f"{s}: tune found no config meeting the objective: no run T",
                                  flush=True)  # fmt: skip
                        else:
                            configs[s]["T"] = tuned
                            names[s].append("T")
    finally:
        await stack.stop()
    for s in sets:
        doc = {"names": names[s], "window": window[s], "settle_s": settle, "load_s": args.load_s,
               "series": series[s], "configs": configs[s], "tune": args.tune, "set": s,
               "load_seed": seeds[s]}  # fmt: skip
        (dirs[s] / "live.json").write_text(json.dumps(doc))


def evaluate(log_dir: Path, seed: int, replications: int = REPLICATIONS) -> dict[str, Any]:
    """Predict every config from the first one's recording and compare with the live runs
    (one set: log_dir holds its live.json and recordings)."""
    doc = json.loads((log_dir / "live.json").read_text())
    # a --keep directory from before --repeat holds one run per config, not a list
    doc["series"] = {n: r if isinstance(r, list) else [r] for n, r in doc["series"].items()}
    names: list[str] = doc["names"]
    configs: dict[str, dict[str, Any]] = {**CONFIGS, **doc["configs"]}
    load = doc.get("set", IN_SAMPLE)
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
    preds = {
        name: predict(log_dir / "rec", name, configs[name], app, log_dir, seed, window,
                      replications)
        for name in names
    }  # fmt: skip
    (log_dir / "predicted.json").write_text(json.dumps(preds))
    rows = []
    errors: dict[str, dict[str, Any]] = {}
    for name in names:
        p, m = preds[name], live[name]
        lo, hi = p["p99_range_s"]
        inside = sum(lo <= x <= hi for x in m["p99_runs_s"])
        rs_err, p99_err = (
            rel(p["replica_seconds"], m["replica_seconds"]),
            rel(p["p99_s"], m["p99_s"]),
        )
        errors[name] = {"rs_err": rs_err, "p99_err": p99_err, "within": within(rs_err, p99_err),
                        "p99_in_model_range": inside, "live_runs": len(m["p99_runs_s"])}  # fmt: skip
        rows.append([name, p["replica_seconds"], m["replica_seconds"], p["p50_s"], m["p50_s"],
                     p["p99_s"], f"{lo:.2f}-{hi:.2f}", m["p99_s"],
                     " ".join(f"{x:.2f}" for x in m["p99_runs_s"]),
                     f"{inside}/{len(m['p99_runs_s'])}", p["scale_events"],
                     m["scale_events"]])  # fmt: skip
    print_table(
        f"[{load}] predicted (from {names[0]}'s recording) vs measured (live: mean cost, median"
        " p99 of the live runs)",
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
            "whatif_validate", set=load, pair=f"{a}/{b}", rs_err=pair["rs_err"] or 0.0,
            p99_err=pair["p99_err"] or 0.0, rs_rank=int(pair["replica_seconds_ranked_right"]),
            p99_rank=int(pair["p99_s_ranked_right"]),
        )  # fmt: skip
    for p in preds.values():
        p.pop("series")
    others = from_other_recordings(log_dir, doc, live, configs, seed, replications)
    from scripts.bench.whatif_given import given_live  # it reads this module's load scripts

    given = given_live(log_dir, doc)
    tuned = None
    if "T" in live and doc["tune"] is not None:
        q, bound = doc["tune"].split("=")
        # every live run of T must meet it
        measured = max(
            float(np.percentile(sr["latency"], float(q[1:]))) for sr in doc["series"]["T"]
        )
        tuned = {"config": configs["T"], "slo": doc["tune"], "measured": measured,
                 "met": measured <= float(bound)}  # fmt: skip
        print(f"[{load}] tuned config live: {q} {measured:.3f} s (objective {bound} s): "
              f"{'met' if tuned['met'] else 'NOT met'}")  # fmt: skip
        result_line("whatif_tune_live", set=load, measured_s=measured, met=int(tuned["met"]))
    return {"set": load, "load_seed": doc.get("load_seed", 1),
            "load_s": float(doc.get("load_s", settle - 10.0)),
            "requests": len(arrivals_of(doc)), "live": live, "predicted": preds,
            "errors": errors, "pairs": pairs, "other_recordings": others, "given_live": given,
            "tuned": tuned}  # fmt: skip


def from_other_recordings(
    log_dir: Path,
    doc: dict[str, Any],
    live: dict[str, Any],
    configs: dict[str, dict[str, Any]],
    seed: int,
    replications: int = REPLICATIONS,
) -> dict[str, Any]:
    """The same predictions from the first config's other recorded runs (`--repeat` with
    `--record-all`): how much the answer depends on which day was recorded."""
    names: list[str] = doc["names"]
    load = doc.get("set", IN_SAMPLE)
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
        preds = {
            n: predict(recording, n, configs[n], app, log_dir, seed, window, replications)
            for n in names
        }
        out[tag] = {}
        for n in names:
            p, m = preds[n], live[n]
            err = {"rs_err": rel(p["replica_seconds"], m["replica_seconds"]),
                   "p99_err": rel(p["p99_s"], m["p99_s"]), "p99_s": p["p99_s"],
                   "replica_seconds": p["replica_seconds"]}  # fmt: skip
            err["within"] = within(err["rs_err"], err["p99_err"])
            out[tag][n] = err
            rows.append([tag, n, p["replica_seconds"], err["rs_err"] or 0.0, p["p99_s"],
                         err["p99_err"] or 0.0])  # fmt: skip
            result_line("whatif_validate_recording", set=load, recording=tag, config=n,
                        rs_err=err["rs_err"] or 0.0, p99_err=err["p99_err"] or 0.0)  # fmt: skip
    if rows:
        print_table(
            f"[{load}] predicted from the other recordings of {names[0]} (errors against the"
            " live mean cost and median p99)",
            ["recording", "config", "pred rs", "rs err", "pred p99", "p99 err"],
            rows,
        )  # fmt: skip
    return out


def summarize(ev: dict[str, Any]) -> dict[str, Any]:
    """One set's headline: predictions within target (from the recorded run, and from every
    recording), the error ranges, the pairs ranked right."""
    named = list(ev["errors"].values())
    every = named + [e for tag in ev["other_recordings"].values() for e in tag.values()]

    def span(errs: list[dict[str, Any]], key: str) -> list[float] | None:
        xs = [e[key] for e in errs if e[key] is not None]
        return [min(xs), max(xs)] if xs else None

    ranked = [p[f"{m}_ranked_right"] for p in ev["pairs"] for m in ("replica_seconds", "p99_s")]
    return {
        "within": sum(e["within"] for e in named),
        "predictions": len(named),
        "within_all_recordings": sum(e["within"] for e in every),
        "predictions_all_recordings": len(every),
        "rs_err_range": span(every, "rs_err"),
        "p99_err_range": span(every, "p99_err"),
        "ranked_right": sum(ranked),
        "rankings": len(ranked),
        "tuned_met": None if ev["tuned"] is None else ev["tuned"]["met"],
    }


def side_by_side(evals: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The sets' errors per config in one table, a summary per set; RESULT lines."""
    sets = list(evals)
    names = list(dict.fromkeys(n for ev in evals.values() for n in ev["errors"]))

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x * 100:+.1f}%"

    rows = []
    for n in names:
        row: list[Any] = [n]
        for s in sets:
            e = evals[s]["errors"].get(n)
            row += ["-", "-", "-"] if e is None else [
                pct(e["rs_err"]), pct(e["p99_err"]), "yes" if e["within"] else "NO"]  # fmt: skip
        rows.append(row)
    summary = {s: summarize(evals[s]) for s in sets}
    total: list[Any] = ["within target"]
    for s in sets:
        sm = summary[s]
        total += [f"{sm['within']} of {sm['predictions']}", "", ""]
    rows.append(total)
    cols = ["config"]
    for s in sets:
        cols += [f"{s} rs err", f"{s} p99 err", f"{s} ok"]
    print_table(
        f"in-sample vs held-out: errors of the predictions from each set's recorded run (target:"
        f" replica-seconds within {RS_TARGET:.0%}, p99 within {P99_TARGET:.0%})",
        cols,
        rows,
    )
    for s in sets:
        sm = summary[s]
        rs, p99 = sm["rs_err_range"] or [0.0, 0.0], sm["p99_err_range"] or [0.0, 0.0]
        print(f"{s}: {evals[s]['requests']} requests, load seed {evals[s]['load_seed']}: "
              f"{sm['within']} of {sm['predictions']} within target from the recorded run, "
              f"{sm['within_all_recordings']} of {sm['predictions_all_recordings']} from every "
              f"recording; rs {pct(rs[0])} to {pct(rs[1])}, p99 {pct(p99[0])} to {pct(p99[1])}; "
              f"ranked right {sm['ranked_right']} of {sm['rankings']}")  # fmt: skip
        result_line(
            "whatif_validate_set", set=s, within=sm["within"], predictions=sm["predictions"],
            within_all=sm["within_all_recordings"], predictions_all=sm["predictions_all_recordings"],
            rs_err_min=rs[0], rs_err_max=rs[1], p99_err_min=p99[0], p99_err_max=p99[1],
            ranked_right=sm["ranked_right"], rankings=sm["rankings"],
        )  # fmt: skip
    return summary


def set_dirs(root: Path) -> dict[str, Path]:
    """A --keep directory's sets: DIR/in-sample and DIR/held-out, or DIR itself (one set, from
    before the held-out set: in-sample)."""
    if (root / "live.json").exists():
        return {IN_SAMPLE: root}
    found = {s: root / s for s in LOAD_SETS if (root / s / "live.json").exists()}
    if not found:
        raise SystemExit(f"{root}: no live.json (nor {', '.join(LOAD_SETS)}/live.json)")
    return found


def check_smoke(evals: dict[str, dict[str, Any]]) -> list[str]:
    """What a smoke run must show: requests served, predictions made, for every set."""
    bad = []
    for s, ev in evals.items():
        for n, m in ev["live"].items():
            if m["completed"] == 0 or m["failed"]:
                bad.append(f"{s} {n}: {m['completed']} completed, {m['failed']} failed live")
        for n, p in ev["predicted"].items():
            if not all(isinstance(p[k], float) and math.isfinite(p[k])
                       for k in ("replica_seconds", "p99_s")):  # fmt: skip
                bad.append(f"{s} {n}: no prediction ({p['replica_seconds']}, {p['p99_s']})")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--load-s", type=float, default=150.0)
    ap.add_argument("--settle-s", type=float, default=10.0,
                    help="after the load, before the run ends (time to come back)")  # fmt: skip
    ap.add_argument("--configs", default="A,B1,B2,B3", help="the first is recorded")
    ap.add_argument("--set", choices=["both", IN_SAMPLE, HELD_OUT], default="both",
                    help="the load sets to run: in-sample (tuned on), held-out (never tuned on)")  # fmt: skip
    ap.add_argument("--seed", type=int, default=1,
                    help="the model's seed, and the in-sample load's (the held-out one is fixed)")  # fmt: skip
    ap.add_argument("--replications", type=int, default=REPLICATIONS)
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
    ap.add_argument("--smoke", action="store_true",
                    help="under a minute: both sets, A and B1, a 3 s load, 4 replications")  # fmt: skip
    args = ap.parse_args(argv)
    if args.smoke:
        args.load_s, args.settle_s, args.configs, args.replications = 3.0, 2.0, "A,B1", 4
        args.repeat, args.tune, args.record_all = 1, None, False
    sets = [IN_SAMPLE, HELD_OUT] if args.set == "both" else [args.set]
    if args.predict_only is not None:
        dirs = set_dirs(args.predict_only)
        evals = {s: evaluate(d, args.seed, args.replications) for s, d in dirs.items()}
    else:
        with tempfile.TemporaryDirectory(prefix="fp-whatif-") as tmp:
            log_dir = Path(tmp) if args.keep is None else args.keep
            log_dir.mkdir(parents=True, exist_ok=True)
            asyncio.run(live_phase(args, log_dir, sets))
            evals = {s: evaluate(log_dir / s, args.seed, args.replications) for s in sets}
    summary = side_by_side(evals)
    out = {"sets": evals, "summary": summary, "smoke": args.smoke,
           "targets": {"rs_err": RS_TARGET, "p99_err": P99_TARGET},
           "held_out": {"seed": HELD_OUT_SEED, "shape": held_out_rate.__doc__}}  # fmt: skip
    print(f"wrote {write_json('whatif_validate', out, bench_out(args.smoke))}")
    if args.smoke:
        bad = check_smoke(evals)
        for b in bad:
            print(f"smoke: {b}", file=sys.stderr)
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

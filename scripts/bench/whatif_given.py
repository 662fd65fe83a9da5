"""The queueing model alone, given each live run's replicas and arrivals.

    .venv/bin/python -m scripts.bench.whatif_given DIR     (a `whatif_validate --keep` directory)
    .venv/bin/python -m scripts.bench.whatif_given --smoke (a 5 s live run of config A first)

whatif_validate compares the closed loop with live runs: the error there is the queueing
model's and the feedback's together (a replica started a report earlier or later moves a
burst onto more or fewer replicas). This takes the feedback out: for each live run, the queue
model (`simulate.queue_given`, calibrated from the recording predicted from) is driven by the
run's own running replicas (fp_status, polled every 50 ms) and its exact arrivals (the load
script's, binned per model step), and its p50/p99 are compared with the run's client-side ones.
whatif_validate prints this table after its own, per load set (in-sample, held-out). DIR is
a set's directory or a `--keep` directory holding both. `--smoke` makes its own directory: one
live run of config A under each set's load script (5 s, real nats-server and processes, as
whatif_validate --smoke), then this table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from scripts.bench import whatif_validate as wv
from scripts.bench.common import print_table, result_line
from services.whatif.closedloop import calibrate_for
from services.whatif.fluid import weighted_percentile
from services.whatif.run import load_app_configs, load_report_rows
from services.whatif.simulate import ModelOptions, queue_given
from shared.subjects import DEFAULT_NAMESPACE


def given_live(log_dir: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """Per config, per live run: the live and the model's p50/p99 (seconds) and the p99 error."""
    names: list[str] = doc["names"]
    settle = float(doc["settle_s"])
    opts = ModelOptions()
    dt = opts.interval_s
    n = math.ceil(settle / dt)
    # the live runs' arrivals: the set's seeded script (older directories: in-sample, seed 1)
    times = np.asarray(wv.arrivals_of(doc))
    load = doc.get("set", wv.IN_SAMPLE)
    arrivals = np.bincount(np.floor(times / dt).astype(np.int64), minlength=n)[:n].astype(float)
    steps = dt * (np.arange(n) + 0.5)
    rows_in = load_report_rows(log_dir / "rec")
    app = f"run{names[0].lower()}"
    out: dict[str, Any] = {}
    table = []
    for name in names:
        path = log_dir / f"given-{name}.yaml"
        path.write_text(wv.app_yaml(app, doc["configs"][name]))
        apps = load_app_configs(path)
        cal = calibrate_for(rows_in, [apps], DEFAULT_NAMESPACE)[f"{app}.Model"]
        limit = apps[0].deployments[0].max_ongoing_requests
        out[name] = []
        for i, sr in enumerate(doc["series"][name], start=1):
            pts = np.asarray(sr["points"], dtype=np.float64)
            at = np.clip(np.searchsorted(pts[:, 0], steps, side="right") - 1, 0, None)
            running = pts[at, 2].astype(np.int64)
            lat, wts = queue_given(cal, limit, arrivals, running, opts)
            live = np.asarray(sr["latency"])
            row = {
                "run": i,
                "live_p50_s": float(np.percentile(live, 50)),
                "live_p99_s": float(np.percentile(live, 99)),
                "model_p50_s": weighted_percentile(lat, wts, 50.0),
                "model_p99_s": weighted_percentile(lat, wts, 99.0),
            }
            row["p99_err"] = wv.rel(row["model_p99_s"], row["live_p99_s"])
            out[name].append(row)
            table.append([name, i, row["live_p50_s"], row["model_p50_s"] or 0.0,
                          row["live_p99_s"], row["model_p99_s"] or 0.0, row["p99_err"] or 0.0])  # fmt: skip
            result_line(
                "whatif_given_live", set=load, config=name, run=i, p99_err=row["p99_err"] or 0.0
            )
    print_table(
        f"[{load}] the queue model given each live run's replicas and arrivals (no policy"
        " feedback)",
        ["config", "run", "live p50", "model p50", "live p99", "model p99", "p99 err"],
        table,
    )
    return out


def smoke(log_dir: Path) -> None:
    """One 5 s live run of config A per load set (whatif_validate's stack and scripts)."""
    args = argparse.Namespace(
        configs="A", seed=1, load_s=5.0, settle_s=3.0, repeat=1, record_all=False, tune=None,
        tune_configs=0,
    )  # fmt: skip
    asyncio.run(wv.live_phase(args, log_dir, [wv.IN_SAMPLE, wv.HELD_OUT]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("dir", type=Path, nargs="?", help="a whatif_validate --keep directory")
    ap.add_argument("--smoke", action="store_true", help="a short live run of A first, then this")
    args = ap.parse_args(argv)
    if (args.dir is None) == (not args.smoke):
        ap.error("give a directory or --smoke")
    with tempfile.TemporaryDirectory(prefix="fp-given-") as tmp:
        root: Path = args.dir
        if args.smoke:
            root = Path(tmp)
            smoke(root)
        out: dict[str, Any] = {}
        for load, d in wv.set_dirs(root).items():
            doc = json.loads((d / "live.json").read_text())
            doc["series"] = {k: v if isinstance(v, list) else [v] for k, v in doc["series"].items()}
            out[load] = given_live(d, doc)
    bad = [
        f"{load} {name} run {row['run']}: model p99 {row['model_p99_s']}"
        for load, per in out.items()
        for name, rows in per.items()
        for row in rows
        if row["model_p99_s"] is None or not math.isfinite(row["model_p99_s"])
    ]
    for b in bad:
        print(f"whatif_given: {b}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

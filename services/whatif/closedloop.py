"""The closed-loop what-if's outputs: summaries, deterministic JSON, a text table and a plot.

How it works: `run_closed` calibrates once from the recording rows (calibrate.py) and simulates
each config (simulate.py) on the same draws; `summary` turns one deployment's run into the
numbers an operator acts on (latency percentiles, rejected and timed-out requests,
replica-seconds, scale events, time under-provisioned). The JSON follows the open-loop
what-if's rules (whatif.dumps: sorted keys, floats rounded to 6 places), so the same recording,
configs and seed give byte-identical output. Only `plot` does I/O (the PNG it is asked for).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from shared.appconfig import AppConfig
from shared.errors import UsageError
from shared.subjects import deployment_key

from .calibrate import Calibration, calibrate
from .model import ReportRow, _iso, _r, dumps
from .simulate import (
    P99_EVERY_S,
    PERCENTILES,
    ClosedResult,
    ClosedRun,
    ModelOptions,
    simulate_closed,
    under_provisioned_s,
)

SAMPLE_EVERY_S = 10.0


def recording_span(rows: Sequence[ReportRow]) -> tuple[int, float]:
    if not rows:
        return 0, 0.0
    return rows[0][0], (rows[-1][0] - rows[0][0]) / 1e6


def calibrate_for(
    rows: Sequence[ReportRow], configs: Sequence[Sequence[AppConfig]], namespace: str
) -> dict[str, Calibration]:
    keys = {deployment_key(a.name, d.name) for apps in configs for a in apps for d in a.deployments}
    cals, _ = calibrate(rows, keys, namespace)
    return cals


def run_closed(
    rows: Sequence[ReportRow],
    configs: Sequence[tuple[str, Sequence[AppConfig]]],
    opts: ModelOptions,
) -> list[tuple[str, ClosedResult]]:
    cals = calibrate_for(rows, [apps for _, apps in configs], opts.namespace)
    if not any(c.arrivals is not None for c in cals.values()):
        raise UsageError(
            "the recording has no request stats (HandleReport.stats) for these deployments:"
            " the closed-loop model cannot run; use --model open"
        )
    start_us, duration = recording_span(rows)
    return [
        (label, simulate_closed(cals, apps, duration, start_us, opts)) for label, apps in configs
    ]


def _opt(x: float | None) -> float | None:
    return None if x is None else _r(x)


_COUNTS = frozenset({"scale_ups", "scale_downs", "scale_events", "max_target"})


def _series_summary(run: ClosedRun, interval_s: float) -> dict[str, float]:
    changes = np.diff(run.target)
    return {
        "replica_seconds": run.replica_seconds(interval_s),
        "scale_ups": float(np.count_nonzero(changes > 0)),
        "scale_downs": float(np.count_nonzero(changes < 0)),
        "scale_events": float(np.count_nonzero(changes)),
        "max_target": float(run.target.max()),
        "mean_target": float(run.target.mean()),
        "queued_s": float(np.count_nonzero(run.queued > 1e-9)) * interval_s,
        "under_provisioned_s": under_provisioned_s(run, interval_s),
        "peak_queued": float(run.queued.max()),
    }


def at_admission(run: ClosedRun) -> dict[str, float | None]:
    """The modelled mean concurrency a request found at admission and its mean wait, over the
    replications: what the recording's routers counted for the recorded config."""
    reps = run.replications or (run,)
    out: dict[str, float | None] = {}
    for name in ("mean_concurrency", "mean_wait_s"):
        known = [v for r in reps if (v := getattr(r, name)) is not None]
        out[name] = _r(sum(known) / len(known)) if known else None
    return out


def summary(run: ClosedRun, interval_s: float) -> dict[str, Any]:
    """The numbers of one deployment under one config (means over replications)."""
    reps = run.replications or (run,)
    per = [_series_summary(r, interval_s) for r in reps]
    series: dict[str, float | int] = {}
    for k in per[0]:
        v = sum(p[k] for p in per) / len(per)
        series[k] = int(v) if k in _COUNTS and v.is_integer() else _r(v)
    p: dict[str, Any] = {f"p{q:g}_s": _opt(run.percentile(q)) for q in PERCENTILES}
    mean = float(run.latency @ run.weight / run.weight.sum()) if run.weight.size else None
    if len(reps) > 1:  # what one run may see: the spread of the replications' own p99
        each = sorted(x for r in reps if (x := r.percentile(99.0)) is not None)
        if each:
            p["p99_runs_s"] = [_r(each[0]), _r(float(np.median(each))), _r(each[-1])]
    return {
        **p,
        **series,
        **at_admission(run),
        "mean_latency_s": _opt(mean),
        "arrived": _r(run.arrived),
        "completed": _r(run.completed()),
        "rejected": _r(run.rejected),
        "timed_out": _r(run.timed_out),
    }


def _samples(run: ClosedRun, interval_s: float) -> dict[str, list[Any]]:
    step = max(1, round(SAMPLE_EVERY_S / interval_s))
    sel = slice(step - 1, None, step)
    rate = np.convolve(run.arrivals, np.ones(step), "full")[: run.arrivals.size] / (
        step * interval_s
    )
    t = run.times[sel].tolist()
    p99 = run.p99_series.tolist()[: len(t)] if step * interval_s == P99_EVERY_S else []
    return {
        "t": [_r(x) for x in t],
        "p99_s": [None if math.isnan(x) else _r(x) for x in p99],
        "arrival_rate": [_r(x) for x in rate[sel].tolist()],
        "demand": [_r(x) for x in run.demand[sel].tolist()],
        "queued": [_r(x) for x in run.queued[sel].tolist()],
        "target": run.target[sel].tolist(),
        "running": run.running[sel].tolist(),
    }


def _plain(v: object) -> object:
    if isinstance(v, float):
        return _r(v)
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def closed_doc(result: ClosedResult) -> dict[str, Any]:
    opts = result.options
    dt = opts.interval_s
    return {
        "v": 1,
        "kind": "whatif_closed",
        "options": _plain(asdict(opts)),
        "recording": {
            "start": _iso(result.start_us),
            "start_us": result.start_us,
            "duration_s": _r(result.duration_s),
        },
        "deployments": {
            key: {
                "config": _plain(asdict(run.config)),
                "max_ongoing_requests": run.max_ongoing,
                "startup_s": _r(run.startup_s),
                "calibration": _plain(run.calibration.doc()),
                "summary": summary(run, dt),
                "samples": _samples(run, dt),
            }
            for key, run in result.deployments.items()
        },
        "timeline": [
            {
                "t": _r(e.t),
                "deployment": e.deployment,
                "demand": _opt(e.demand),
                "target": e.target,
                "desired": e.desired,
                "running": e.running,
                "rule": e.rule,
            }
            for run in result.deployments.values()
            for e in run.timeline
        ],
    }


def closed_json(runs: Sequence[tuple[str, ClosedResult]]) -> bytes:
    if len(runs) == 1:
        return dumps(closed_doc(runs[0][1]))
    return dumps(
        {
            "v": 1,
            "kind": "whatif_closed_compare",
            "runs": [{"label": label, **closed_doc(r)} for label, r in runs],
        }
    )


COLUMNS = (
    ("p50_s", "p50 s"),
    ("p95_s", "p95 s"),
    ("p99_s", "p99 s"),
    ("rejected", "rejected"),
    ("timed_out", "timed out"),
    ("replica_seconds", "replica-s"),
    ("scale_events", "scale events"),
    ("under_provisioned_s", "under-prov s"),
)


def print_closed(runs: Sequence[tuple[str, ClosedResult]], out: TextIO) -> None:
    """Side by side: one row per (deployment, config)."""
    keys = sorted({k for _, r in runs for k in r.deployments})
    runs_col = any(r.options.replications > 1 for _, r in runs)
    head = ["deployment", "config", *(h for _, h in COLUMNS), *(["p99 s of runs"] * runs_col)]
    rows: list[list[str]] = []
    for key in keys:
        for label, r in runs:
            run = r.deployments.get(key)
            if run is None:
                continue
            s = summary(run, r.options.interval_s)
            cells = ["-" if s[c] is None else f"{s[c]:g}" for c, _ in COLUMNS]
            if runs_col:
                lo, med, hi = s.get("p99_runs_s") or (None, None, None)
                cells.append("-" if lo is None else f"{lo:.3g}..{hi:.3g} (median {med:.3g})")
            rows.append([key, label, *cells])
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    for line in [head, *rows]:
        out.write("  ".join(x.ljust(w) for x, w in zip(line, widths, strict=True)).rstrip() + "\n")
    for key in keys:
        cal = next(r.deployments[key].calibration for _, r in runs if key in r.deployments)
        base = "-" if cal.base_s is None else f"{cal.base_s:.4g}"
        out.write(
            f"{key}: calibrated service {base} s + {cal.slope_s:.4g} s per extra request"
            f" (cv {cal.cv:.2f}), dispersion {cal.dispersion:.2f},"
            f" start {'-' if cal.startup_s is None else f'{cal.startup_s:.3g}'} s"
            f" (median of {len(cal.startups)}; +{cal.startup_slope_s:.3g} s per replica"
            " starting with it),"
            f" max_ongoing {cal.max_ongoing or '-'}, slots busy under saturation"
            f" {cal.saturated_use:.2f}\n"
        )
        if cal.mean_concurrency is not None:  # what the recorded config's model should match
            seen = []
            for label, r in runs:
                m = at_admission(r.deployments[key]) if key in r.deployments else {}
                if m.get("mean_concurrency") is not None:
                    seen.append(f"{label} {m['mean_concurrency']:.2f}, {m['mean_wait_s']:.3f} s")
            out.write(
                f"{key}: at admission, as recorded: {cal.mean_concurrency:.2f} requests on the"
                f" replica, mean wait {cal.mean_wait_s:.3f} s; modelled: {'; '.join(seen) or '-'}"
                " (the recorded config's should match)\n"
            )


def plot(runs: Sequence[tuple[str, ClosedResult]], path: str | Path) -> None:
    """Per deployment: arrival rate and running replicas over time, and the p99 latency of the
    requests admitted in each 10 s, of every config. Needs matplotlib (the bench extra)."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError(
            "--plot needs matplotlib: pip install 'fleetpulse[bench]' (or leave --plot off)"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({k for _, r in runs for k in r.deployments})
    if not keys:
        raise UsageError("no deployment to plot")
    fig, axes = plt.subplots(len(keys), 2, figsize=(13, 3.6 * len(keys)), squeeze=False)
    for (ax, lx), key in zip(axes, keys, strict=True):
        for i, (label, r) in enumerate(runs):
            run = r.deployments.get(key)
            if run is None:
                continue
            minutes = run.times / 60.0
            if i == 0:
                step = max(1, round(SAMPLE_EVERY_S / r.options.interval_s))
                rate = np.convolve(run.arrivals, np.ones(step), "same") / (
                    step * r.options.interval_s
                )
                ax2 = ax.twinx()
                ax2.fill_between(minutes, rate, color="0.88", label="arrivals/s")
                ax2.set_ylabel("arrivals / s")
                ax.set_zorder(ax2.get_zorder() + 1)
                ax.patch.set_visible(False)
            ax.step(minutes, run.running, where="post", label=f"running ({label})")
            every = P99_EVERY_S / 60.0
            mid = (np.arange(run.p99_series.size) + 0.5) * every
            lx.plot(mid, run.p99_series, marker=".", label=f"p99 ({label})")
        ax.set_title(f"{key}: replicas")
        ax.set_xlabel("minutes")
        ax.legend(loc="upper left", fontsize="small")
        lx.set_title(f"{key}: p99 latency of the requests admitted in each {P99_EVERY_S:g} s")
        lx.set_ylabel("seconds")
        lx.set_xlabel("minutes")
        lx.legend(loc="upper left", fontsize="small")
        summary_txt = "  ".join(
            f"{label}: p99 {r.deployments[key].percentile(99) or 0:.3f} s"
            for label, r in runs
            if key in r.deployments
        )
        lx.text(0.99, 0.97, summary_txt, transform=lx.transAxes, ha="right", va="top",
                fontsize="small")  # fmt: skip
    fig.tight_layout()
    fig.savefig(str(path), dpi=100, metadata={"Software": None})
    plt.close(fig)

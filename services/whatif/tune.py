"""`fleetpulse tune`: search autoscaling configs on a recording for the cheapest that meets an SLO.

    fleetpulse tune rec/ --app app.yaml --slo p99=0.5 [--deployment app.dep] [--max-configs 200]
        [--out-yaml tuned.yaml] [--out tune.json] [--plot frontier.png]

How it works. The recording is calibrated once (calibrate.py); every candidate config of one
deployment runs through the closed-loop model (simulate.py) on the same seeded draws, so two
candidates differ only by their config. Candidates are the app file's own autoscaling config
(always first) and the grid of `GRID` around it (target, delays, look-back, factors, min/max),
taken in a seeded shuffle up to `--max-configs`: the time is bounded by the count, not by a
clock, so the result is the same on every run. Each candidate runs `--replications` times
(seeds seed, seed + 1, ...: different placements of the same recorded arrivals). A candidate
meets the objective when

- it rejects or times out no request,
- its latency percentile is within the SLO less a margin (`--margin`, 25%) in *every*
  replication, not just on average: a live run is one draw, and the model's measured error is
  of that order (recording.md, "Measured error"), and
- it scales at most `--max-scale-ratio` (1.5) times as often as the app file's own config does
  on the same recording (counted as one event if it never scales): a config that flaps is where
  a few hundred milliseconds of control-loop timing decide whether a burst meets too few
  replicas, which the model cannot promise.

The best is the one of those with the fewest replica-seconds (then the lower worst replication,
then the grid order). The frontier is the Pareto set of (replica-seconds, pooled percentile) over all
candidates.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from shared import settings
from shared.appconfig import AppConfig, AutoscalingConfig
from shared.errors import FleetpulseError, UsageError
from shared.subjects import deployment_key

from .calibrate import Calibration
from .closedloop import calibrate_for, recording_span, summary
from .model import _r, dumps
from .simulate import ModelOptions, add_queue_order_arg, run_deployment

GRID: dict[str, tuple[float, ...]] = {
    "target_ongoing_requests": (0.5, 0.75, 1.0, 1.5),  # x the config's
    "upscale_delay_s": (0.0, 0.5, 1.0, 2.0),  # x the config's (0 = at once)
    "downscale_delay_s": (0.25, 0.5, 1.0, 2.0),
    "look_back_period_s": (0.5, 1.0, 2.0),
    "upscaling_factor": (1.0, 2.0),
    "min_replicas": (0.0, 1.0),  # + the config's: one replica more kept warm
}
"""Multipliers (or, for min_replicas, an addition) applied to the app file's values."""


DEFAULT_MARGIN = 0.25
DEFAULT_MAX_SCALE_RATIO = 1.5
DEFAULT_REPLICATIONS = 8


@dataclass(frozen=True, slots=True)
class Rule:
    """When a candidate meets the objective (see the module docstring)."""

    percentile: float
    bound_s: float
    margin: float = DEFAULT_MARGIN
    max_scale_ratio: float = DEFAULT_MAX_SCALE_RATIO

    def __post_init__(self) -> None:
        if not 0 <= self.margin < 1:
            raise UsageError(f"--margin must be in [0, 1), not {self.margin!r}")
        if self.max_scale_ratio <= 0:
            raise UsageError(f"--max-scale-ratio must be > 0, not {self.max_scale_ratio!r}")

    def meets(self, c: Candidate, base_events: float) -> bool:
        return (
            c.failed == 0
            and c.worst is not None
            and c.worst <= self.bound_s * (1.0 - self.margin)
            and c.scale_events <= self.max_scale_ratio * max(base_events, 1.0)
        )


@dataclass(frozen=True, slots=True)
class Candidate:
    index: int
    config: AutoscalingConfig
    percentile: float | None
    """Over the pooled latencies of every replication."""
    replica_seconds: float
    failed: float
    summary: dict[str, Any]
    worst: float | None = None
    """The highest of the replications' own percentiles."""
    scale_events: float = 0.0
    meets: bool = False


def candidates(base: AutoscalingConfig, limit: int, seed: int) -> list[AutoscalingConfig]:
    """The base config, then up to limit - 1 distinct valid grid points in a seeded order."""
    keys = list(GRID)
    points = list(itertools.product(*(GRID[k] for k in keys)))
    random.Random(seed).shuffle(points)
    out = [base]
    seen = {base}
    for p in points:
        if len(out) >= limit:
            break
        values: dict[str, Any] = {}
        for k, x in zip(keys, p, strict=True):
            cur = getattr(base, k)
            if k == "min_replicas":
                values[k] = min(int(cur + x), base.max_replicas)
            elif k == "upscaling_factor":
                values[k] = x
            else:
                values[k] = max(cur * x, 0.0) if k != "look_back_period_s" else max(cur * x, 1.0)
        try:
            cfg = dataclasses.replace(base, **values)
        except (FleetpulseError, ValueError):
            continue
        if cfg not in seen:
            seen.add(cfg)
            out.append(cfg)
    return out


def frontier(cands: Sequence[Candidate]) -> list[Candidate]:
    """Pareto set: no other candidate is cheaper and at least as fast (failures count as slow)."""
    ok = sorted(
        (c for c in cands if c.percentile is not None and c.failed == 0),
        key=lambda c: (c.replica_seconds, c.percentile, c.index),
    )
    out: list[Candidate] = []
    best = float("inf")
    for c in ok:
        assert c.percentile is not None
        if c.percentile < best:
            out.append(c)
            best = c.percentile
    return out


def tune(
    cal: Calibration,
    key: str,
    base: AutoscalingConfig,
    max_ongoing: int,
    duration_s: float,
    rule: Rule,
    opts: ModelOptions,
    limit: int,
    progress: Any = None,
) -> tuple[list[Candidate], Candidate | None]:
    q = rule.percentile
    out: list[Candidate] = []
    for i, cfg in enumerate(candidates(base, limit, opts.seed)):
        run = run_deployment(key, cfg, max_ongoing, cal, duration_s, opts)
        s = summary(run, opts.interval_s)
        each = [r.percentile(q) for r in (run.replications or (run,))]
        worst = None if any(p is None for p in each) else max(p for p in each if p is not None)
        out.append(
            Candidate(i, cfg, run.percentile(q), s["replica_seconds"],
                      s["rejected"] + s["timed_out"], s, worst, float(s["scale_events"]))
        )  # fmt: skip
        if progress is not None:
            progress()
    base_events = out[0].scale_events
    out = [dataclasses.replace(c, meets=rule.meets(c, base_events)) for c in out]
    meeting = [c for c in out if c.meets]
    best = min(meeting, key=lambda c: (c.replica_seconds, c.worst, c.index), default=None)
    return out, best


_TUNED_KEYS = (*GRID, "max_replicas")


def tuned_yaml(app_text: str, app: str, deployment: str, cfg: AutoscalingConfig) -> str:
    """The app file with the deployment's autoscaling keys set to `cfg` (others kept)."""
    doc = yaml.safe_load(app_text)
    apps = doc.get("applications", [doc]) if isinstance(doc, dict) else []
    for a in apps:
        if a.get("name") != app:
            continue
        for d in a.get("deployments", []):
            if d.get("name") == deployment:
                auto = d.setdefault("autoscaling_config", {})
                for k in _TUNED_KEYS:
                    v = getattr(cfg, k)
                    auto[k] = round(v, 6) if isinstance(v, float) else v
                header = "# tuned by fleetpulse tune (closed-loop what-if); deploy with fleetpulse deploy\n"
                return header + yaml.safe_dump(doc, sort_keys=False)
    raise UsageError(f"{app}.{deployment} is not in the app file")


def parse_slo(text: str) -> tuple[float, float]:
    """'p99=0.5' -> (99.0, 0.5)."""
    try:
        name, value = text.split("=", 1)
        if not name.startswith("p"):
            raise ValueError
        q, bound = float(name[1:]), float(value)
        if not (0 < q < 100 and bound > 0):
            raise ValueError
    except ValueError:
        raise UsageError(f"--slo {text!r}: expected pNN=SECONDS, e.g. p99=0.5") from None
    return q, bound


def add_tune_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", type=Path, metavar="RECORDING", help="a recording file or directory")
    p.add_argument("--app", type=Path, required=True, metavar="APP_YAML")
    p.add_argument("--slo", required=True, help="latency objective, e.g. p99=0.5 (seconds)")
    p.add_argument("--deployment", help="app.deployment to tune (default: the only one)")
    p.add_argument("--max-configs", type=int, default=200, help="candidates (bounds the time)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--replications", type=int, default=DEFAULT_REPLICATIONS,
                   help="runs per candidate (seeds); the objective must hold in each")  # fmt: skip
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                   help="the percentile must be within the SLO less this fraction")  # fmt: skip
    p.add_argument("--max-scale-ratio", type=float, default=DEFAULT_MAX_SCALE_RATIO,
                   help="refuse configs scaling more than this many times as often as the app's")  # fmt: skip
    p.add_argument("--interval-s", type=float, default=0.1)
    p.add_argument("--timeout-s", type=float, default=None, help="request deadline (none)")
    add_queue_order_arg(p)
    p.add_argument("--out-yaml", type=Path, help="write the best config as an app file")
    p.add_argument("--out", type=Path, metavar="JSON", help="every candidate and the frontier")
    p.add_argument("--plot", type=Path, metavar="PNG", help="the frontier, cost vs latency")
    p.add_argument("--no-progress", action="store_true")
    settings.NAMESPACE.add_flag(p)


def _pick(apps: Sequence[AppConfig], wanted: str | None) -> tuple[str, str, Any]:
    deps = [(a.name, d.name, d) for a in apps for d in a.deployments]
    if wanted is not None:
        deps = [x for x in deps if deployment_key(x[0], x[1]) == wanted]
    if len(deps) != 1:
        names = ", ".join(deployment_key(a, d) for a, d, _ in deps) or "none"
        raise UsageError(f"name one deployment with --deployment (candidates: {names})")
    return deps[0]


def run_tune(args: argparse.Namespace) -> int:
    args.namespace = settings.NAMESPACE.resolve(args.namespace, os.environ)
    from rich.progress import Progress

    from .run import load_app_configs, load_report_rows

    q, bound = parse_slo(args.slo)
    rule = Rule(q, bound, args.margin, args.max_scale_ratio)
    apps = load_app_configs(args.app)
    app, dep, dcfg = _pick(apps, args.deployment)
    key = deployment_key(app, dep)
    opts = ModelOptions(
        interval_s=args.interval_s, seed=args.seed, timeout_s=args.timeout_s,
        replications=args.replications, namespace=args.namespace,
        random_order=args.queue_order == "random",
    )  # fmt: skip
    rows = load_report_rows(args.path, opts.namespace)
    cal = calibrate_for(rows, [apps], opts.namespace).get(key)
    if cal is None or cal.arrivals is None:
        raise UsageError(f"the recording has no request stats for {key}: nothing to tune on")
    _, duration = recording_span(rows)
    n = len(candidates(dcfg.policy, args.max_configs, args.seed))
    show = not args.no_progress and sys.stderr.isatty()
    with Progress(disable=not show, transient=True) as bar:
        task = bar.add_task(f"tuning {key}", total=n)
        cands, best = tune(cal, key, dcfg.policy, dcfg.max_ongoing_requests, duration,
                           rule, opts, args.max_configs,
                           lambda: bar.advance(task))  # fmt: skip
    front = frontier(cands)
    label = f"p{q:g}"
    base = cands[0]
    print(
        f"{key}: {len(cands)} configs x {opts.replications} replications on {duration:.0f} s of"
        f" recording, objective {label} <= {bound:g} s: every replication within"
        f" {bound * (1 - rule.margin):.3g} s (margin {rule.margin:.0%}), at most"
        f" {rule.max_scale_ratio * max(base.scale_events, 1.0):g} scale events"
    )
    print(f"{'replica-s':>10}  {label + ' s':>8}  {'worst':>6}  events  target  up_s  down_s"
          "  look_s  up_f  min  max  meets")  # fmt: skip
    shown = [*front, *([best] if best is not None and best not in front else [])]
    for c in shown:
        cfg = c.config
        mark = " <- best" if best is not None and c.index == best.index else ""
        print(
            f"{c.replica_seconds:>10.1f}  {c.percentile:>8.3f}  {c.worst or 0:>6.3f}"
            f"  {c.scale_events:>6g}  {cfg.target_ongoing_requests:>6g}"
            f"  {cfg.upscale_delay_s:>4g}  {cfg.downscale_delay_s:>6g}  {cfg.look_back_period_s:>6g}"
            f"  {cfg.upscaling_factor:>4g}  {cfg.min_replicas:>3}  {cfg.max_replicas:>3}"
            f"  {'yes' if c.meets else 'no':>5}{mark}"
        )
    print(f"as configured: {base.replica_seconds:.1f} replica-s, {label} "
          f"{'-' if base.percentile is None else f'{base.percentile:.3f}'} s,"
          f" {base.scale_events:g} scale events")  # fmt: skip
    if best is None:
        print(f"no config meets {label} <= {bound:g} s with the margin and scale-event limit,"
              " without rejecting or timing out requests")  # fmt: skip
    if args.out is not None:
        args.out.write_bytes(dumps(_doc(key, rule, cands, front, best)))
    if args.plot is not None:
        _plot(cands, front, best, label, bound, args.plot)
    if args.out_yaml is not None and best is not None:
        args.out_yaml.write_text(tuned_yaml(args.app.read_text(), app, dep, best.config))
        print(f"wrote {args.out_yaml}")
    return 0 if best is not None else 1


def _doc(key: str, rule: Rule, cands: Sequence[Candidate], front: Sequence[Candidate],
         best: Candidate | None) -> dict[str, Any]:  # fmt: skip
    def one(c: Candidate) -> dict[str, Any]:
        cfg = {
            k: _r(v) if isinstance(v, float) else v for k, v in dataclasses.asdict(c.config).items()
        }
        return {"index": c.index, "config": cfg, "summary": c.summary,
                "worst": None if c.worst is None else _r(c.worst), "meets": c.meets}  # fmt: skip

    return {
        "v": 1, "kind": "tune", "deployment": key,
        "slo": {"percentile": rule.percentile, "seconds": rule.bound_s, "margin": rule.margin,
                "max_scale_ratio": rule.max_scale_ratio},
        "best": None if best is None else best.index,
        "frontier": [c.index for c in front], "candidates": [one(c) for c in cands],
    }  # fmt: skip


def _plot(cands: Sequence[Candidate], front: Sequence[Candidate], best: Candidate | None,
          label: str, bound: float, path: Path) -> None:  # fmt: skip
    try:
        import matplotlib
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'fleetpulse[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    pts = [c for c in cands if c.percentile is not None]
    ax.scatter([c.replica_seconds for c in pts], [c.percentile or 0.0 for c in pts], s=8, c="0.7",
               label="candidates")  # fmt: skip
    ax.plot([c.replica_seconds for c in front], [c.percentile or 0.0 for c in front], "o-",
            label="frontier")  # fmt: skip
    if best is not None:
        ax.scatter([best.replica_seconds], [best.percentile or 0.0], s=80, marker="*", c="tab:red",
                   label="best", zorder=3)  # fmt: skip
    ax.axhline(bound, color="tab:red", linestyle=":", label=f"objective {label} {bound:g} s")
    ax.set_xlabel("replica-seconds")
    ax.set_ylabel(f"{label} latency (s)")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(str(path), dpi=100, metadata={"Software": None})
    plt.close(fig)

"""`fleetpulse replay FILE --what-if APP_YAML`: a recording through the autoscaling policy.

The report rows of the recording are loaded in recv_time order and run through the model once per
config: closed loop (`closedloop`, queueing calibrated from the recording's request stats) when
the recording can drive it, else open loop (`model.simulate`, the recorded load as it was). The
timeline goes to stdout (text), `--out` (JSON) and `--plot` (PNG). See docs/recording.md.

The flags are added to `fleetpulse replay`'s own (`services/cli.py` composes the two); `python -m
services.whatif replay FILE --what-if ...` is the same command without the launcher.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import numpy as np
import pyarrow as pa

from shared import settings
from shared.appbuild import build_apps
from shared.appconfig import AppConfig
from shared.errors import ConfigError, UsageError
from shared.recording import iter_batches
from shared.subjects import DEFAULT_NAMESPACE, Subjects

from . import closedloop
from . import model as whatif
from .simulate import ModelOptions, add_queue_order_arg


def load_report_rows(
    path: str | Path, namespace: str = DEFAULT_NAMESPACE
) -> list[whatif.ReportRow]:
    """The recording's report messages as (recv_us, subject, payload), stably sorted by
    recv_time (a directory may hold files of several recorders)."""
    prefix = Subjects(namespace).prefix + ".report."
    times: list[np.ndarray] = []
    subjects: list[str] = []
    payloads: list[bytes] = []
    for batch in iter_batches(path):
        col = batch.column(1)
        names = col.dictionary.to_pylist()
        wanted = np.fromiter((n.startswith(prefix) for n in names), np.bool_, len(names))
        idx = np.asarray(col.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
        mask = wanted[idx] if len(names) else np.zeros(batch.num_rows, np.bool_)
        if not mask.any():
            continue
        recv = np.asarray(batch.column(0).cast(pa.int64()).to_numpy(zero_copy_only=False))
        times.append(recv[mask])
        subjects.extend(names[i] for i in idx[mask].tolist())
        payloads.extend(batch.column(4).filter(pa.array(mask)).to_pylist())
    if not times:
        return []
    all_t = np.concatenate(times)
    order = np.argsort(all_t, kind="stable").tolist()
    t_list = all_t.tolist()
    return [(t_list[i], subjects[i], payloads[i]) for i in order]


def load_app_configs(path: str | Path) -> list[AppConfig]:
    """An app file: YAML as for `fleetpulse deploy` (apps defined in code are built), or JSON (one `AppConfig.to_json()`
    document, a list of them, or {"applications": [...]})."""
    p = Path(path)
    if p.suffix.lower() != ".json":
        return build_apps(str(p))  # apps defined in code are built, as by deploy
    try:
        doc = json.loads(p.read_bytes())
    except OSError as exc:
        raise ConfigError(f"cannot read the file: {exc.strerror or exc}", source=str(p)) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"not JSON: {exc}", source=str(p)) from None
    items = doc.get("applications") if isinstance(doc, dict) and "applications" in doc else doc
    if not isinstance(items, list):
        items = [items]
    apps = [AppConfig.from_json(json.dumps(item).encode()) for item in items]
    if not apps:
        raise ConfigError("no application in the file", source=str(p))
    return apps


def print_timeline(result: whatif.WhatIfResult, out: TextIO, label: str = "") -> None:
    head = f"what-if {label}".strip()
    print(f"{head}: {result.duration_s:.1f} s of recording", file=out)
    for e in result.timeline:
        demand = "-" if e.demand is None else f"{e.demand:.2f}"
        print(
            f"  {e.t:9.1f}s  {e.deployment:<24} demand {demand:>8}  target {e.target:>4}  "
            f"{e.reason}",
            file=out,
        )
    for key, run in result.deployments.items():
        if run.target.size:
            print(
                f"  {key}: {run.reports} reports, target {int(run.target.min())}.."
                f"{int(run.target.max())}, {float(run.running.sum()) * result.options.interval_s:.0f}"
                " replica-seconds",
                file=out,
            )
        else:
            print(f"  {key}: no ticks (empty recording)", file=out)
    others = sorted(k.split(":", 1)[1] for k in result.ignored if k.startswith("other_deployment:"))
    if others and not any(run.reports for run in result.deployments.values()):
        print(
            f"  warning: no report belongs to a deployment of the config; the recording has "
            f"{', '.join(others)}",
            file=sys.stderr,
        )


def run_whatif(
    path: Path,
    configs: Sequence[Path],
    opts: whatif.WhatIfOptions,
    *,
    out_json: Path | None = None,
    out_plot: Path | None = None,
    out: TextIO | None = None,
) -> list[tuple[str, whatif.WhatIfResult]]:
    out = out or sys.stdout
    rows = load_report_rows(path, opts.namespace)
    loaded = labelled_configs(configs)
    for _, apps in loaded:
        _warn_custom_policies(apps)
    runs = [(label, whatif.simulate(rows, apps, opts)) for label, apps in loaded]
    for label, r in runs:
        print_timeline(r, out, label if len(runs) > 1 else "")
    if out_json is not None:
        doc = whatif.timeline_json(runs[0][1]) if len(runs) == 1 else whatif.compare_json(runs)
        out_json.write_bytes(doc)
    if out_plot is not None:
        whatif.plot(runs, out_plot, title="what-if" if len(runs) == 1 else "compare")
    return runs


def _warn_custom_policies(apps: Sequence[AppConfig]) -> None:
    """What-if simulates the default policy only: say so rather than mislead."""
    for app in apps:
        for d in app.deployments:
            path = d.autoscaling.policy if d.autoscaling is not None else None
            if path is not None:
                print(
                    f"  warning: {app.name}.{d.name} names the custom policy {path}; what-if "
                    "runs the default policy with the same settings instead",
                    file=sys.stderr,
                )


def labelled_configs(configs: Sequence[Path]) -> list[tuple[str, list[AppConfig]]]:
    names = [c.name for c in configs]
    labels = names if len(set(names)) == len(names) else [str(c) for c in configs]
    return [(label, load_app_configs(c)) for label, c in zip(labels, configs, strict=True)]


def run_closed_whatif(args: argparse.Namespace, configs: Sequence[Path]) -> bool:
    """The closed-loop what-if; False (auto only) when the recording cannot drive it."""
    opts = ModelOptions(
        interval_s=args.interval_s,
        seed=args.seed,
        replications=args.replications,
        startup_s=args.startup_delay_s,
        timeout_s=args.timeout_s,
        namespace=args.namespace,
        random_order=args.queue_order == "random",
    )
    rows = load_report_rows(args.path, opts.namespace)
    loaded = labelled_configs(configs)
    for _, apps in loaded:
        _warn_custom_policies(apps)
    try:
        runs = closedloop.run_closed(rows, loaded, opts)
    except UsageError as exc:
        if args.model == "closed":
            raise
        print(f"  note: {exc}; running the open-loop what-if", file=sys.stderr)
        return False
    closedloop.print_closed(runs, sys.stdout)
    if args.out is not None:
        args.out.write_bytes(closedloop.closed_json(runs))
    if args.plot is not None:
        closedloop.plot(runs, args.plot)
    return True


# -- CLI -------------------------------------------------------------------------------------


def add_whatif_arguments(p: argparse.ArgumentParser) -> None:
    """The what-if flags of `fleetpulse replay` (after its republish flags)."""
    p.add_argument(
        "--what-if",
        type=Path,
        metavar="APP_YAML",
        help="instead of publishing, run the recording through the autoscaling policy of "
        "this app file on a simulated clock",
    )
    p.add_argument(
        "--compare", type=Path, metavar="APP_YAML", help="with --what-if: a second config"
    )
    p.add_argument("--out", type=Path, metavar="JSON", help="with --what-if: timeline JSON")
    p.add_argument("--plot", type=Path, metavar="PNG", help="with --what-if: demand vs replicas")
    p.add_argument(
        "--interval-s",
        type=float,
        default=whatif.DEFAULT_INTERVAL_S,
        help="simulated control interval (default: %(default)s s, like the controller)",
    )
    p.add_argument(
        "--startup-delay-s",
        type=float,
        default=None,
        help="simulated replica start time (default: closed loop as recorded, open loop 0)",
    )
    p.add_argument(
        "--model",
        choices=("auto", "closed", "open"),
        default="auto",
        help="closed: queueing calibrated from the recording's request stats; open: the "
        "recorded load as it was; auto (default): closed when the recording has the stats",
    )
    p.add_argument("--seed", type=int, default=0, help="closed loop: seed of the draws")
    p.add_argument(
        "--replications",
        type=int,
        default=1,
        help="closed loop: runs with seeds seed, seed+1, ...; numbers are their means",
    )
    p.add_argument(
        "--timeout-s", type=float, default=None, help="closed loop: request deadline (none)"
    )
    add_queue_order_arg(p)
    p.add_argument(
        "--sample-every-s",
        type=float,
        default=whatif.DEFAULT_SAMPLE_EVERY_S,
        help="spacing of the samples in the JSON (default: %(default)s s)",
    )
    settings.NAMESPACE.add_flag(p)


def run_whatif_args(args: argparse.Namespace) -> int:
    args.namespace = settings.NAMESPACE.resolve(args.namespace, os.environ)
    configs = [args.what_if] + ([args.compare] if args.compare is not None else [])
    if args.model != "open" and run_closed_whatif(args, configs):
        return 0
    opts = whatif.WhatIfOptions(
        interval_s=args.interval_s,
        startup_delay_s=args.startup_delay_s or 0.0,
        sample_every_s=args.sample_every_s,
        namespace=args.namespace,
    )
    run_whatif(args.path, configs, opts, out_json=args.out, out_plot=args.plot)
    return 0

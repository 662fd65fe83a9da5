"""`fleetpulse replay`: a recording back onto NATS with its original spacing, or through what-if.

How it works. Republish: every file is read (and validated) once to count the messages, so a
corrupt file stops the replay before anything is sent; then messages go out in file order.
Message i is due at `start + (recv_i - recv_0) / speed` on the event loop's clock and the loop
sleeps only while it is ahead, so sleep overshoot never accumulates and a slow stretch catches
up. With `--max-speed` nothing sleeps, and the connection is flushed every `FLUSH_EVERY`
messages to bound the client's buffer. `--subject-map A=B` rewrites subjects (`*` and `>` in A
carry their tokens to B's wildcards, in order). A rich progress bar shows the count and rate;
the last line reports the achieved rate.

Headers: nats-py hands a subscriber one value per header name, so a recording made by
`fleetpulse record` never holds repeated keys; a recording from another tool that does is
replayed with the last value of each name.

What-if: the report rows of the recording are loaded in recv_time order and run through
`whatif.simulate` once per config; the timeline goes to stdout (text), `--out` (JSON) and
`--plot` (PNG). See docs/recording.md for the model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np
import pyarrow as pa
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from shared import settings
from shared.appconfig import AppConfig
from shared.bus import subject_matches, validate_subject
from shared.errors import ConfigError, UsageError
from shared.natsbus import NatsBus
from shared.subjects import DEFAULT_NAMESPACE, Subjects

from . import closedloop, whatif
from .files import batch_messages, iter_batches
from .simulate import ModelOptions, add_queue_order_arg

FLUSH_EVERY = 1000
"""At --max-speed, wait for the server every this many messages (bounds the client buffer)."""
PROGRESS_EVERY = 200
MIN_SLEEP_S = 0.001
_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class SubjectMap:
    """`A=B`: subjects matching pattern A are rewritten to B, whose `*`/`>` take A's tokens."""

    source: str
    dest: str

    def __post_init__(self) -> None:
        validate_subject(self.source, wildcards=True)
        validate_subject(self.dest, wildcards=True)
        a, b = self.source.split("."), self.dest.split(".")
        if a.count("*") != b.count("*") or (a[-1] == ">") != (b[-1] == ">"):
            raise UsageError(
                f"--subject-map {self.source}={self.dest}: both sides need the same wildcards "
                "('*' count, and '>' on both or neither)"
            )

    @classmethod
    def parse(cls, text: str) -> SubjectMap:
        source, sep, dest = text.partition("=")
        if not sep or not source or not dest:
            raise UsageError(f"--subject-map wants A=B, not {text!r}")
        return cls(source.strip(), dest.strip())

    def apply(self, subject: str) -> str | None:
        if not subject_matches(self.source, subject):
            return None
        pattern, tokens = self.source.split("."), subject.split(".")
        captured = iter([tokens[i] for i, t in enumerate(pattern) if t == "*"])
        out: list[str] = []
        for t in self.dest.split("."):
            if t == "*":
                out.append(next(captured))
            elif t == ">":
                out.extend(tokens[len(pattern) - 1 :])
            else:
                out.append(t)
        return ".".join(out)


def map_subject(maps: Sequence[SubjectMap], subject: str) -> str:
    """The first map that matches rewrites the subject; none matching leaves it as it is."""
    for m in maps:
        mapped = m.apply(subject)
        if mapped is not None:
            return mapped
    return subject


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    path: Path
    nats_url: str
    speed: float | None = 1.0
    """Time scale: 2.0 replays twice as fast; None = as fast as possible."""
    subject_map: tuple[SubjectMap, ...] = ()
    progress: bool = False
    name: str = "fleetpulse-replay"

    def __post_init__(self) -> None:
        if self.speed is not None and not self.speed > 0:
            raise UsageError(f"--speed must be positive, not {self.speed}")


@dataclass(frozen=True, slots=True)
class ReplayStats:
    messages: int
    payload_bytes: int
    elapsed_s: float
    recorded_span_s: float

    @property
    def rate(self) -> float:
        return self.messages / self.elapsed_s if self.elapsed_s > 0 else 0.0


def _count(path: Path) -> tuple[int, int | None, int | None]:
    """(rows, first recv_us, last recv_us): validates every file before anything is sent."""
    rows, first, last = 0, None, None
    for b in iter_batches(path):
        if b.num_rows:
            t = np.asarray(b.column(0).cast(pa.int64()).to_numpy(zero_copy_only=False))
            first = int(t[0]) if first is None else first
            last = int(t[-1])
        rows += b.num_rows
    return rows, first, last


async def replay(cfg: ReplayConfig, *, console: Console | None = None) -> ReplayStats:
    total, first_us, last_us = _count(cfg.path)
    span = 0.0 if first_us is None or last_us is None else (last_us - first_us) / 1e6
    bus = await NatsBus.connect(cfg.nats_url, name=cfg.name)
    loop = asyncio.get_running_loop()
    sent = sent_bytes = 0
    progress = Progress(
        TextColumn("replay"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]} msg/s"),
        TimeElapsedColumn(),
        console=console or Console(stderr=True),
        disable=not cfg.progress,
    )
    try:
        with progress:
            task = progress.add_task("replay", total=total, rate="-")
            start = loop.time()
            for batch in iter_batches(cfg.path):
                for m in batch_messages(batch):
                    if cfg.speed is not None and first_us is not None:
                        due = start + (m.recv_us - first_us) / 1e6 / cfg.speed
                        ahead = due - loop.time()
                        if ahead > MIN_SLEEP_S:
                            await asyncio.sleep(ahead)
                    subject = map_subject(cfg.subject_map, m.subject)
                    headers = dict(m.headers) if m.headers else None
                    await bus.publish(subject, m.payload, reply=m.reply, headers=headers)
                    sent += 1
                    sent_bytes += len(m.payload)
                    if cfg.speed is None and sent % FLUSH_EVERY == 0:
                        await bus.flush()
                    if sent % PROGRESS_EVERY == 0:
                        rate = sent / max(loop.time() - start, 1e-9)
                        progress.update(task, completed=sent, rate=f"{rate:,.0f}")
            await bus.flush()
            elapsed = loop.time() - start
            progress.update(task, completed=sent, rate=f"{sent / max(elapsed, 1e-9):,.0f}")
    finally:
        await bus.close()
    return ReplayStats(sent, sent_bytes, elapsed, span)


# -- what-if ---------------------------------------------------------------------------------


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
        from services.ops.deploy import build_apps  # apps defined in code are built here

        return build_apps(str(p))
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


# -- CLI -------------------------------------------------------------------------------------


def add_replay_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", type=Path, metavar="FILE|DIR", help="a recording file or directory")
    pace = p.add_mutually_exclusive_group()
    pace.add_argument("--speed", type=float, default=1.0, help="time scale (2 = twice as fast)")
    pace.add_argument("--max-speed", action="store_true", help="publish as fast as possible")
    p.add_argument(
        "--subject-map",
        action="append",
        default=[],
        metavar="A=B",
        help="rewrite subjects matching A to B (wildcards carry over); repeatable",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
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


def run_replay(args: argparse.Namespace) -> int:
    args.namespace = settings.NAMESPACE.resolve(args.namespace, os.environ)
    if args.what_if is None:
        for flag in ("compare", "out", "plot"):
            if getattr(args, flag) is not None:
                raise UsageError(f"--{flag} needs --what-if")
        cfg = ReplayConfig(
            path=args.path,
            nats_url=args.nats,
            speed=None if args.max_speed else args.speed,
            subject_map=tuple(SubjectMap.parse(s) for s in args.subject_map),
            progress=not args.no_progress and sys.stderr.isatty(),
        )
        stats = asyncio.run(replay(cfg))
        pace = "max speed" if cfg.speed is None else f"speed x{cfg.speed:g}"
        print(
            f"replayed {stats.messages:,} messages ({stats.payload_bytes / _MIB:.1f} MiB) in "
            f"{stats.elapsed_s:.2f} s: {stats.rate:,.1f} msg/s achieved ({pace}; the "
            f"recording spans {stats.recorded_span_s:.2f} s)",
            file=sys.stderr,
        )
        return 0
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

"""`fleetpulse replay`: a recording back onto NATS with its original spacing.

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

`fleetpulse replay --what-if` runs the recording through the autoscaling policy instead: that is
the what-if model's (`services/whatif/run.py`), which the CLI calls in place of this module.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

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

from shared.bus import subject_matches, validate_subject
from shared.errors import UsageError
from shared.natsbus import NatsBus
from shared.recording import batch_messages, iter_batches

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


def run_replay(args: argparse.Namespace) -> int:
    """Republish a recording (`fleetpulse replay FILE`; with `--what-if` the CLI runs
    `services.whatif.run` instead)."""
    for flag in ("compare", "out", "plot"):
        if getattr(args, flag, None) is not None:
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

"""`fleetpulse record`: NATS subjects, or a time range of the FP_REPORTS stream, to recording files.

How it works. Live: one subscription per `--subject`; each message is stamped on arrival and
appended to a `RecordingWriter`, which writes a batch when it is full, and a timer loop ticks the
writer (time-based flushes and rotation) and prints progress. Receipt times are the wall clock
at start plus the monotonic time since, so a wall-clock step (NTP) never makes them go
backwards or jump. SIGTERM/SIGINT (or `--duration-s` / `--max-messages`) stop it cleanly: the
last batch is written and every file ends with its end-of-stream marker, so the recorder also
runs as a long-lived compose service.

Export: an ordered JetStream consumer reads FP_REPORTS from the start time on; each stored
subject `fp.v1.part.{P}.{kind}.{app}.{dep}` is mapped back to the report subject it was
published on, and the message's stream timestamp becomes its `recv_time`. The export stops at
the end time, or at the last message the stream held when the export began.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TextIO

import nats.errors
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from shared import aioloop, settings
from shared.bus import Msg, subject_matches, validate_subject
from shared.clock import SYSTEM_CLOCK, Clock
from shared.errors import FleetpulseError, UsageError
from shared.metrics_catalog import add_metrics_port_argument, metrics_port, serve_metrics
from shared.natsbus import NatsBus
from shared.recording import (
    RecordingError,
    RecordingWriter,
    WriterConfig,
    wall_to_us,
)
from shared.signals import on_stop_signals
from shared.subjects import DEFAULT_NAMESPACE, Subjects, partition_prefix, report_subject
from shared.subjects import REPORT_STREAM as STREAM_NAME

log = logging.getLogger(__name__)

DEFAULT_PROGRESS_INTERVAL_S: float = settings.RECORD_PROGRESS_INTERVAL.default
EXPORT_IDLE_TIMEOUT_S = 2.0
"""An export that receives nothing for this long has read everything there is."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_AGO_RE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class RecordConfig:
    nats_url: str
    writer: WriterConfig
    subjects: tuple[str, ...] = ("fp.v1.report.>",)
    progress_interval_s: float = DEFAULT_PROGRESS_INTERVAL_S
    """0 turns progress lines off."""
    duration_s: float | None = None
    max_messages: int | None = None
    name: str = "fleetpulse-recorder"
    metrics_port: int = settings.METRICS_PORT.default
    """Serve Prometheus /metrics here while recording (0: off)."""

    def __post_init__(self) -> None:
        if not self.subjects:
            raise UsageError("record needs at least one --subject")
        for s in self.subjects:
            validate_subject(s, wildcards=True)


@dataclass(frozen=True, slots=True)
class ExportConfig:
    nats_url: str
    writer: WriterConfig
    namespace: str = DEFAULT_NAMESPACE
    start_s: float | None = None
    """Unix seconds; None = from the first message the stream holds."""
    end_s: float | None = None
    """Unix seconds; None = up to the last message held when the export began."""
    subjects: tuple[str, ...] = ()
    """Report subject patterns to keep (after mapping back); empty = every report."""
    progress_interval_s: float = DEFAULT_PROGRESS_INTERVAL_S
    name: str = "fleetpulse-export"


@dataclass(slots=True)
class RecordStats:
    received: int = 0
    payload_bytes: int = 0
    files: list[Path] = field(default_factory=list)
    bytes_written: int = 0
    elapsed_s: float = 0.0


class Progress:
    """Prints `recorded N msgs, X MiB, R msg/s` every `interval_s` (0: never)."""

    def __init__(self, interval_s: float, clock: Clock, out: TextIO | None = None) -> None:
        self._interval = interval_s
        self._clock = clock
        self._out = out or sys.stderr
        self._start = self._last = clock.monotonic()
        self._last_count = 0

    def due(self) -> bool:
        return self._interval > 0 and self._clock.monotonic() - self._last >= self._interval

    def line(self, verb: str, count: int, written: int, files: int) -> str:
        now = self._clock.monotonic()
        span = max(now - self._last, 1e-9)
        rate = (count - self._last_count) / span
        self._last, self._last_count = now, count
        return (
            f"{verb} {count:,} msgs, {written / _MIB:.1f} MiB in {files} file(s), {rate:,.1f} msg/s"
        )

    def print(self, verb: str, count: int, written: int, files: int) -> None:
        print(self.line(verb, count, written, files), file=self._out, flush=True)

    def elapsed(self) -> float:
        return self._clock.monotonic() - self._start


def parse_time(value: str, now_wall: float) -> float:
    """Unix seconds from ISO 8601 (`2024-05-01T12:00:00Z`; no zone = UTC), a duration ago
    (`90s`, `15m`, `2h`, `1d`) or `now`."""
    text = value.strip()
    if text == "now":
        return now_wall
    m = _AGO_RE.match(text)
    if m:
        return now_wall - float(m.group(1)) * _UNIT_S[m.group(2)]
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"cannot read time {value!r}: use ISO 8601 (2024-05-01T12:00:00Z), "
            "a duration ago (15m, 2h, 1d) or 'now'"
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


# -- live ------------------------------------------------------------------------------------


async def record_live(
    cfg: RecordConfig,
    *,
    stop: asyncio.Event | None = None,
    ready: Callable[[], None] | None = None,
    clock: Clock = SYSTEM_CLOCK,
    out: TextIO | None = None,
) -> RecordStats:
    """Record until `stop` is set, `duration_s` passed or `max_messages` arrived. `ready` is
    called once every subscription is registered on the server."""
    stop = stop or asyncio.Event()
    stats = RecordStats()
    writer = RecordingWriter(cfg.writer, clock)
    progress = Progress(cfg.progress_interval_s, clock, out)
    wall0, mono0 = clock.wall(), clock.monotonic()
    limit = cfg.max_messages
    # imported here, not at the top: the `fleetpulse` parser imports this module for its flags,
    # and every process would register the recorder's metric families
    from .metrics import WRITE_ERRORS, RecorderMetrics

    metrics = RecorderMetrics()
    failed: list[FleetpulseError] = []

    def fail(exc: FleetpulseError) -> None:
        # a full disk must stop the recorder, not be logged once a second forever
        WRITE_ERRORS.inc()
        failed.append(exc)
        stop.set()

    async def on_msg(msg: Msg) -> None:
        if failed or (limit is not None and stats.received >= limit):
            return
        recv_us = wall_to_us(wall0 + (clock.monotonic() - mono0))
        headers = list(msg.headers.items()) if msg.headers else None
        try:
            writer.append(recv_us, msg.subject, msg.data, msg.reply, headers)
        except FleetpulseError as exc:
            fail(exc)
            return
        stats.received += 1
        stats.payload_bytes += len(msg.data)
        if limit is not None and stats.received >= limit:
            stop.set()

    bus = await NatsBus.connect(cfg.nats_url, name=cfg.name, clock=clock)
    subs = []
    try:
        for subject in cfg.subjects:
            subs.append(await bus.subscribe(subject, on_msg))
        await bus.flush()
        log.info("recording %s to %s", ", ".join(cfg.subjects), cfg.writer.out_dir)
        if ready is not None:
            ready()
        tick = min(cfg.writer.flush_interval_s, cfg.progress_interval_s or math.inf, 1.0)
        deadline = None if cfg.duration_s is None else mono0 + cfg.duration_s
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), tick)
            if failed:
                break
            try:
                writer.tick()
            except FleetpulseError as exc:
                fail(exc)
                break
            metrics.update(stats.received, stats.payload_bytes, writer)
            if progress.due():
                progress.print("recorded", stats.received, writer.bytes_written, len(writer.files))
            if deadline is not None and clock.monotonic() >= deadline:
                break
    finally:
        for sub in subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        await bus.close()
        try:
            writer.close()
        except RecordingError as exc:
            WRITE_ERRORS.inc()
            if failed:
                log.error("closing the recording: %s", exc)
            else:
                failed.append(exc)
        metrics.update(stats.received, stats.payload_bytes, writer)
    if failed:
        raise failed[0]
    return _finish(stats, writer, progress)


def _finish(stats: RecordStats, writer: RecordingWriter, progress: Progress) -> RecordStats:
    stats.files = list(writer.files)
    stats.bytes_written = writer.bytes_written
    stats.elapsed_s = progress.elapsed()
    return stats


# -- export from JetStream -------------------------------------------------------------------


def stream_name(namespace: str) -> str:
    return STREAM_NAME if namespace == DEFAULT_NAMESPACE else f"{STREAM_NAME}_{namespace}"


def _stream_us(ts: datetime) -> int:
    return (ts - _EPOCH) // timedelta(microseconds=1)


async def export_stream(
    cfg: ExportConfig, *, clock: Clock = SYSTEM_CLOCK, out: TextIO | None = None
) -> RecordStats:
    """Copy [start, end] of FP_REPORTS into recording files (see the module docstring)."""
    subjects = Subjects(cfg.namespace)
    name = stream_name(cfg.namespace)
    stats = RecordStats()
    writer = RecordingWriter(cfg.writer, clock)
    progress = Progress(cfg.progress_interval_s, clock, out)
    bus = await NatsBus.connect(cfg.nats_url, name=cfg.name, clock=clock)
    try:
        try:
            info = await bus.js.stream_info(name)
        except NotFoundError:
            raise UsageError(
                f"no JetStream stream {name!r} on {cfg.nats_url} (is a controller running "
                f"with namespace {cfg.namespace!r}?)"
            ) from None
        last_seq = info.state.last_seq
        if info.state.messages == 0:
            return _finish(stats, writer, progress)
        if cfg.start_s is None:
            consumer = ConsumerConfig()
            policy = DeliverPolicy.ALL
        else:
            consumer = ConsumerConfig(opt_start_time=datetime.fromtimestamp(cfg.start_s, UTC))
            policy = DeliverPolicy.BY_START_TIME
        sub = await bus.js.subscribe(
            f"{partition_prefix(subjects)}.>",
            stream=name,
            ordered_consumer=True,
            deliver_policy=policy,
            config=consumer,
        )
        end_us = None if cfg.end_s is None else wall_to_us(cfg.end_s)
        try:
            while True:
                try:
                    m = await sub.next_msg(timeout=EXPORT_IDLE_TIMEOUT_S)
                except (nats.errors.TimeoutError, TimeoutError):
                    break
                md = m.metadata
                recv_us = _stream_us(md.timestamp)
                if end_us is not None and recv_us > end_us:
                    break
                subject = report_subject(subjects, m.subject)
                if not cfg.subjects or any(subject_matches(p, subject) for p in cfg.subjects):
                    writer.append(recv_us, subject, m.data, None, _headers(m.headers))
                    stats.received += 1
                    stats.payload_bytes += len(m.data)
                writer.tick()
                if progress.due():
                    progress.print(
                        "exported", stats.received, writer.bytes_written, len(writer.files)
                    )
                if md.sequence.stream >= last_seq:
                    break
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
    finally:
        await bus.close()
        writer.close()
    return _finish(stats, writer, progress)


def _headers(h: dict[str, str] | None) -> list[tuple[str, str]] | None:
    return list(h.items()) if h else None


# -- CLI -------------------------------------------------------------------------------------


def add_record_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--subject",
        action="append",
        default=None,
        metavar="PATTERN",
        help="subject (wildcards allowed) to record; repeat for several "
        "(default: every report, '{namespace}.v1.report.>')",
    )
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="output directory")
    for row in settings.RECORDER:
        row.add_flag(p)
    p.add_argument("--duration-s", type=float, default=None, help="stop after this long")
    p.add_argument("--max-messages", type=int, default=None, help="stop after this many")
    settings.NAMESPACE.add_flag(p)
    add_metrics_port_argument(p)
    p.add_argument(
        "--from-stream",
        action="store_true",
        help="export a time range of the FP_REPORTS JetStream stream instead of subscribing",
    )
    p.add_argument(
        "--start",
        default=None,
        help="with --from-stream: ISO 8601 time or a duration ago (15m, 2h); default: oldest",
    )
    p.add_argument(
        "--end",
        default=None,
        help="with --from-stream: ISO 8601 time or a duration ago; default: the newest message",
    )


def _writer_config(args: argparse.Namespace) -> WriterConfig:
    env = os.environ
    return WriterConfig(
        out_dir=args.out,
        prefix=settings.RECORD_PREFIX.resolve(args.prefix, env),
        batch_rows=settings.RECORD_BATCH_ROWS.resolve(args.batch_rows, env),
        flush_interval_s=settings.RECORD_FLUSH_INTERVAL.resolve(args.flush_interval_s, env),
        rotate_bytes=max(1, int(settings.RECORD_ROTATE_MB.resolve(args.rotate_mb, env) * _MIB)),
        rotate_s=settings.RECORD_ROTATE_S.resolve(args.rotate_s, env),
        compression="zstd" if settings.RECORD_ZSTD.resolve(args.zstd, env) else None,
    )


def run_record(args: argparse.Namespace) -> int:
    args.namespace = settings.NAMESPACE.resolve(args.namespace, os.environ)
    writer = _writer_config(args)
    if args.from_stream:
        if args.duration_s is not None or args.max_messages is not None:
            raise UsageError("--duration-s and --max-messages apply to live recording only")
        now = SYSTEM_CLOCK.wall()
        export = ExportConfig(
            nats_url=args.nats,
            writer=writer,
            namespace=args.namespace,
            start_s=None if args.start is None else parse_time(args.start, now),
            end_s=None if args.end is None else parse_time(args.end, now),
            subjects=tuple(args.subject or ()),
            progress_interval_s=settings.RECORD_PROGRESS_INTERVAL.resolve(
                args.progress_interval_s, os.environ
            ),
        )
        stats = aioloop.run(export_stream(export))
        verb = "exported"
    else:
        if args.start is not None or args.end is not None:
            raise UsageError("--start and --end need --from-stream")
        cfg = RecordConfig(
            nats_url=args.nats,
            writer=writer,
            subjects=tuple(args.subject or (Subjects(args.namespace).reports_wildcard(),)),
            progress_interval_s=settings.RECORD_PROGRESS_INTERVAL.resolve(
                args.progress_interval_s, os.environ
            ),
            duration_s=args.duration_s,
            max_messages=args.max_messages,
            metrics_port=metrics_port(args),
        )
        serve_metrics(cfg.metrics_port, "recorder")
        stats = aioloop.run(_record_until_signal(cfg))
        verb = "recorded"
    rate = stats.received / stats.elapsed_s if stats.elapsed_s > 0 else 0.0
    print(
        f"{verb} {stats.received:,} messages ({stats.payload_bytes / _MIB:.1f} MiB of payload) "
        f"into {len(stats.files)} file(s), {stats.bytes_written / _MIB:.1f} MiB, "
        f"in {stats.elapsed_s:.1f} s ({rate:,.1f} msg/s)",
        file=sys.stderr,
    )
    for f in stats.files:
        print(f)
    return 0


async def _record_until_signal(cfg: RecordConfig) -> RecordStats:
    stop = asyncio.Event()
    with on_stop_signals(stop.set):
        return await record_live(cfg, stop=stop)

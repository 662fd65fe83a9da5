"""Record and replay on real nats-servers: a live run recorded and replayed into a fresh server,
timing and subject maps, export from the FP_REPORTS stream, and the CLI as a process."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import sys
import time
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from services.controller.stream import ensure_stream
from services.recorder.record import ExportConfig, RecordConfig, export_stream, record_live
from services.recorder.replay import ReplayConfig, SubjectMap, replay
from shared.bus import Msg
from shared.natsbus import NatsBus
from shared.natsserver import NatsServer
from shared.recording import (
    RecordingError,
    WriterConfig,
    iter_messages,
    read_recording,
    recording_files,
)
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.subjects import Subjects
from tests.procs import ROOT

Sent = tuple[str, bytes, str | None, dict[str, str] | None]
SUBJECTS = [
    S.report("handle", "shop", "api"),
    S.report("replica", "shop", "api"),
    S.report("lifecycle", "shop", "model"),
]


@pytest.fixture
def fresh_server() -> Iterator[NatsServer]:
    server = NatsServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[NatsBus]:
    b = await NatsBus.connect(nats_url, name="test")
    yield b
    await b.close()


class Collector:
    def __init__(self) -> None:
        self.got: list[tuple[Msg, float]] = []
        self.loop = asyncio.get_running_loop()
        self._want = 0
        self._enough = asyncio.Event()

    async def __call__(self, msg: Msg) -> None:
        self.got.append((msg, self.loop.time()))
        if len(self.got) >= self._want:
            self._enough.set()

    async def wait_for(self, n: int, timeout: float = 10.0) -> None:
        self._want = n
        if len(self.got) < n:
            self._enough.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._enough.wait(), timeout)
        await asyncio.sleep(0.05)  # nothing more should arrive
        assert len(self.got) == n


def sent_tuple(m: Msg) -> Sent:
    return (m.subject, m.data, m.reply, dict(m.headers) if m.headers else None)


async def publish_run(bus: NatsBus, n: int, gap_at: tuple[int, ...] = ()) -> list[Sent]:
    out: list[Sent] = []
    for i in range(n):
        subject = SUBJECTS[i % 3] if i % 7 else f"other.app.{i}"
        data = bytes([i % 256]) * (i % 37)  # includes empty payloads
        reply = f"reply.{i}" if i % 5 == 0 else None
        headers = {"Trace-Id": f"t{i}", "X-Kind": "k"} if i % 3 == 0 else None
        await bus.publish(subject, data, reply=reply, headers=headers)
        out.append((subject, data, reply, headers))
        if i in gap_at:
            await bus.flush()
            await asyncio.sleep(0.3)
    await bus.flush()
    return out


async def test_a_recorded_run_replays_the_same_messages_in_order(
    bus: NatsBus, nats_url: str, fresh_server: NatsServer, tmp_path: Path
) -> None:
    n = 240
    out = tmp_path / "rec"
    cfg = RecordConfig(
        nats_url=nats_url,
        writer=WriterConfig(out, batch_rows=50, flush_interval_s=0.1, compression="zstd"),
        subjects=("fp.v1.report.>", "other.>"),
        progress_interval_s=0,
        max_messages=n,
    )
    ready = asyncio.Event()
    task = asyncio.create_task(record_live(cfg, ready=ready.set))
    await asyncio.wait_for(ready.wait(), 10)
    sent = await publish_run(bus, n, gap_at=(79, 159))
    stats = await asyncio.wait_for(task, 10)
    assert stats.received == n and stats.files == recording_files(out)

    recorded = [(m.subject, m.payload, m.reply, dict(m.headers) if m.headers else None)
                for m in iter_messages(out)]  # fmt: skip
    # one subscription per pattern: each pattern's messages keep their publish order, and
    # nothing is lost or changed
    for prefix in ("fp.", "other."):
        assert [r for r in recorded if r[0].startswith(prefix)] == [
            s for s in sent if s[0].startswith(prefix)
        ]
    assert sorted(recorded, key=repr) == sorted(sent, key=repr)

    # as fast as possible into a fresh server: the same messages in the recorded order
    target = await NatsBus.connect(fresh_server.url, name="sub")
    try:
        got = Collector()
        await target.subscribe(">", got)
        await target.flush()
        rstats = await replay(ReplayConfig(out, fresh_server.url, speed=None))
        await got.wait_for(n)
        assert [sent_tuple(m) for m, _ in got.got] == recorded
        assert rstats.messages == n and rstats.rate > 0

        # at speed 2 with a subject map: the 0.3 s gaps come out as ~0.15 s
        mapped = Collector()
        await target.subscribe("copy.>", mapped)
        await target.flush()
        maps = (SubjectMap.parse("fp.v1.report.*.shop.>=copy.*.>"),)
        await replay(ReplayConfig(out, fresh_server.url, speed=2.0, subject_map=maps))
        reports = [r for r in recorded if r[0].startswith("fp.")]
        await mapped.wait_for(len(reports))
        assert [m.subject for m, _ in mapped.got] == [
            r[0].replace("fp.v1.report.", "copy.").replace(".shop.", ".") for r in reports
        ]
        times = [t for _, t in mapped.got]
        gaps = sorted(b - a for a, b in itertools.pairwise(times))[-2:]
        assert all(0.1 <= g <= 0.3 for g in gaps), gaps
    finally:
        await target.close()


async def _stream_count(bus: NatsBus, name: str, n: int) -> None:
    for _ in range(200):
        if (await bus.js.stream_info(name)).state.messages >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"stream {name} never held {n} messages")


async def test_export_a_time_range_of_the_reports_stream(
    bus: NatsBus, nats_url: str, tmp_path: Path
) -> None:
    name = await ensure_stream(bus.js, Subjects(), partitions=4, retention_s=600)
    t_start = time.time()
    first = [(SUBJECTS[i % 3], f"a{i}".encode()) for i in range(9)]
    for subject, data in first:
        await bus.publish(subject, data, headers={"Seq": data.decode()})
    await _stream_count(bus, name, 9)
    await asyncio.sleep(0.2)
    t_mid = time.time()
    await asyncio.sleep(0.2)
    second = [(SUBJECTS[i % 3], f"b{i}".encode()) for i in range(4)]
    for subject, data in second:
        await bus.publish(subject, data)
    await _stream_count(bus, name, 13)
    t_end = time.time()

    def cfg(out: str, **kw: object) -> ExportConfig:
        return ExportConfig(nats_url, WriterConfig(tmp_path / out), progress_interval_s=0, **kw)  # type: ignore[arg-type]

    stats = await export_stream(cfg("all"))
    assert stats.received == 13
    rows = list(iter_messages(tmp_path / "all"))
    # stored as fp.v1.part.{P}.{kind}.{app}.{dep}, exported as the subject it was published on
    assert [(m.subject, m.payload) for m in rows] == first + second
    assert rows[0].headers == (("Seq", "a0"),)
    assert all(t_start - 1 <= m.recv_us / 1e6 <= t_end + 1 for m in rows)
    assert all(m.recv_us / 1e6 < t_mid for m in rows[:9])  # stream timestamps, not export time

    await export_stream(cfg("late", start_s=t_mid))
    assert [m.payload for m in iter_messages(tmp_path / "late")] == [d for _, d in second]
    await export_stream(cfg("early", end_s=t_mid))
    assert [m.payload for m in iter_messages(tmp_path / "early")] == [d for _, d in first]
    await export_stream(cfg("handles", subjects=("fp.v1.report.handle.>",)))
    handles = [m.subject for m in iter_messages(tmp_path / "handles")]
    assert handles and set(handles) == {SUBJECTS[0]}


def _rows(path: Path) -> int:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the recorder may be mid-write
            return int(read_recording(path).num_rows)
    except RecordingError:  # no file yet, or one the recorder has only just opened
        return 0


async def test_the_cli_records_until_sigterm_and_replays(
    bus: NatsBus, nats_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "cli"
    cmd = [sys.executable, "-m", "services.recorder"]
    record = await asyncio.create_subprocess_exec(
        *cmd, "record", "--nats", nats_url, "--subject", "cli.>", "--out", str(out),
        "--flush-interval-s", "0.1", "--progress-interval-s", "0.2",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        for _ in range(200):  # until the recorder's subscription is live
            await bus.publish("cli.ping", b"")
            await bus.flush()
            if out.exists() and _rows(out):
                break
            await asyncio.sleep(0.05)
        pings = _rows(out)
        assert pings > 0
        for i in range(20):
            await bus.publish(f"cli.data.{i}", str(i).encode(), headers={"N": str(i)})
        await bus.flush()
        for _ in range(100):
            if _rows(out) >= pings + 20:
                break
            await asyncio.sleep(0.05)
        record.send_signal(signal.SIGTERM)
        stdout, stderr = await asyncio.wait_for(record.communicate(), 10)
    finally:
        with contextlib.suppress(ProcessLookupError):
            record.kill()
        await record.wait()
    assert record.returncode == 0, stderr.decode()
    assert "recorded" in stderr.decode() and "msg/s" in stderr.decode()
    files = recording_files(out)
    assert stdout.decode().split() == [str(f) for f in files]
    assert files[-1].read_bytes().endswith(b"\xff\xff\xff\xff\x00\x00\x00\x00")  # closed cleanly

    got = Collector()
    await bus.subscribe("cli.data.>", got)
    await bus.flush()
    rep = await asyncio.create_subprocess_exec(
        *cmd, "replay", str(out), "--nats", nats_url, "--max-speed", "--no-progress",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        _, rep_err = await asyncio.wait_for(rep.communicate(), 20)
    finally:
        with contextlib.suppress(ProcessLookupError):
            rep.kill()
        await rep.wait()
    assert rep.returncode == 0, rep_err.decode()
    assert "msg/s achieved" in rep_err.decode()
    await got.wait_for(20)
    assert [(m.subject, m.data, dict(m.headers or {})) for m, _ in got.got] == [
        (f"cli.data.{i}", str(i).encode(), {"N": str(i)}) for i in range(20)
    ]


async def test_a_recorder_that_cannot_write_stops_with_the_error(
    bus: NatsBus, nats_url: str, tmp_path: Path
) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the output directory should be")
    cfg = RecordConfig(
        nats_url, WriterConfig(blocked, batch_rows=1), subjects=("w.>",), progress_interval_s=0
    )
    ready = asyncio.Event()
    task = asyncio.create_task(record_live(cfg, ready=ready.set))
    await asyncio.wait_for(ready.wait(), 10)
    await bus.publish("w.1", b"x")
    await bus.flush()
    with pytest.raises(RecordingError, match="cannot write"):
        await asyncio.wait_for(task, 10)

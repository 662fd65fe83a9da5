"""Recording files: writing (batches, dictionary, rotation, compression), reading (truncated
tails, corruption, other versions), the documented reader recipes, and replay's pure helpers."""

from __future__ import annotations

import struct
import warnings
from pathlib import Path

import pyarrow as pa
import pytest

from services.recorder.record import parse_time
from services.recorder.replay import SubjectMap, map_subject
from shared import recording as files
from shared.clock import FakeClock
from shared.errors import UsageError
from shared.recording import (
    FILE_SUFFIX,
    RecordedMessage,
    RecordingError,
    RecordingVersionError,
    RecordingWriter,
    TruncatedRecordingWarning,
    WriterConfig,
    iter_file_batches,
    iter_messages,
    read_recording,
    recording_files,
)
from shared.wire.arrow_schemas import RECORDING_SCHEMA, RECORDING_VERSION_KEY

T0 = 1_700_000_000_000_000


def msgs(n: int, subjects: int = 3) -> list[RecordedMessage]:
    out = []
    for i in range(n):
        headers = (("Trace", f"t{i}"), ("Trace", "again")) if i % 4 == 0 else None
        reply = f"_INBOX.{i}" if i % 3 == 0 else None
        out.append(
            RecordedMessage(
                T0 + i * 1000, f"fp.v1.s{i % subjects}", bytes([i % 256]) * (i % 7), reply, headers
            )
        )
    return out  # fmt: skip


def write(
    out: Path, rows: list[RecordedMessage], clock: FakeClock | None = None, **kw: object
) -> RecordingWriter:
    w = RecordingWriter(WriterConfig(out, **kw), clock or FakeClock())  # type: ignore[arg-type]
    for m in rows:
        w.append(m.recv_us, m.subject, m.payload, m.reply, m.headers)
    return w


def read_quiet(path: Path) -> tuple[int, list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        n = sum(b.num_rows for b in iter_file_batches(path))
    return n, caught


def message_offsets(data: bytes) -> list[tuple[int, int, str]]:
    """(offset, end, type) of each IPC message, walked with pyarrow (independent of _scan)."""
    out, o = [], 0
    while o + 8 <= len(data):
        _, length = struct.unpack_from("<Ii", data, o)
        if length == 0:
            break
        msg = pa.ipc.read_message(pa.py_buffer(data[o:]))
        end = o + 8 + length + (msg.body.size if msg.body is not None else 0)
        out.append((o, end, msg.type))
        o = end
    return out


# -- writing ---------------------------------------------------------------------------------


def test_round_trip_keeps_every_field_and_the_order(tmp_path: Path) -> None:
    rows = msgs(50)
    w = write(tmp_path, rows, batch_rows=7)
    w.close()
    assert list(iter_messages(tmp_path)) == rows
    table = read_recording(tmp_path)
    assert table.schema.equals(RECORDING_SCHEMA, check_metadata=True)
    assert table.column("headers").to_pylist()[0] == [("Trace", "t0"), ("Trace", "again")]
    assert w.messages == 50 and len(w.files) == 1


def test_subject_dictionary_is_written_again_only_when_a_subject_is_new(tmp_path: Path) -> None:
    rows = [RecordedMessage(T0 + i, f"s.{min(i // 10, 2)}", b"x") for i in range(50)]
    w = write(tmp_path, rows, batch_rows=5)
    w.close()
    kinds = [kind for _, _, kind in message_offsets(w.files[0].read_bytes())]
    # the schema, then a dictionary before the 1st, 3rd and 5th batch (s.0, s.1, s.2 appear)
    assert kinds.count("dictionary") == 3
    assert kinds.count("record batch") == 10
    assert [m.subject for m in iter_messages(tmp_path)] == [r.subject for r in rows]


def test_zstd_compression_round_trips_and_shrinks(tmp_path: Path) -> None:
    rows = [RecordedMessage(T0 + i, "s", b"compressible " * 50) for i in range(200)]
    write(tmp_path / "plain", rows).close()
    write(tmp_path / "zstd", rows, compression="zstd").close()
    assert list(iter_messages(tmp_path / "zstd")) == rows
    plain = recording_files(tmp_path / "plain")[0].stat().st_size
    packed = recording_files(tmp_path / "zstd")[0].stat().st_size
    assert packed < plain / 5


def test_a_crash_loses_at_most_the_unflushed_batch(tmp_path: Path) -> None:
    clock = FakeClock()
    w = write(tmp_path, msgs(25), clock, batch_rows=10, flush_interval_s=1.0)
    # no close(): what a killed recorder leaves behind is readable, without a warning
    (path,) = w.files
    assert read_quiet(path) == (20, [])
    assert w.pending == 5
    clock.advance(0.5)
    w.tick()
    assert read_quiet(path)[0] == 20
    clock.advance(0.5)
    w.tick()
    assert read_quiet(path) == (25, [])


def test_rotation_by_size_splits_files_in_time_order(tmp_path: Path) -> None:
    rows = msgs(300)
    w = write(tmp_path, rows, batch_rows=20, rotate_bytes=4000)
    w.close()
    assert len(w.files) > 3
    assert recording_files(tmp_path) == sorted(w.files)
    assert list(iter_messages(tmp_path)) == rows
    for f in w.files:  # every closed file ends with the end-of-stream marker
        assert f.read_bytes().endswith(b"\xff\xff\xff\xff\x00\x00\x00\x00")


def test_rotation_by_time_and_idle_files_are_closed(tmp_path: Path) -> None:
    clock = FakeClock()
    cfg = WriterConfig(tmp_path, batch_rows=1000, rotate_s=60, flush_interval_s=100)
    w = RecordingWriter(cfg, clock)
    w.append(T0, "a.1", b"1")
    w.append(T0 + 1, "a.2", b"2")
    w.flush()
    clock.advance(30)
    w.append(T0 + 2, "a.3", b"3")  # buffered when the file reaches its age
    clock.advance(30)
    w.tick()  # closes the old file; the buffered row goes to the next one
    assert len(w.files) == 1 and w.pending == 1
    w.flush()
    assert len(w.files) == 2
    clock.advance(61)
    w.tick()  # idle past rotate_s: closed (with its end marker) although nothing arrived
    assert w.files[1].read_bytes().endswith(b"\xff\xff\xff\xff\x00\x00\x00\x00")
    assert [m.subject for m in iter_messages(tmp_path)] == ["a.1", "a.2", "a.3"]


def test_too_many_subjects_rotate_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "MAX_SUBJECTS_PER_FILE", 3)
    rows = [RecordedMessage(T0 + i, f"inbox.{i}", b"") for i in range(8)]
    w = write(tmp_path, rows, batch_rows=100)
    w.close()
    assert len(w.files) == 3
    assert list(iter_messages(tmp_path)) == rows


def test_a_write_failure_is_a_recording_error_and_keeps_the_rows(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the output directory should be")
    w = RecordingWriter(WriterConfig(blocked), FakeClock())
    w.append(T0, "s", b"x")
    with pytest.raises(RecordingError, match="cannot write") as exc:
        w.flush()
    assert exc.value.path == str(blocked)
    assert w.pending == 1 and w.messages == 0


def test_writer_config_is_validated(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        WriterConfig(tmp_path, batch_rows=0)
    with pytest.raises(UsageError):
        WriterConfig(tmp_path, rotate_s=float("nan"))
    with pytest.raises(UsageError):
        WriterConfig(tmp_path, compression="lz5")  # type: ignore[arg-type]


# -- truncated and corrupt files -------------------------------------------------------------


def test_a_truncated_file_reads_up_to_its_last_complete_batch_at_every_cut(tmp_path: Path) -> None:
    w = write(tmp_path, msgs(12), batch_rows=4)
    w.close()
    data = w.files[0].read_bytes()
    frames = message_offsets(data)
    assert [k for _, _, k in frames].count("record batch") == 3
    boundaries = sorted({0, len(data), *(end for _, end, _ in frames)})
    cut_path = tmp_path / "cut" / "f.arrows"
    cut_path.parent.mkdir()
    for cut in range(len(data) + 1):
        cut_path.write_bytes(data[:cut])
        n, caught = read_quiet(cut_path)
        assert n == 4 * sum(1 for _, end, k in frames if k == "record batch" and end <= cut), cut
        # a warning exactly when bytes are dropped: not at a message boundary, and not a mere
        # partial end-of-stream marker (which loses nothing)
        last = max(b for b in boundaries if b <= cut)
        dropped = cut != last and not b"\xff\xff\xff\xff\x00\x00\x00\x00".startswith(data[last:cut])
        assert (len(caught) == 1) == dropped, cut
        if caught:
            assert issubclass(caught[0].category, TruncatedRecordingWarning)
            assert str(cut_path) in str(caught[0].message)


def test_corrupt_framing_names_the_file_and_the_offset(tmp_path: Path) -> None:
    w = write(tmp_path, msgs(12), batch_rows=4)
    w.close()
    (path,) = w.files
    data = bytearray(path.read_bytes())
    offset, _, kind = message_offsets(bytes(data))[3]
    assert kind == "record batch"  # the second one
    data[offset : offset + 4] = b"\x00\x01\x02\x03"
    path.write_bytes(bytes(data))
    with pytest.raises(RecordingError) as exc:
        list(iter_file_batches(path))
    assert exc.value.offset == offset
    assert str(path) in str(exc.value) and f"offset {offset}" in str(exc.value)
    assert "continuation marker" in str(exc.value)


def test_impossible_lengths_are_corruption_not_truncation(tmp_path: Path) -> None:
    w = write(tmp_path, msgs(8), batch_rows=4)
    w.close()
    (path,) = w.files
    data = bytearray(path.read_bytes())
    offset, _, _ = message_offsets(bytes(data))[2]
    data[offset + 4 : offset + 8] = struct.pack("<i", 1 << 30)  # 1 GiB of metadata
    path.write_bytes(bytes(data))
    with pytest.raises(RecordingError, match="impossible IPC metadata length") as exc:
        list(iter_file_batches(path))
    assert exc.value.offset == offset


def test_a_batch_pyarrow_rejects_is_corruption(tmp_path: Path) -> None:
    w = write(tmp_path, msgs(12), batch_rows=4)
    w.close()
    (path,) = w.files
    data = bytearray(path.read_bytes())
    offset, end, kind = message_offsets(bytes(data))[3]
    assert kind == "record batch"
    (meta_len,) = struct.unpack_from("<i", data, offset + 4)
    data[offset + 8 + meta_len : end] = b"\xff" * (end - offset - 8 - meta_len)
    path.write_bytes(bytes(data))
    with pytest.raises(RecordingError, match="corrupt record batch 1") as exc:
        list(iter_file_batches(path))
    assert exc.value.offset == offset


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"PAR1 this is parquet, or anything else", "not an Arrow IPC stream"),
        (b"ARROW1\x00\x00 the random-access file format", "IPC \\*file\\*"),
    ],
)
def test_files_that_are_not_streams_are_refused(tmp_path: Path, content: bytes, match: str) -> None:
    path = tmp_path / "x.arrows"
    path.write_bytes(content)
    with pytest.raises(RecordingError, match=match):
        list(iter_file_batches(path))


def _stream(path: Path, schema: pa.Schema, batch: pa.RecordBatch | None = None) -> None:
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as w:
        if batch is not None:
            w.write_batch(batch)


def test_another_schema_version_is_refused_clearly(tmp_path: Path) -> None:
    path = tmp_path / "v2.arrows"
    _stream(path, RECORDING_SCHEMA.with_metadata({RECORDING_VERSION_KEY: b"2"}))
    with pytest.raises(RecordingVersionError) as exc:
        list(iter_file_batches(path))
    assert "version '2'" in str(exc.value) and "reads version 1" in str(exc.value)
    assert str(path) in str(exc.value)


def test_a_stream_that_is_not_a_recording_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.arrows"
    _stream(path, pa.schema([pa.field("x", pa.int64())]))
    with pytest.raises(RecordingError, match="not a fleetpulse recording"):
        list(iter_file_batches(path))
    bad = pa.schema(
        [pa.field("recv_time", pa.int64()), *list(RECORDING_SCHEMA)[1:]],
        metadata=RECORDING_SCHEMA.metadata,
    )
    _stream(path, bad)
    with pytest.raises(RecordingError, match="schema is not recording version 1"):
        list(iter_file_batches(path))


def test_paths_that_hold_no_recording(tmp_path: Path) -> None:
    with pytest.raises(RecordingError, match="no such file"):
        recording_files(tmp_path / "missing")
    with pytest.raises(RecordingError, match=f"no \\{FILE_SUFFIX} recording files"):
        recording_files(tmp_path)
    (tmp_path / "empty.arrows").write_bytes(b"")
    assert read_recording(tmp_path).num_rows == 0


# -- the documented reader recipes (docs/recording.md) ---------------------------------------


def test_plain_pyarrow_reads_a_recording(tmp_path: Path) -> None:
    rows = msgs(30)
    w = write(tmp_path, rows, batch_rows=8, compression="zstd")
    w.close()
    with pa.OSFile(str(w.files[0])) as f, pa.ipc.open_stream(f) as reader:
        table = reader.read_all()
    assert table.num_rows == 30
    assert table.column("subject").to_pylist() == [r.subject for r in rows]
    assert table.schema.metadata[RECORDING_VERSION_KEY] == b"1"


def test_duckdb_queries_a_recording(tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb")  # in the `test` extra
    w = write(tmp_path, msgs(30), batch_rows=8)
    w.close()
    recording = read_recording(tmp_path)  # noqa: F841 - DuckDB finds the table by its name
    rows = duckdb.sql(
        "SELECT CAST(subject AS VARCHAR) AS s, count(*) AS n, sum(octet_length(payload)) AS b "
        "FROM recording GROUP BY s ORDER BY s"
    ).fetchall()
    assert [(s, n) for s, n, _ in rows] == [("fp.v1.s0", 10), ("fp.v1.s1", 10), ("fp.v1.s2", 10)]
    ((first,),) = duckdb.sql("SELECT min(recv_time) FROM recording").fetchall()
    assert first.timestamp() == T0 / 1e6


# -- replay helpers --------------------------------------------------------------------------


def test_subject_maps_carry_wildcard_tokens() -> None:
    maps = [SubjectMap.parse("fp.v1.report.*.shop.>=test.*.>"), SubjectMap.parse("a.b=c.d")]
    assert map_subject(maps, "fp.v1.report.handle.shop.api") == "test.handle.api"
    assert map_subject(maps, "a.b") == "c.d"
    assert map_subject(maps, "a.b.c") == "a.b.c"  # no map matches: unchanged
    for bad in ("a.*=b", "a.>=b.c", "nothing", "=b"):
        with pytest.raises(UsageError):
            SubjectMap.parse(bad)


def test_parse_time_accepts_iso_and_durations_ago() -> None:
    now = 1_714_550_400.0
    assert parse_time("2024-05-01T08:00:00Z", 0) == now
    assert parse_time("2024-05-01T08:00:00", 0) == now  # no zone: UTC
    assert parse_time("15m", now) == now - 900
    assert parse_time("1.5h", now) == now - 5400
    assert parse_time("now", now) == now
    with pytest.raises(UsageError, match="ISO 8601"):
        parse_time("yesterday", now)

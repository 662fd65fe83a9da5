"""Recording files: Arrow IPC *stream* files (schema `RECORDING_SCHEMA`), one row per message.

How it works. Writing: `RecordingWriter` buffers rows in Python lists and turns them into one
record batch at a time, written by pyarrow's stream writer straight to an unbuffered OS file.
Once `flush` returns, the batch is in the operating system's hands, so a crashed recorder loses
at most the rows buffered since (one batch: `batch_rows`, `batch_bytes` or `flush_interval_s`
of traffic, whichever comes first). The subject column is encoded against one dictionary per
file that only grows (subjects in first-seen order): pyarrow writes it again only when a subject
is new, as a dictionary replacement (which the stream format allows). A file rotates when it
reaches `rotate_bytes`, `rotate_s` or `MAX_SUBJECTS_PER_FILE`; closing writes the end-of-stream
marker. Files are named `{prefix}-{UTC start time}-{n}.arrows`, so name order is time order.

Reading: before pyarrow sees a byte, `_scan` walks the IPC framing (continuation marker,
metadata length, the Message flatbuffer's header type and bodyLength) to find where the last
complete message ends. A tail that stops inside a message is a partly written file: it is read
up to there with a `TruncatedRecordingWarning`. Framing that cannot be right (bad marker,
impossible lengths, an unparseable flatbuffer), or a batch that pyarrow rejects or that fails
full validation, is corruption: `RecordingError` naming the file and the byte offset. The schema
and its version metadata are checked before any batch is read; another version is refused.
"""

from __future__ import annotations

import math
import struct
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Literal

import numpy as np
import pyarrow as pa

from shared import settings
from shared.clock import SYSTEM_CLOCK, Clock
from shared.errors import FleetpulseError, UsageError
from shared.wire.arrow_schemas import RECORDING_SCHEMA, RECORDING_VERSION, RECORDING_VERSION_KEY

FILE_SUFFIX: Final = ".arrows"
"""The registered extension of the Arrow IPC stream format."""
DEFAULT_BATCH_ROWS: Final[int] = settings.RECORD_BATCH_ROWS.default
DEFAULT_BATCH_BYTES: Final = 1024 * 1024
DEFAULT_FLUSH_INTERVAL_S: Final[float] = settings.RECORD_FLUSH_INTERVAL.default
DEFAULT_ROTATE_BYTES: Final = int(settings.RECORD_ROTATE_MB.default * 1024 * 1024)
DEFAULT_ROTATE_S: Final[float] = settings.RECORD_ROTATE_S.default
MAX_SUBJECTS_PER_FILE: Final = 65536
"""Each new subject rewrites the file's dictionary; past this many (inbox subjects, say) the
file rotates rather than let every batch carry a huge dictionary."""

# Framing sanity limits: a real message never comes near them, so a larger declared length is
# corruption, not a truncated write.
MAX_METADATA_BYTES: Final = 64 * 1024 * 1024
MAX_BODY_BYTES: Final = 4 * 1024 * 1024 * 1024
_CONTINUATION: Final = 0xFFFFFFFF
_EOS: Final = b"\xff\xff\xff\xff\x00\x00\x00\x00"
_PREFIX_BYTES: Final = 8
_ALIGN: Final = 8
_SCHEMA, _DICTIONARY_BATCH, _RECORD_BATCH = 1, 2, 3
_MSG_HEADER_TYPE, _MSG_BODY_LENGTH = 1, 3
_ARROW_FILE_MAGIC: Final = b"ARROW1"

Compression = Literal["zstd"]
Headers = Sequence[tuple[str, str]]


class RecordingError(FleetpulseError):
    """A recording file cannot be read: not a recording, corrupt, or unreadable."""

    def __init__(self, path: str | Path, detail: str, offset: int | None = None) -> None:
        self.path = str(path)
        self.offset = offset
        self.detail = detail
        where = self.path if offset is None else f"{self.path} at byte offset {offset}"
        super().__init__(f"{where}: {detail}")


class RecordingVersionError(RecordingError):
    """A recording of another schema version than this fleetpulse reads."""


class TruncatedRecordingWarning(UserWarning):
    """A file ends inside a message (a recorder stopped mid-write): read up to its last batch."""


@dataclass(frozen=True, slots=True)
class RecordedMessage:
    recv_us: int
    """Receipt time, unix microseconds (UTC)."""
    subject: str
    payload: bytes
    reply: str | None = None
    headers: tuple[tuple[str, str], ...] | None = None


def wall_to_us(wall_s: float) -> int:
    return round(wall_s * 1e6)


# -- writing -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WriterConfig:
    out_dir: Path
    prefix: str = settings.RECORD_PREFIX.default
    batch_rows: int = DEFAULT_BATCH_ROWS
    batch_bytes: int = DEFAULT_BATCH_BYTES
    flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S
    rotate_bytes: int = DEFAULT_ROTATE_BYTES
    rotate_s: float = DEFAULT_ROTATE_S
    compression: Compression | None = None

    def __post_init__(self) -> None:
        if self.batch_rows < 1 or self.batch_bytes < 1 or self.rotate_bytes < 1:
            raise UsageError("batch_rows, batch_bytes and rotate_bytes must be >= 1")
        for name in ("flush_interval_s", "rotate_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise UsageError(f"{name} must be a positive number of seconds, not {value!r}")
        if self.compression not in (None, "zstd"):
            raise UsageError(f"compression must be 'zstd' or none, not {self.compression!r}")
        if not self.prefix or "/" in self.prefix:
            raise UsageError(f"file prefix must be a plain name, not {self.prefix!r}")


class RecordingWriter:
    """Appends rows, writes them in batches, rotates files (see the module docstring)."""

    def __init__(self, cfg: WriterConfig, clock: Clock = SYSTEM_CLOCK) -> None:
        self.cfg = cfg
        self._clock = clock
        self._options = pa.ipc.IpcWriteOptions(compression=cfg.compression)
        self.files: list[Path] = []
        self.messages = 0
        """Rows written to files (not counting those still buffered)."""
        self.bytes_closed = 0
        self._sink: pa.NativeFile | None = None
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        self._opened_at = 0.0
        self._subject_ids: dict[str, int] = {}
        self._subjects: list[str] = []
        self._dictionary: pa.Array = pa.array([], pa.utf8())
        self._dictionary_size = 0
        self._clear_buffer()

    def _clear_buffer(self) -> None:
        self._recv: list[int] = []
        self._subject_idx: list[int] = []
        self._reply: list[str | None] = []
        self._headers: list[Headers | None] = []
        self._payload: list[bytes] = []
        self._buffered_bytes = 0
        self._first_buffered_at = 0.0

    @property
    def pending(self) -> int:
        return len(self._recv)

    @property
    def bytes_written(self) -> int:
        """File bytes written so far, over every file of this writer."""
        return self.bytes_closed + (self._sink.tell() if self._sink is not None else 0)

    def append(
        self,
        recv_us: int,
        subject: str,
        payload: bytes,
        reply: str | None = None,
        headers: Headers | None = None,
    ) -> None:
        idx = self._subject_ids.get(subject)
        if idx is None:
            if len(self._subjects) >= MAX_SUBJECTS_PER_FILE:
                self.flush()
                self._close_file()
            idx = self._subject_ids[subject] = len(self._subjects)
            self._subjects.append(subject)
        if not self._recv:
            self._first_buffered_at = self._clock.monotonic()
        self._recv.append(recv_us)
        self._subject_idx.append(idx)
        self._reply.append(reply or None)
        self._headers.append(list(headers) if headers else None)
        self._payload.append(payload)
        self._buffered_bytes += len(payload)
        if len(self._recv) >= self.cfg.batch_rows or self._buffered_bytes >= self.cfg.batch_bytes:
            self.flush()

    def tick(self) -> None:
        """Call periodically: flushes a batch that waited `flush_interval_s`, and closes a file
        that reached its rotation age even when no message arrives."""
        now = self._clock.monotonic()
        if self._recv and now - self._first_buffered_at >= self.cfg.flush_interval_s:
            self.flush()
        if self._sink is not None and now - self._opened_at >= self.cfg.rotate_s:
            self._close_file()

    def flush(self) -> None:
        """Write the buffered rows as one record batch."""
        if not self._recv:
            return
        if (
            self._sink is not None
            and self._clock.monotonic() - self._opened_at >= self.cfg.rotate_s
        ):
            self._close_file()
        if len(self._subjects) != self._dictionary_size:
            self._dictionary = pa.array(self._subjects, pa.utf8())
            self._dictionary_size = len(self._subjects)
        subjects = pa.DictionaryArray.from_arrays(
            pa.array(self._subject_idx, pa.int32()), self._dictionary
        )
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(self._recv, RECORDING_SCHEMA.field("recv_time").type),
                subjects,
                pa.array(self._reply, pa.utf8()),
                pa.array(self._headers, RECORDING_SCHEMA.field("headers").type),
                pa.array(self._payload, pa.binary()),
            ],
            schema=RECORDING_SCHEMA,
        )
        try:
            (self._writer or self._open_file()).write_batch(batch)
        except (OSError, pa.ArrowException) as exc:
            # the rows stay buffered: a later flush retries them
            where = self.files[-1] if self._sink is not None else self.cfg.out_dir
            raise RecordingError(where, f"cannot write: {exc}") from exc
        self.messages += batch.num_rows
        self._clear_buffer()
        if self._sink is not None and self._sink.tell() >= self.cfg.rotate_bytes:
            self._close_file()

    def close(self) -> None:
        """Flush, then finish the current file with the end-of-stream marker."""
        self.flush()
        self._close_file()

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open_file(self) -> pa.ipc.RecordBatchStreamWriter:
        self.cfg.out_dir.mkdir(parents=True, exist_ok=True)
        stamp = datetime.fromtimestamp(self._clock.wall(), UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        path = self.cfg.out_dir / f"{self.cfg.prefix}-{stamp}-{len(self.files):04d}{FILE_SUFFIX}"
        if path.exists():
            raise UsageError(f"{path} already exists; refusing to overwrite a recording")
        self._sink = pa.OSFile(str(path), "wb")
        self._writer = pa.ipc.new_stream(self._sink, RECORDING_SCHEMA, options=self._options)
        self._opened_at = self._clock.monotonic()
        self.files.append(path)
        return self._writer

    def _close_file(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._sink is not None:
            self.bytes_closed += self._sink.tell()
            self._sink.close()
        self._writer = self._sink = None
        # A new file starts a new dictionary; rows still buffered keep their subjects.
        used = sorted(set(self._subject_idx))
        new_of = {old: new for new, old in enumerate(used)}
        self._subjects = [self._subjects[i] for i in used]
        self._subject_ids = {s: i for i, s in enumerate(self._subjects)}
        self._subject_idx = [new_of[i] for i in self._subject_idx]
        self._dictionary_size = -1


# -- reading -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Frame:
    offset: int
    kind: int
    end: int


@dataclass(frozen=True, slots=True)
class _Scan:
    frames: tuple[_Frame, ...]
    valid_end: int
    truncated_at: int | None
    """Offset of the message the file ends inside, if it does."""


def _u(fmt: str, fb: bytes, pos: int) -> int:
    # struct counts a negative offset from the end: a corrupt offset must not wrap around
    if pos < 0 or pos + struct.calcsize(fmt) > len(fb):
        raise ValueError(f"flatbuffer offset {pos} outside the {len(fb)}-byte metadata")
    value: int = struct.unpack_from(fmt, fb, pos)[0]
    return value


def _field(fb: bytes, table: int, index: int) -> int | None:
    """Position of field `index` of a flatbuffer table, None if absent."""
    vtable = table - _u("<i", fb, table)
    slot = 4 + 2 * index
    if slot + 2 > _u("<H", fb, vtable):
        return None
    offset = _u("<H", fb, vtable + slot)
    return table + offset if offset else None


def _message_header(fb: bytes) -> tuple[int, int]:
    """(header type, bodyLength) of one Arrow `Message` flatbuffer (format/Message.fbs)."""
    root = _u("<I", fb, 0)
    pos = _field(fb, root, _MSG_HEADER_TYPE)
    kind = _u("<B", fb, pos) if pos is not None else 0
    pos = _field(fb, root, _MSG_BODY_LENGTH)
    body = _u("<q", fb, pos) if pos is not None else 0
    return kind, body


def _scan(data: bytes, path: Path) -> _Scan:
    """Walk the IPC stream framing; raise RecordingError where it cannot be right."""
    if data.startswith(_ARROW_FILE_MAGIC):
        raise RecordingError(
            path, "an Arrow IPC *file* (random-access format); recordings are IPC streams", 0
        )
    size = len(data)
    frames: list[_Frame] = []
    o = 0
    while True:
        rest = data[o : o + _PREFIX_BYTES]
        if len(rest) < _PREFIX_BYTES:
            # a clean end, or a partial end-of-stream marker: no data lost either way
            partial = None if _EOS.startswith(rest) else o
            return _Scan(tuple(frames), o, partial)
        marker, length = struct.unpack_from("<Ii", data, o)
        if marker != _CONTINUATION:
            what = "not an Arrow IPC stream" if o == 0 else "no IPC continuation marker"
            raise RecordingError(path, f"{what} (found {data[o : o + 4].hex()})", o)
        if length == 0:
            return _Scan(tuple(frames), o, None)
        if length < 0 or length > MAX_METADATA_BYTES or length % _ALIGN:
            raise RecordingError(path, f"impossible IPC metadata length {length}", o)
        meta_end = o + _PREFIX_BYTES + length
        if meta_end > size:
            return _Scan(tuple(frames), o, o)
        try:
            kind, body = _message_header(data[o + _PREFIX_BYTES : meta_end])
        except (ValueError, struct.error) as exc:
            raise RecordingError(path, f"unreadable IPC message metadata: {exc}", o) from None
        if kind not in (_SCHEMA, _DICTIONARY_BATCH, _RECORD_BATCH):
            raise RecordingError(path, f"unknown IPC message type {kind}", o)
        if (kind == _SCHEMA) != (not frames):
            what = "does not start with a schema" if not frames else "has a second schema"
            raise RecordingError(path, f"the IPC stream {what}", o)
        if body < 0 or body > MAX_BODY_BYTES or body % _ALIGN:
            raise RecordingError(path, f"impossible IPC body length {body}", o)
        end = meta_end + body
        if end > size:
            return _Scan(tuple(frames), o, o)
        frames.append(_Frame(o, kind, end))
        o = end


def _check_schema(schema: pa.Schema, path: Path) -> None:
    version = (schema.metadata or {}).get(RECORDING_VERSION_KEY)
    if version is None:
        raise RecordingError(
            path,
            f"not a fleetpulse recording: its schema has no {RECORDING_VERSION_KEY.decode()!r} "
            "metadata",
            0,
        )
    if version != RECORDING_VERSION.encode():
        raise RecordingVersionError(
            path,
            f"a version {version.decode(errors='replace')!r} recording; this fleetpulse reads "
            f"version {RECORDING_VERSION} only (read it with the release that wrote it)",
            0,
        )
    expected = [(f.name, f.type) for f in RECORDING_SCHEMA]
    found = [(f.name, f.type) for f in schema]
    if found != expected:
        want = ", ".join(f"{n}: {t}" for n, t in expected)
        got = ", ".join(f"{n}: {t}" for n, t in found)
        raise RecordingError(
            path,
            f"schema is not recording version {RECORDING_VERSION}: want ({want}), got ({got})",
            0,
        )


_REQUIRED = ("recv_time", "subject", "payload")


def iter_file_batches(path: str | Path) -> Iterator[pa.RecordBatch]:
    """The record batches of one file, validated, with the canonical schema. Warns
    (`TruncatedRecordingWarning`) and stops early on a truncated tail; raises `RecordingError`
    on corruption and `RecordingVersionError` on another schema version."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RecordingError(path, f"cannot read: {exc.strerror or exc}") from None
    scan = _scan(data, path)
    batch_frames = [f for f in scan.frames if f.kind == _RECORD_BATCH]
    if scan.truncated_at is not None:
        warnings.warn(
            TruncatedRecordingWarning(
                f"{path}: ends inside the IPC message at byte offset {scan.truncated_at} "
                f"({len(data) - scan.truncated_at} bytes dropped); reading the "
                f"{len(batch_frames)} complete batches before it"
            ),
            stacklevel=2,
        )
    if not scan.frames:
        return
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(data).slice(0, scan.valid_end))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise RecordingError(path, f"unreadable schema: {exc}", 0) from None
    _check_schema(reader.schema, path)
    start = scan.frames[0].end
    for i, frame in enumerate(batch_frames):
        try:
            batch = reader.read_next_batch()
            batch.validate(full=True)
        except (pa.ArrowException, OSError, ValueError, StopIteration) as exc:
            detail = f"corrupt record batch {i}: {type(exc).__name__}: {str(exc)[:300]}"
            raise RecordingError(path, detail, start) from None
        for name in _REQUIRED:
            if batch.column(name).null_count:
                raise RecordingError(path, f"record batch {i}: nulls in {name!r}", start)
        start = frame.end
        yield pa.RecordBatch.from_arrays(batch.columns, schema=RECORDING_SCHEMA)


def recording_files(path: str | Path) -> list[Path]:
    """A file, or the `*.arrows` files of a directory in name (= time) order."""
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix == FILE_SUFFIX and f.is_file())
        if not files:
            raise RecordingError(p, f"no {FILE_SUFFIX} recording files in this directory")
        return files
    if not p.is_file():
        raise RecordingError(p, "no such file or directory")
    return [p]


def iter_batches(path: str | Path) -> Iterator[pa.RecordBatch]:
    for f in recording_files(path):
        yield from iter_file_batches(f)


def read_recording(path: str | Path) -> pa.Table:
    """Every row of a file or directory as one table (schema `RECORDING_SCHEMA`)."""
    return pa.Table.from_batches(list(iter_batches(path)), schema=RECORDING_SCHEMA)


def batch_messages(batch: pa.RecordBatch) -> list[RecordedMessage]:
    """One batch's rows as Python objects (replay's per-message path)."""
    recv = np.asarray(batch.column(0).cast(pa.int64()).to_numpy(zero_copy_only=False))
    col = batch.column(1)
    names = col.dictionary.to_pylist()
    idx = np.asarray(col.indices.to_numpy(zero_copy_only=False)).tolist()
    replies = batch.column(2).to_pylist()
    headers = batch.column(3).to_pylist()
    payloads = batch.column(4).to_pylist()
    return [
        RecordedMessage(
            int(t), names[i], p, r, None if h is None else tuple((k, v or "") for k, v in h)
        )
        for t, i, p, r, h in zip(recv.tolist(), idx, payloads, replies, headers, strict=True)
    ]


def iter_messages(path: str | Path) -> Iterator[RecordedMessage]:
    for batch in iter_batches(path):
        yield from batch_messages(batch)

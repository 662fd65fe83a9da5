"""Columnar handle reports (FPC1): wide HandleReports as one Arrow record batch.

How it works. Wire form: b"FPC1", then an Arrow IPC stream with one schema (report-level fields
in its metadata), one dictionary batch for replica_id and one record batch, uncompressed. One row
per replica. A report too big for the server's max_payload is split into parts by rows; every
part repeats all report-level fields (so each part is self-contained and merges on its own) and
carries its own compact replica_id dictionary.

Encode builds the whole batch once, writes it, and if it is too big estimates bytes per row from
that write, slices into parts aimed at 95% of the limit, writes them, and halves any part that
still does not fit (repeat until all fit). Decode checks size and magic, walks the IPC messages
without materialising them (`_ipc_guard`), checks the schema, then reads the batch and validates
it with vectorised checks (`_columnar_check`). Accessors hand out numpy views; nothing on the
decode path loops over rows in Python.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shared import settings
from shared.errors import UsageError, WireError
from shared.wire import reasons
from shared.wire._columnar_check import (
    FIXED_NAMES,
    ReportMeta,
    check_custom_name,
    check_schema,
    check_values,
    encode_meta,
    parse_meta,
    validate_meta,
)
from shared.wire._ipc_guard import check_stream_shape
from shared.wire.arrow_schemas import (
    CUSTOM_COLUMN_PREFIX,
    HANDLE_REPORT_FIXED_FIELDS,
    handle_report_schema,
)
from shared.wire.limits import (
    COLUMNAR_SPLIT_MARGIN,
    DEFAULT_MAX_PAYLOAD,
    MAX_CUSTOM_METRICS,
    MAX_MESSAGE_BYTES,
    MAX_PARTS,
)
from shared.wire.messages import HandleReport, HealthStatus, RequestStats

COLUMNAR_MAGIC: Final = b"FPC1"
DEFAULT_COLUMNAR_MIN_REPLICAS: Final[int] = settings.COLUMNAR_MIN_REPLICAS.default
"""Reports covering at least this many replicas go columnar (services read the env override
FLEETPULSE_COLUMNAR_MIN_REPLICAS in their config). The power of two above the controller-ingest
crossover `python -m scripts.bench.ingest` measures (64-96 replicas in three runs, where
columnar is 0.77-1.04x the object path at 64, too close to call; 1.8-2.0x at 128)."""

ArrayInput: TypeAlias = np.ndarray | pa.Array | Sequence[Any]


@dataclass(frozen=True, slots=True)
class ColumnarHandleReport:
    """One decoded FPC1 part. `batch` holds the five fixed columns, then `custom.<name>`."""

    handle_id: str
    app: str
    deployment: str
    sent_at: float
    seq: int
    queued_requests: float
    membership_epoch: int
    part: int
    parts: int
    batch: pa.RecordBatch
    stats: RequestStats | None = None
    """Optional request counters (`HandleReport.stats`); the same in every part."""
    _held: tuple[pa.RecordBatch, list[pa.Array]] | None = field(
        default=None, repr=False, compare=False
    )
    """`batch` with its columns, as the decoder already has them (each `batch.column(i)` makes
    a new wrapper, a fixed cost every narrow report paid again in the store); ignored unless it
    holds this very `batch`, so a report built from another's fields cannot read stale columns."""

    @property
    def columns(self) -> list[pa.Array]:
        """`batch.columns`, made once per report."""
        held = self._held
        if held is None or held[0] is not self.batch:
            held = (self.batch, self.batch.columns)
            object.__setattr__(self, "_held", held)
        return held[1]

    @property
    def num_rows(self) -> int:
        return int(self.batch.num_rows)

    @property
    def replica_ids(self) -> pa.DictionaryArray:
        return self.columns[0]

    @property
    def replica_dictionary(self) -> pa.StringArray:
        return self.replica_ids.dictionary

    @property
    def replica_indices(self) -> np.ndarray:
        """int32 row -> index into `replica_dictionary`."""
        return np.asarray(self.replica_ids.indices.to_numpy(zero_copy_only=False))

    def replica_id_list(self) -> list[str]:
        """Per-row replica ids as Python strings (tests and the object path, not the hot path)."""
        return list(self.replica_ids.dictionary.take(self.replica_ids.indices).to_pylist())

    @property
    def running(self) -> np.ndarray:
        return np.asarray(self.columns[1].to_numpy(zero_copy_only=False))

    @property
    def health_valid(self) -> np.ndarray:
        """bool mask: rows that carry health (the three health columns share it)."""
        return np.asarray(pc.is_valid(self.columns[2]).to_numpy(zero_copy_only=False))

    @property
    def health_healthy(self) -> np.ndarray:
        """bool; False where `health_valid` is False."""
        col = pc.fill_null(self.columns[2], False)
        return np.asarray(col.to_numpy(zero_copy_only=False))

    @property
    def health_checked_at(self) -> np.ndarray:
        """float64; NaN where `health_valid` is False."""
        return np.asarray(self.columns[3].to_numpy(zero_copy_only=False), dtype=np.float64)

    @property
    def health_failures(self) -> np.ndarray:
        """int32; 0 where `health_valid` is False."""
        col = pc.fill_null(self.columns[4], 0)
        return np.asarray(col.to_numpy(zero_copy_only=False))

    @property
    def custom_names(self) -> tuple[str, ...]:
        if len(self.columns) == len(FIXED_NAMES):
            return ()
        prefix = len(CUSTOM_COLUMN_PREFIX)
        return tuple(n[prefix:] for n in self.batch.schema.names[len(FIXED_NAMES) :])

    def custom(self, name: str) -> np.ndarray:
        """float64 values of `custom.<name>`; NaN where a replica has no value (NaN is never
        valid on the wire, so it is unambiguous). KeyError if the report has no such metric."""
        i = self.batch.schema.get_field_index(CUSTOM_COLUMN_PREFIX + name)
        if i < 0:
            raise KeyError(name)
        col = self.columns[i]
        return np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float64)


def detect_format(data: bytes) -> Literal["columnar", "msgpack"]:
    """O(1): a msgpack message is a map, whose first byte can never be b"F" (0x46)."""
    return "columnar" if data[:4] == COLUMNAR_MAGIC else "msgpack"


# ---------------------------------------------------------------------------------------------
# encode


def _replica_strings(replica_ids: ArrayInput) -> pa.Array:
    try:
        if isinstance(replica_ids, pa.ChunkedArray):
            replica_ids = replica_ids.combine_chunks()
        if isinstance(replica_ids, pa.Array):
            arr = replica_ids
            if pa.types.is_dictionary(arr.type):
                arr = arr.dictionary_decode()
            arr = arr.cast(pa.utf8())
        else:
            values = replica_ids if isinstance(replica_ids, np.ndarray) else list(replica_ids)
            arr = pa.array(values, type=pa.utf8())
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise UsageError(f"replica_ids: cannot convert to utf8: {exc}") from exc
    if arr.null_count:
        raise UsageError("replica_ids must not contain nulls")
    return arr


def _column(
    x: ArrayInput, n: int, typ: pa.DataType, name: str, mask: np.ndarray | None
) -> pa.Array:
    if isinstance(x, pa.ChunkedArray):
        x = x.combine_chunks()
    try:
        # Arrow's conversions are checked (no silent int32 wrap-around, no float truncation).
        if isinstance(x, pa.Array):
            arr = x.cast(typ)
        else:
            arr = pa.array(np.asarray(x), type=typ, mask=None if mask is None else ~mask)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise UsageError(f"{name}: cannot convert to {typ}: {exc}") from exc
    if len(arr) != n:
        raise UsageError(f"{name} has {len(arr)} rows, replica_ids has {n}")
    return arr


def _custom_column(name: str, x: ArrayInput, n: int) -> pa.Array:
    try:
        check_custom_name(name)
    except WireError as exc:
        raise UsageError(f"custom metric {name[:80]!r}: {exc.detail}") from None
    if isinstance(x, pa.Array | pa.ChunkedArray):
        return _column(x, n, pa.float64(), CUSTOM_COLUMN_PREFIX + name, None)
    values = np.asarray(x, dtype=np.float64)
    # NaN in the input means "no value for this replica", mirroring ColumnarHandleReport.custom.
    return _column(values, n, pa.float64(), CUSTOM_COLUMN_PREFIX + name, ~np.isnan(values))


def _build_columns(
    replica_ids: ArrayInput,
    running: ArrayInput,
    health: tuple[ArrayInput | None, ArrayInput | None, ArrayInput | None],
    health_valid: np.ndarray | None,
    custom: Mapping[str, ArrayInput] | None,
) -> tuple[pa.Array, list[pa.Array], tuple[str, ...]]:
    ids = _replica_strings(replica_ids)
    n = len(ids)
    cols = [_column(running, n, pa.float64(), "running", None)]
    given = [h is not None for h in health]
    if any(given) and not all(given):
        raise UsageError("give all of health_healthy/health_checked_at/health_failures or none")
    mask = None if health_valid is None else np.asarray(health_valid, dtype=bool)
    for fld, h in zip(HANDLE_REPORT_FIXED_FIELDS[2:], health, strict=True):
        cols.append(pa.nulls(n, fld.type) if h is None else _column(h, n, fld.type, fld.name, mask))
    names = tuple(custom or ())
    if len(names) > MAX_CUSTOM_METRICS:
        raise UsageError(f"{len(names)} custom metrics > MAX_CUSTOM_METRICS={MAX_CUSTOM_METRICS}")
    cols.extend(_custom_column(name, (custom or {})[name], n) for name in names)
    return ids, cols, names


def _write(schema: pa.Schema, ids: pa.Array, cols: list[pa.Array], start: int, stop: int) -> bytes:
    k = stop - start
    # A fresh identity dictionary per part keeps every part's dictionary to its own rows.
    rid = pa.DictionaryArray.from_arrays(
        pa.array(np.arange(k, dtype=np.int32)), ids.slice(start, k)
    )
    batch = pa.RecordBatch.from_arrays([rid, *(c.slice(start, k) for c in cols)], schema=schema)
    sink = pa.BufferOutputStream()
    sink.write(COLUMNAR_MAGIC)
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def _split_ranges(
    start: int, stop: int, size: int, overhead: int, max_payload: int
) -> list[tuple[int, int]]:
    rows = stop - start
    if rows <= 1:
        raise UsageError(
            f"a part with {rows} replica row(s) needs {size} bytes, over max_payload={max_payload}"
        )
    per_row = max(1.0, (size - overhead) / rows)
    step = int((max_payload * COLUMNAR_SPLIT_MARGIN - overhead) / per_row)
    step = max(1, min(step, (rows + 1) // 2))
    return [(a, min(a + step, stop)) for a in range(start, stop, step)]


def encode_handle_report_columnar(
    *,
    handle_id: str,
    app: str,
    deployment: str,
    sent_at: float,
    seq: int,
    queued_requests: float,
    membership_epoch: int,
    replica_ids: ArrayInput,
    running: ArrayInput,
    health_healthy: ArrayInput | None = None,
    health_checked_at: ArrayInput | None = None,
    health_failures: ArrayInput | None = None,
    health_valid: np.ndarray | None = None,
    custom: Mapping[str, ArrayInput] | None = None,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
    stats: RequestStats | None = None,
) -> list[bytes]:
    """Encode one report as FPC1 parts, each at most `max_payload` bytes.

    Health inputs are all given or all None (every row null). numpy health inputs are valid on
    every row unless `health_valid` masks them; Arrow arrays bring their own nulls. In `custom`
    numpy arrays, NaN means "no value for this replica". Raises `UsageError` on bad input
    (lengths, NaN/inf/negative counts, duplicate replica ids, a row that cannot fit)."""
    ids, cols, names = _build_columns(
        replica_ids,
        running,
        (health_healthy, health_checked_at, health_failures),
        health_valid,
        custom,
    )
    meta = ReportMeta(
        handle_id, app, deployment, float(sent_at), int(seq), float(queued_requests),
        int(membership_epoch), 0, 1, stats,
    )  # fmt: skip
    schema = handle_report_schema(names)
    try:
        validate_meta(meta)
        rid = pa.DictionaryArray.from_arrays(pa.array(np.arange(len(ids), dtype=np.int32)), ids)
        check_values(pa.RecordBatch.from_arrays([rid, *cols], schema=schema))
    except WireError as exc:
        raise UsageError(f"columnar report would not decode: {exc}") from exc
    if max_payload > MAX_MESSAGE_BYTES:
        max_payload = MAX_MESSAGE_BYTES
    ranges = [(0, len(ids))]
    overhead: int | None = None
    while True:
        if len(ranges) > MAX_PARTS:
            raise UsageError(f"report needs more than MAX_PARTS={MAX_PARTS} parts")
        parts = []
        for part, (a, b) in enumerate(ranges):
            part_meta = dataclasses.replace(meta, part=part, parts=len(ranges))
            parts.append(_write(schema.with_metadata(encode_meta(part_meta)), ids, cols, a, b))
        if all(len(p) <= max_payload for p in parts):
            return parts
        if overhead is None:
            # from a one-row part: pyarrow writes a zero-length slice with some of its parent's
            # buffers whole (263 KB of 65,536 rows), which once split reports into 1-row parts
            one = min(1, len(ids))
            overhead = len(_write(schema.with_metadata(encode_meta(meta)), ids, cols, 0, one))
        new_ranges: list[tuple[int, int]] = []
        for (a, b), data in zip(ranges, parts, strict=True):
            if len(data) <= max_payload:
                new_ranges.append((a, b))
            else:
                new_ranges.extend(_split_ranges(a, b, len(data), overhead, max_payload))
        ranges = new_ranges


def _meta_dict(m: ReportMeta) -> dict[str, Any]:
    return {name: getattr(m, name) for name in ReportMeta.__slots__}


# ---------------------------------------------------------------------------------------------
# decode


def decode_handle_report_columnar(data: bytes) -> ColumnarHandleReport:
    """Decode and validate one FPC1 part. Raises only `WireError`."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireError(reasons.NOT_BYTES, f"payload is {type(data).__name__}, not bytes")
    size = memoryview(data).nbytes
    if size > MAX_MESSAGE_BYTES:
        raise WireError(reasons.OVERSIZE, f"{size} bytes > MAX_MESSAGE_BYTES={MAX_MESSAGE_BYTES}")
    if bytes(data[:4]) != COLUMNAR_MAGIC:
        raise WireError(reasons.BAD_MAGIC, f"payload starts with {bytes(data[:4])!r}, not b'FPC1'")
    try:
        buf = pa.py_buffer(data).slice(len(COLUMNAR_MAGIC))
        check_stream_shape(buf)
        with pa.ipc.open_stream(buf) as reader:
            # The shape check passed, so the reader's schema is the one read_schema would give.
            schema = reader.schema
            keep, _ = check_schema(schema)
            meta = parse_meta(schema.metadata)
            batch = reader.read_next_batch()
        batch.validate(full=True)
        if keep != list(range(batch.num_columns)):  # unknown or reordered columns
            batch = batch.select(keep)
        columns = batch.columns
        check_values(batch, (meta.handle_id, meta.part), columns)
    except WireError:
        raise
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, struct.error, ...
        raise WireError(
            reasons.MALFORMED, f"arrow: {type(exc).__name__}: {str(exc)[:200]}"
        ) from None
    batch = batch.replace_schema_metadata(None)  # the same column arrays
    return ColumnarHandleReport(batch=batch, **_meta_dict(meta), _held=(batch, columns))


# ---------------------------------------------------------------------------------------------
# object path <-> columnar (tests, vectors and narrow paths; per-row Python is fine here)


def handle_report_to_columnar(
    report: HandleReport, max_payload: int = DEFAULT_MAX_PAYLOAD
) -> list[bytes]:
    """Encode an object-path report as FPC1 parts.

    Rows are the replicas of `running` in order, then replicas known only from `health` or
    `custom` (their running value is 0.0: this handle has nothing in flight there). Raises
    `UsageError` if `health` names a replica twice (a row holds one health)."""
    ids = list(report.running)
    known = set(ids)
    by_replica: dict[str, HealthStatus] = {}
    for h in report.health:
        if h.replica_id in by_replica:
            raise UsageError(f"health lists replica {h.replica_id!r} twice")
        by_replica[h.replica_id] = h
    for rid in [*by_replica, *(r for per in report.custom.values() for r in per)]:
        if rid not in known:
            known.add(rid)
            ids.append(rid)
    present = [by_replica.get(r) for r in ids]
    n = len(ids)
    return encode_handle_report_columnar(
        handle_id=report.handle_id,
        app=report.app,
        deployment=report.deployment,
        sent_at=report.sent_at,
        seq=report.seq,
        queued_requests=report.queued_requests,
        membership_epoch=report.membership_epoch,
        replica_ids=ids,
        running=np.fromiter((report.running.get(r, 0.0) for r in ids), np.float64, n),
        health_healthy=np.fromiter((h is not None and h.healthy for h in present), bool, n),
        health_checked_at=np.fromiter((h.checked_at if h else 0.0 for h in present), np.float64, n),
        health_failures=np.fromiter(
            (h.consecutive_failures if h else 0 for h in present), np.int64, n
        ),
        health_valid=np.fromiter((h is not None for h in present), bool, n),
        custom={
            name: np.fromiter((per.get(r, np.nan) for r in ids), np.float64, n)
            for name, per in report.custom.items()
        },
        max_payload=max_payload,
        stats=report.stats,
    )


def columnar_to_handle_report(c: ColumnarHandleReport) -> HandleReport:
    """The object-path view of one part (its rows only)."""
    return columnar_parts_to_handle_report([c])


def columnar_parts_to_handle_report(parts: Sequence[ColumnarHandleReport]) -> HandleReport:
    """Reference merge of parts of one report: rows are disjoint, report-level fields equal.
    Raises `UsageError` if the parts do not belong together."""
    if not parts:
        raise UsageError("no parts to merge")
    first = parts[0]
    key = (first.handle_id, first.app, first.deployment, first.sent_at, first.seq)
    running: dict[str, float] = {}
    health: list[HealthStatus] = []
    custom: dict[str, dict[str, float]] = {}
    for c in parts:
        if (c.handle_id, c.app, c.deployment, c.sent_at, c.seq) != key:
            raise UsageError(f"part {c.part} belongs to another report")
        ids = c.replica_id_list()
        running.update(zip(ids, c.running.tolist(), strict=True))
        healthy, checked = c.health_healthy.tolist(), c.health_checked_at.tolist()
        failures = c.health_failures.tolist()
        for i in np.flatnonzero(c.health_valid).tolist():
            health.append(HealthStatus(ids[i], healthy[i], checked[i], failures[i]))
        for name in c.custom_names:
            values = c.custom(name)
            per = custom.setdefault(name, {})
            for i in np.flatnonzero(~np.isnan(values)).tolist():
                per[ids[i]] = float(values[i])
    return HandleReport(
        handle_id=first.handle_id,
        app=first.app,
        deployment=first.deployment,
        sent_at=first.sent_at,
        seq=first.seq,
        queued_requests=first.queued_requests,
        running=running,
        health=tuple(health),
        membership_epoch=first.membership_epoch,
        custom=custom,
        stats=first.stats,
    )

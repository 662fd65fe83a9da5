"""Validation shared by the columnar encoder and decoder: metadata codec, schema, values.

Every check is vectorised (numpy / pyarrow compute), so validating a 16K-row part costs a few
passes over contiguous buffers and no per-row Python. The encoder runs the same checks and turns
a `WireError` into a `UsageError`, so what one side writes the other side accepts.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shared.errors import WireError
from shared.wire import reasons
from shared.wire.arrow_schemas import (
    CUSTOM_COLUMN_PREFIX,
    CUSTOM_COLUMN_TYPE,
    HANDLE_REPORT_FIXED_FIELDS,
)
from shared.wire.codec import decode_stats, stats_map
from shared.wire.limits import (
    MAX_COLUMNS,
    MAX_CUSTOM_NAME_LEN,
    MAX_METADATA_VALUE_LEN,
    MAX_PARTS,
    MAX_UINT64,
)
from shared.wire.messages import RequestStats

FIXED_NAMES = tuple(fld.name for fld in HANDLE_REPORT_FIXED_FIELDS)
_UINT_RE = re.compile(r"[0-9]{1,20}")
# JSON number grammar: what repr(float), Go's strconv 'g' and JS's String(number) all produce.
_FLOAT_RE = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


@dataclass(frozen=True, slots=True)
class ReportMeta:
    """Report-level fields of one FPC1 part (schema metadata)."""

    handle_id: str
    app: str
    deployment: str
    sent_at: float
    seq: int
    queued_requests: float
    membership_epoch: int
    part: int
    parts: int
    stats: RequestStats | None = None
    """Optional (`HandleReport.stats`), as the JSON text of its wire map; every part the same."""


def _bad(reason: str, detail: str) -> WireError:
    return WireError(reason, detail)


def encode_meta(m: ReportMeta) -> dict[bytes, bytes]:
    return {
        b"handle_id": m.handle_id.encode(),
        b"app": m.app.encode(),
        b"deployment": m.deployment.encode(),
        b"sent_at": repr(float(m.sent_at)).encode(),
        b"seq": str(m.seq).encode(),
        b"queued_requests": repr(float(m.queued_requests)).encode(),
        b"membership_epoch": str(m.membership_epoch).encode(),
        b"part": str(m.part).encode(),
        b"parts": str(m.parts).encode(),
        **({} if m.stats is None else {b"stats": _json(stats_map(m.stats))}),
    }


def _json(doc: object) -> bytes:
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


def _stats(meta: Mapping[bytes, bytes]) -> RequestStats | None:
    if b"stats" not in meta:
        return None
    try:
        doc = json.loads(_raw(meta, "stats"))
    except ValueError:
        raise _bad(reasons.MALFORMED, "columnar metadata 'stats' is not JSON") from None
    return decode_stats(doc, "columnar")


def _raw(meta: Mapping[bytes, bytes], key: str) -> str:
    raw = meta.get(key.encode())
    if raw is None:
        raise _bad(reasons.MISSING_FIELD, f"columnar metadata {key!r} is missing")
    if len(raw) > MAX_METADATA_VALUE_LEN:
        raise _bad(reasons.BAD_VALUE, f"columnar metadata {key!r} is {len(raw)} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad(reasons.BAD_VALUE, f"columnar metadata {key!r} is not UTF-8") from None


def _uint(meta: Mapping[bytes, bytes], key: str) -> int:
    s = _raw(meta, key)
    if not _UINT_RE.fullmatch(s):
        raise _bad(reasons.WRONG_TYPE, f"columnar metadata {key!r}={s[:40]!r} is not a uint")
    v = int(s)
    if v > MAX_UINT64:
        raise _bad(reasons.BAD_VALUE, f"columnar metadata {key!r} exceeds uint64")
    return v


def _float(meta: Mapping[bytes, bytes], key: str) -> float:
    s = _raw(meta, key)
    if not _FLOAT_RE.fullmatch(s):
        raise _bad(reasons.WRONG_TYPE, f"columnar metadata {key!r}={s[:40]!r} is not a number")
    return float(s)


def validate_meta(m: ReportMeta) -> None:
    if not (math.isfinite(m.sent_at) and math.isfinite(m.queued_requests)):
        raise _bad(reasons.BAD_VALUE, "columnar sent_at/queued_requests must be finite")
    if m.queued_requests < 0:
        raise _bad(reasons.BAD_VALUE, f"columnar queued_requests {m.queued_requests} < 0")
    for name in ("seq", "membership_epoch", "part", "parts"):
        v = getattr(m, name)
        if not 0 <= v <= MAX_UINT64:
            raise _bad(reasons.BAD_VALUE, f"columnar {name}={v} out of range")
    if not 1 <= m.parts <= MAX_PARTS or m.part >= m.parts:
        raise _bad(reasons.BAD_VALUE, f"columnar part {m.part} of {m.parts} is impossible")


def parse_meta(meta: Mapping[bytes, bytes] | None) -> ReportMeta:
    if not meta:
        raise _bad(reasons.MISSING_FIELD, "columnar schema has no metadata")
    m = ReportMeta(
        handle_id=_raw(meta, "handle_id"),
        app=_raw(meta, "app"),
        deployment=_raw(meta, "deployment"),
        sent_at=_float(meta, "sent_at"),
        seq=_uint(meta, "seq"),
        queued_requests=_float(meta, "queued_requests"),
        membership_epoch=_uint(meta, "membership_epoch"),
        part=_uint(meta, "part"),
        parts=_uint(meta, "parts"),
        stats=_stats(meta),
    )
    validate_meta(m)
    return m


def check_custom_name(name: str) -> None:
    size = len(name.encode("utf-8", "surrogatepass"))
    if not 0 < size <= MAX_CUSTOM_NAME_LEN:
        raise _bad(reasons.BAD_SCHEMA, f"custom metric name of {size} bytes")


def check_schema(schema: pa.Schema) -> tuple[list[int], tuple[str, ...]]:
    """Column indices to keep (fixed columns in canonical order, then custom columns in the
    sender's order) and the custom metric names. Unknown columns are ignored."""
    if len(schema) > MAX_COLUMNS:
        raise _bad(reasons.BAD_SCHEMA, f"{len(schema)} columns > MAX_COLUMNS={MAX_COLUMNS}")
    names = schema.names
    held = SCHEMA_MEMO.get(names, schema)
    if held is not None:
        return held
    dup = [n for n, c in Counter(names).items() if c > 1]
    if dup:
        raise _bad(reasons.BAD_SCHEMA, f"duplicate column {dup[0][:80]!r}")
    keep: list[int] = []
    for fld in HANDLE_REPORT_FIXED_FIELDS:
        i = schema.get_field_index(fld.name)
        if i < 0:
            raise _bad(reasons.MISSING_FIELD, f"column {fld.name!r} is missing")
        if schema.field(i).type != fld.type:
            raise _bad(reasons.WRONG_TYPE, f"column {fld.name!r} is {schema.field(i).type}")
        keep.append(i)
    custom: list[str] = []
    for i, name in enumerate(names):
        if not name.startswith(CUSTOM_COLUMN_PREFIX):
            continue
        metric = name[len(CUSTOM_COLUMN_PREFIX) :]
        check_custom_name(metric)
        if schema.field(i).type != CUSTOM_COLUMN_TYPE:
            raise _bad(reasons.WRONG_TYPE, f"column {name[:80]!r} is {schema.field(i).type}")
        keep.append(i)
        custom.append(metric)
    SCHEMA_MEMO.add(names, schema, keep, tuple(custom))
    return keep, tuple(custom)


class SchemaMemo:
    """Schemas (metadata aside) that passed `check_schema`, with its verdict.

    Why: a router sends the same schema report after report (only the metadata, which holds
    the report-level fields, changes), and walking the fields is a fixed cost that dominates a
    narrow report's decode. An entry is reused only if the new schema `.equals` it with
    metadata ignored, which compares every field's name, type and nullability, everything
    `check_schema` reads, so a hit gives exactly the verdict the full check would. Only
    schemas without unknown columns are held (their names are bounded: fixed names plus custom
    names of at most MAX_CUSTOM_NAME_LEN bytes), bounded in entries and (roughly) bytes,
    least recently used out; a miss just costs the full check."""

    MAX_ENTRIES = 256
    MAX_BYTES = 4 << 20

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[str, ...], tuple[pa.Schema, list[int], tuple[str, ...]]]
        self._entries = OrderedDict()
        self._bytes = 0

    def get(self, names: list[str], schema: pa.Schema) -> tuple[list[int], tuple[str, ...]] | None:
        key = tuple(names)
        held = self._entries.get(key)
        if held is None or not held[0].equals(schema, check_metadata=False):
            return None
        self._entries.move_to_end(key)
        return list(held[1]), held[2]

    def add(
        self, names: list[str], schema: pa.Schema, keep: list[int], custom: tuple[str, ...]
    ) -> None:
        if len(keep) != len(names):
            return  # unknown columns: names of any length, not worth holding
        key = tuple(names)
        if key in self._entries:
            self._entries.move_to_end(key)
        else:
            self._bytes += self._size(key)
        self._entries[key] = (schema.remove_metadata(), list(keep), custom)
        while self._entries and (
            len(self._entries) > self.MAX_ENTRIES or self._bytes > self.MAX_BYTES
        ):
            self._bytes -= self._size(self._entries.popitem(last=False)[0])

    @staticmethod
    def _size(names: tuple[str, ...]) -> int:
        return sum(64 + len(n) for n in names)


SCHEMA_MEMO = SchemaMemo()


def _all_finite(values: np.ndarray) -> bool:
    """No NaN, no inf (min and max propagate NaN, so two reductions decide it exactly)."""
    if values.size == 0:
        return True
    return bool(-np.inf < _MIN(values) and _MAX(values) < np.inf)


_MIN = np.minimum.reduce
_MAX = np.maximum.reduce


def _valid_mask(col: pa.Array) -> np.ndarray:
    return np.asarray(pc.is_valid(col).to_numpy(zero_copy_only=False))


class DistinctMemo:
    """Replica-id dictionaries already proven distinct, per (handle_id, part).

    Why: hashing every string (`count_distinct`) is most of a wide part's decode time, yet a
    router sends the same dictionary report after report. An entry is reused only if the new
    dictionary `.equals` it (a memcmp), so a hit proves distinctness exactly. Bounded in entries
    and bytes; a miss just costs the full check."""

    MIN_ROWS = 32  # below this the full check (a Python set) is as cheap as the memo
    MAX_ENTRIES = 4096
    MAX_BYTES = 64 << 20

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[str, int], pa.Array] = OrderedDict()
        self._bytes = 0

    def known(self, key: tuple[str, int], dictionary: pa.Array) -> bool:
        held = self._entries.get(key)
        if held is None or not held.equals(dictionary):
            return False
        self._entries.move_to_end(key)
        return True

    def add(self, key: tuple[str, int], dictionary: pa.Array) -> None:
        if len(dictionary) < self.MIN_ROWS:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old.nbytes
        owned = pa.concat_arrays([dictionary])  # a copy: do not pin the received payload
        self._entries[key] = owned
        self._bytes += owned.nbytes
        while self._entries and (
            len(self._entries) > self.MAX_ENTRIES or self._bytes > self.MAX_BYTES
        ):
            self._bytes -= self._entries.popitem(last=False)[1].nbytes


DISTINCT_MEMO = DistinctMemo()


_IDENTITY_MAX_ROWS = 1 << 16
"""Widest identity held (256 KiB; at most 32 of them): wider parts take the bincount path."""


@functools.lru_cache(maxsize=32)
def _identity(n: int) -> pa.Array:
    """int32 0..n-1: the indices of a part whose rows are its dictionary in order (every
    writer's layout). Read-only Arrow memory, so sharing one per width is safe."""
    return pa.array(np.arange(n, dtype=np.int32))


_SET_ROWS = 256
"""Below this many entries a Python set decides distinctness faster than `count_distinct`."""


def _distinct(d: pa.Array) -> bool:
    """Every string of a (null-free, UTF-8-validated) dictionary differs from the others."""
    n = len(d)
    if n < _SET_ROWS:
        return len(set(d.to_pylist())) == n
    return bool(pc.count_distinct(d).as_py() == n)


def _check_replica_ids(col: pa.DictionaryArray, memo_key: tuple[str, int] | None) -> None:
    n = len(col)
    d = col.dictionary
    if col.null_count or d.null_count:
        raise _bad(reasons.BAD_VALUE, "replica_id has nulls")
    if n == 0:
        return
    # Index bounds are checked by the caller's full validation (RecordBatch.validate).
    indices = col.indices
    # Fast path: distinct dictionary and each index used once. Otherwise compare the strings.
    if len(d) == n and n <= _IDENTITY_MAX_ROWS and _identity(n).equals(indices):
        once = True  # the usual layout, proven by a memcmp
    else:
        once = bool(np.bincount(indices.to_numpy(zero_copy_only=False)).max() <= 1)
    if once:
        if memo_key is not None and DISTINCT_MEMO.known(memo_key, d):
            return
        if _distinct(d):
            if memo_key is not None:
                DISTINCT_MEMO.add(memo_key, d)
            return
    if pc.count_distinct(d.take(indices)).as_py() != n:
        raise _bad(reasons.DUPLICATE_REPLICA, "a replica_id appears on more than one row")


def _numpy(col: pa.Array, fill: float | int) -> np.ndarray:
    # fill_null costs more than the conversion itself on narrow parts: only when needed.
    arr = pc.fill_null(col, fill) if col.null_count else col
    return np.asarray(arr.to_numpy(zero_copy_only=False))


def check_values(
    batch: pa.RecordBatch,
    memo_key: tuple[str, int] | None = None,
    columns: list[pa.Array] | None = None,
) -> None:
    """Value rules of a projected batch (fixed columns first, then custom.*) that has passed
    full Arrow validation, so every buffer read here is in bounds. `memo_key` (handle_id, part)
    lets a repeated replica-id dictionary skip its distinctness check (see `DistinctMemo`);
    `columns` is `batch.columns` if the caller has it already (each access makes a wrapper)."""
    cols = batch.columns if columns is None else columns
    _check_replica_ids(cols[0], memo_key)
    n = batch.num_rows
    running = cols[1]
    if running.null_count:
        raise _bad(reasons.BAD_VALUE, "running_requests has nulls")
    if n:
        r = running.to_numpy(zero_copy_only=False)
        # min and max propagate NaN, so this is exactly "every value finite and >= 0"
        if not (_MIN(r) >= 0.0 and _MAX(r) < np.inf):
            raise _bad(reasons.BAD_VALUE, "running_requests must be finite and >= 0")
    healthy, checked, failures = cols[2], cols[3], cols[4]
    nulls = healthy.null_count
    if checked.null_count != nulls or failures.null_count != nulls:
        raise _bad(reasons.BAD_VALUE, "health columns disagree on which rows are null")
    if 0 < nulls < n:
        mask = _valid_mask(healthy)
        if not (
            np.array_equal(mask, _valid_mask(checked))
            and np.array_equal(mask, _valid_mask(failures))
        ):
            raise _bad(reasons.BAD_VALUE, "health columns disagree on which rows are null")
    if nulls < n:  # all-null health columns hold no value to check
        if not _all_finite(_numpy(checked, 0.0)):
            raise _bad(reasons.BAD_VALUE, "health_checked_at must be finite")
        if _MIN(_numpy(failures, 0)) < 0:
            raise _bad(reasons.BAD_VALUE, "health_failures must be >= 0")
    for i in range(len(FIXED_NAMES), len(cols)):
        col = cols[i]
        if col.null_count < n and not _all_finite(_numpy(col, 0.0)):
            raise _bad(reasons.BAD_VALUE, f"column {batch.schema.field(i).name!r} not finite")

"""Columnar (FPC1) handle reports: encoding, splitting, accessors and every decoder rule."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from shared.errors import UsageError, WireError
from shared.wire import codec, reasons
from shared.wire.arrow_schemas import HANDLE_REPORT_FIXED_FIELDS
from shared.wire.columnar import (
    COLUMNAR_MAGIC,
    DEFAULT_COLUMNAR_MIN_REPLICAS,
    columnar_parts_to_handle_report,
    columnar_to_handle_report,
    decode_handle_report_columnar,
    detect_format,
    encode_handle_report_columnar,
    handle_report_to_columnar,
)
from shared.wire.limits import MAX_CUSTOM_METRICS, MAX_MESSAGE_BYTES
from shared.wire.messages import HandleReport, HealthStatus

META = dict(
    handle_id="h-1", app="shop", deployment="ranker", sent_at=1700000000.5, seq=3,
    queued_requests=2.0, membership_epoch=9,
)  # fmt: skip


def report(n: int = 5, **kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = dict(
        META,
        replica_ids=[f"r{i}" for i in range(n)],
        running=np.arange(n, dtype=np.float64) / 2,
        health_healthy=np.arange(n) % 2 == 0,
        health_checked_at=np.full(n, 1700000000.0),
        health_failures=np.arange(n) % 3,
        health_valid=np.arange(n) != 1,
        custom={"gpu": np.where(np.arange(n) == 2, np.nan, 0.25)},
    )
    args.update(kw)
    return args


def one(**kw: Any) -> bytes:
    (data,) = encode_handle_report_columnar(**report(**kw))
    return data


def reason_of(data: bytes) -> str:
    with pytest.raises(WireError) as info:
        decode_handle_report_columnar(data)
    return info.value.reason


def good_batch() -> tuple[pa.RecordBatch, dict[bytes, bytes]]:
    data = one()
    batch = decode_handle_report_columnar(data).batch
    meta = dict(pa.ipc.open_stream(data[4:]).schema.metadata)
    return batch, meta


def fpc1(
    batch: pa.RecordBatch, meta: dict[bytes, bytes] | None, batches: int = 1, **opt: Any
) -> bytes:
    sink = pa.BufferOutputStream()
    sink.write(COLUMNAR_MAGIC)
    schema = batch.schema.with_metadata(meta) if meta else batch.schema.remove_metadata()
    with pa.ipc.new_stream(sink, schema, options=pa.ipc.IpcWriteOptions(**opt)) as w:
        for _ in range(batches):
            w.write_batch(batch.replace_schema_metadata(schema.metadata))
    return bytes(sink.getvalue().to_pybytes())


def with_column(batch: pa.RecordBatch, name: str, arr: pa.Array) -> pa.RecordBatch:
    i = batch.schema.get_field_index(name)
    cols = list(batch.columns)
    cols[i] = arr
    fields = list(batch.schema)
    fields[i] = pa.field(name, arr.type)
    return pa.RecordBatch.from_arrays(cols, schema=pa.schema(fields))


# --- encode / decode ---------------------------------------------------------------------------


def test_round_trip_and_accessors() -> None:
    c = decode_handle_report_columnar(one())
    assert (c.handle_id, c.app, c.deployment, c.sent_at, c.seq) == (
        "h-1",
        "shop",
        "ranker",
        1700000000.5,
        3,
    )
    assert (c.queued_requests, c.membership_epoch, c.part, c.parts) == (2.0, 9, 0, 1)
    assert c.num_rows == 5
    assert c.replica_id_list() == ["r0", "r1", "r2", "r3", "r4"]
    assert c.replica_dictionary.to_pylist() == ["r0", "r1", "r2", "r3", "r4"]
    assert c.replica_indices.tolist() == [0, 1, 2, 3, 4]
    assert c.running.dtype == np.float64 and c.running.tolist() == [0, 0.5, 1, 1.5, 2]
    assert c.health_valid.tolist() == [True, False, True, True, True]
    assert c.health_healthy.tolist() == [True, False, True, False, True]
    assert c.health_failures.tolist() == [0, 0, 2, 0, 1]
    checked = c.health_checked_at
    assert np.isnan(checked[1]) and checked[0] == 1700000000.0
    assert c.custom_names == ("gpu",)
    gpu = c.custom("gpu")
    assert np.isnan(gpu[2]) and gpu[0] == 0.25
    with pytest.raises(KeyError):
        c.custom("nope")
    assert c.batch.schema.metadata is None


def test_columns_held_from_the_decoder_never_outlive_their_batch() -> None:
    """The decoder hands its column wrappers over with the report; a report made from another's
    fields with a different batch (dataclasses.replace) reads its own batch's columns."""
    import dataclasses

    c = decode_handle_report_columnar(one())
    assert c.columns[1].equals(c.batch.column(1))
    d = dataclasses.replace(c, batch=c.batch.slice(1))
    assert d.num_rows == 4 and d.running.tolist() == c.running.tolist()[1:]
    assert d.replica_id_list() == c.replica_id_list()[1:]


def test_empty_report_without_health_or_custom() -> None:
    parts = encode_handle_report_columnar(**META, replica_ids=[], running=np.zeros(0))
    assert len(parts) == 1
    c = decode_handle_report_columnar(parts[0])
    assert c.num_rows == 0 and c.parts == 1 and c.custom_names == ()
    assert c.running.shape == (0,) and c.health_valid.shape == (0,)


def test_health_absent_means_every_row_null() -> None:
    c = decode_handle_report_columnar(
        one(health_healthy=None, health_checked_at=None, health_failures=None, health_valid=None)
    )
    assert not c.health_valid.any()


@pytest.mark.parametrize(
    "ids",
    [
        pa.array(["a", "b", "c"]),
        pa.array(["a", "b", "c"], type=pa.large_string()),
        pa.array(["a", "b", "c"]).dictionary_encode(),
        pa.chunked_array([["a"], ["b", "c"]]),
        np.array(["a", "b", "c"]),
        ("a", "b", "c"),
    ],
    ids=["utf8", "large", "dict", "chunked", "numpy", "tuple"],
)
def test_replica_id_inputs(ids: Any) -> None:
    c = decode_handle_report_columnar(one(n=3, replica_ids=ids))
    assert c.replica_id_list() == ["a", "b", "c"]


def test_arrow_health_inputs_bring_their_own_nulls() -> None:
    data = one(
        n=3,
        health_healthy=pa.array([True, None, False]),
        health_checked_at=pa.array([1.0, None, 2.0]),
        health_failures=pa.array([0, None, 4], type=pa.int64()),
        health_valid=None,
    )
    assert decode_handle_report_columnar(data).health_valid.tolist() == [True, False, True]


@pytest.mark.parametrize(
    "kw",
    [
        {"running": np.array([1.0, np.nan, 0, 0, 0])},
        {"running": np.array([1.0, -1.0, 0, 0, 0])},
        {"running": np.zeros(4)},
        {"health_failures": None},
        {"health_failures": np.array([0, 0, -1, 0, 0])},
        {"health_failures": np.full(5, 2**40)},
        {"health_checked_at": np.array([np.inf, 0, 0, 0, 0])},
        {"replica_ids": ["a", "b", "a", "c", "d"]},
        {"replica_ids": ["a", None, "b", "c", "d"]},
        {"replica_ids": ["a", 1, "b", "c", "d"]},
        {"custom": {"": np.zeros(5)}},
        {"custom": {"x" * 129: np.zeros(5)}},
        {"custom": {"m": np.array([np.inf, 0, 0, 0, 0])}},
        {"custom": {f"m{i}": np.zeros(5) for i in range(MAX_CUSTOM_METRICS + 1)}},
        {"sent_at": float("nan")},
        {"queued_requests": -1.0},
        {"seq": -1},
        {
            "health_healthy": pa.array([True, None, True, True, True]),
            "health_checked_at": pa.array([1.0, 1.0, 1.0, 1.0, None]),
            "health_failures": pa.array([0, None, 0, 0, None]),
        },
    ],
    ids=lambda kw: ",".join(kw),
)
def test_encoder_refuses_what_the_decoder_would_reject(kw: dict[str, Any]) -> None:
    with pytest.raises(UsageError):
        encode_handle_report_columnar(**report(**kw))


def test_a_row_that_cannot_fit_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="1 replica row"):
        encode_handle_report_columnar(**report(n=3), max_payload=500)


def test_split_respects_max_payload_and_keeps_rows_disjoint() -> None:
    n, limit = 2000, 20_000
    args = report(n=n, custom={"a": np.linspace(0, 1, n), "b": np.ones(n)})
    parts = encode_handle_report_columnar(**args, max_payload=limit)
    assert len(parts) > 3
    assert all(len(p) <= limit for p in parts)
    decoded = [decode_handle_report_columnar(p) for p in parts]
    assert [c.part for c in decoded] == list(range(len(parts)))
    assert {c.parts for c in decoded} == {len(parts)}
    # Every part repeats the report-level fields and carries a dictionary of its own rows only.
    for c in decoded:
        assert (c.seq, c.queued_requests, c.membership_epoch) == (3, 2.0, 9)
        assert len(c.replica_dictionary) == c.num_rows
    ids = [r for c in decoded for r in c.replica_id_list()]
    assert ids == args["replica_ids"]
    assert np.array_equal(np.concatenate([c.running for c in decoded]), args["running"])
    assert np.array_equal(np.concatenate([c.custom("a") for c in decoded]), np.linspace(0, 1, n))


def test_max_payload_above_the_decoder_limit_is_clamped() -> None:
    (data,) = encode_handle_report_columnar(**report(n=10), max_payload=10 * MAX_MESSAGE_BYTES)
    assert decode_handle_report_columnar(data).num_rows == 10


def test_detect_format() -> None:
    assert detect_format(one()) == "columnar"
    assert detect_format(codec.encode(HealthStatus("r", True, 1.0, 0))) == "msgpack"
    assert detect_format(b"") == "msgpack"
    assert DEFAULT_COLUMNAR_MIN_REPLICAS == 128  # the ingest benchmark's crossover, rounded up


# --- decoder rules -----------------------------------------------------------------------------


def test_envelope_rules() -> None:
    data = one()
    assert reason_of(b"FPC2" + data[4:]) == reasons.BAD_MAGIC
    assert reason_of(b"FP") == reasons.BAD_MAGIC
    assert reason_of(COLUMNAR_MAGIC) == reasons.BAD_SCHEMA
    assert reason_of(data[: len(data) - 40]) == reasons.MALFORMED
    assert reason_of(COLUMNAR_MAGIC + b"\x00" * MAX_MESSAGE_BYTES) == reasons.OVERSIZE
    assert reason_of(42) == reasons.NOT_BYTES  # type: ignore[arg-type]
    assert decode_handle_report_columnar(memoryview(data)).num_rows == 5


def test_stream_shape_rules() -> None:
    batch, meta = good_batch()
    assert reason_of(fpc1(batch, meta, batches=2)) == reasons.BAD_SCHEMA
    assert reason_of(fpc1(batch, meta, batches=0)) == reasons.BAD_SCHEMA
    assert reason_of(fpc1(batch, meta, compression="zstd")) == reasons.BAD_SCHEMA
    assert reason_of(fpc1(batch, meta, compression="lz4")) == reasons.BAD_SCHEMA


def _ipc(batch: pa.RecordBatch, meta: dict[bytes, bytes], **opt: Any) -> bytes:
    return fpc1(batch, meta, **opt)[len(COLUMNAR_MAGIC) :]


def _guard_verdict(walk: Any, body: bytes) -> str:
    try:
        walk(pa.py_buffer(body))
    except WireError as exc:
        return exc.reason
    except Exception:  # pyarrow, struct and ValueError: the decoder reports these as malformed
        return reasons.MALFORMED
    return "ok"


def test_the_stream_guard_frames_messages_like_arrow() -> None:
    """The shape guard frames the IPC messages itself, without verifying their flatbuffers (a
    walk over pyarrow's MessageReader cost twice as much). On mutated streams (plain,
    compressed, legacy framing): it never rejects what the verifying walk accepts, it rejects
    with the same reason, and what it passes that the verifying walk refuses (a flatbuffer it
    read without verifying) pyarrow cannot read either, so nothing compressed is ever read."""
    import random

    from shared.wire._ipc_guard import _walk_verified, check_stream_shape

    batch, meta = good_batch()
    seeds = [
        _ipc(batch, meta),
        _ipc(batch, meta, compression="lz4"),
        _ipc(batch, meta, compression="zstd"),
        _ipc(batch, meta, use_legacy_format=True),
        _ipc(batch, meta, batches=2),
    ]
    tokens = [b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\x08\x00\x00\x00", b"\xf0\xff\xff\xff"]
    rng = random.Random(34)
    passed_unverified = 0
    for i in range(3000):
        b = bytearray(rng.choice(seeds))
        op = rng.randrange(4)
        if op == 0:
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] = rng.randrange(256)
        elif op == 1:
            del b[rng.randrange(len(b) + 1) :]
        elif op == 2:
            at = rng.randrange(len(b))
            b[at : at + 4] = rng.choice(tokens)
        else:
            b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 12)))
        body = bytes(b)
        fast, verified = (_guard_verdict(w, body) for w in (check_stream_shape, _walk_verified))
        if fast == "ok" and verified != "ok":
            passed_unverified += 1
            with pytest.raises(Exception):  # noqa: B017  (pyarrow's error types vary)
                pa.ipc.open_stream(body).read_next_batch()
        else:
            assert fast == verified, (i, body.hex())
    assert passed_unverified  # the mutations did reach flatbuffers the fast walk cannot verify


def test_a_remembered_schema_is_only_reused_for_the_same_fields() -> None:
    from shared.wire._columnar_check import SCHEMA_MEMO

    batch, meta = good_batch()  # decoded: its schema is remembered
    names = tuple(batch.schema.names)
    assert SCHEMA_MEMO.get(list(names), batch.schema) is not None
    f32 = with_column(batch, "running_requests", batch.column(1).cast(pa.float32()))
    assert tuple(f32.schema.names) == names
    assert reason_of(fpc1(f32, meta)) == reasons.WRONG_TYPE
    # a schema with unknown columns is checked every time, not held
    extra = pa.RecordBatch.from_arrays(
        [*batch.columns, pa.array([1, 2, 3, 4, 5])], names=[*batch.schema.names, "future"]
    )
    decode_handle_report_columnar(fpc1(extra, meta))
    assert SCHEMA_MEMO.get([*names, "future"], extra.schema) is None


def test_schema_rules() -> None:
    batch, meta = good_batch()
    f32 = with_column(batch, "running_requests", batch.column(1).cast(pa.float32()))
    assert reason_of(fpc1(f32, meta)) == reasons.WRONG_TYPE
    plain_ids = with_column(batch, "replica_id", batch.column(0).dictionary_decode())
    assert reason_of(fpc1(plain_ids, meta)) == reasons.WRONG_TYPE
    i64 = with_column(batch, "health_failures", batch.column(4).cast(pa.int64()))
    assert reason_of(fpc1(i64, meta)) == reasons.WRONG_TYPE
    custom_i = with_column(batch, "custom.gpu", pa.array([1, 2, 3, 4, 5]))
    assert reason_of(fpc1(custom_i, meta)) == reasons.WRONG_TYPE
    assert reason_of(fpc1(batch.drop_columns(["health_failures"]), meta)) == reasons.MISSING_FIELD
    dup = pa.RecordBatch.from_arrays(
        [*batch.columns, batch.column(1)], names=[*batch.schema.names, "running_requests"]
    )
    assert reason_of(fpc1(dup, meta)) == reasons.BAD_SCHEMA
    empty_name = pa.RecordBatch.from_arrays(
        [*batch.columns, batch.column(1)], names=[*batch.schema.names, "custom."]
    )
    assert reason_of(fpc1(empty_name, meta)) == reasons.BAD_SCHEMA


def test_unknown_columns_and_metadata_keys_are_ignored() -> None:
    batch, meta = good_batch()
    extra = pa.RecordBatch.from_arrays(
        [pa.array([[1], [], None, [2, 3], [4]]), *batch.columns],
        names=["future_list", *batch.schema.names],
    )
    c = decode_handle_report_columnar(fpc1(extra, {**meta, b"future": b"\xff"}))
    assert c.batch.schema.names == batch.schema.names
    assert c.batch.to_pydict() == batch.to_pydict()


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        (b"seq", None, reasons.MISSING_FIELD),
        (b"parts", None, reasons.MISSING_FIELD),
        (b"seq", b"-1", reasons.WRONG_TYPE),
        (b"seq", b"0x10", reasons.WRONG_TYPE),
        (b"seq", b"1_000", reasons.WRONG_TYPE),
        (b"seq", b" 1", reasons.WRONG_TYPE),
        (b"seq", b"1\n", reasons.WRONG_TYPE),
        (b"seq", "\u0661".encode(), reasons.WRONG_TYPE),
        (b"seq", b"18446744073709551616", reasons.BAD_VALUE),
        (b"seq", b"1" * 21, reasons.WRONG_TYPE),
        (b"sent_at", b"nan", reasons.WRONG_TYPE),
        (b"sent_at", b"Infinity", reasons.WRONG_TYPE),
        (b"sent_at", b"1e999", reasons.BAD_VALUE),
        (b"sent_at", b".5", reasons.WRONG_TYPE),
        (b"queued_requests", b"-1.0", reasons.BAD_VALUE),
        (b"parts", b"0", reasons.BAD_VALUE),
        (b"part", b"1", reasons.BAD_VALUE),
        (b"parts", b"70000", reasons.BAD_VALUE),
        (b"app", b"\xff\xfe", reasons.BAD_VALUE),
        (b"app", b"a" * 2000, reasons.BAD_VALUE),
    ],
)
def test_metadata_rules(key: bytes, value: bytes | None, reason: str) -> None:
    batch, meta = good_batch()
    if value is None:
        del meta[key]
    else:
        meta[key] = value
    assert reason_of(fpc1(batch, meta)) == reason


def test_metadata_accepts_other_writers_number_formats() -> None:
    batch, meta = good_batch()
    for text, value in [(b"1.712345678e+09", 1.712345678e9), (b"3", 3.0), (b"-0.5", -0.5)]:
        c = decode_handle_report_columnar(fpc1(batch, {**meta, b"sent_at": text}))
        assert c.sent_at == value
    assert reason_of(fpc1(batch, None)) == reasons.MISSING_FIELD


@pytest.mark.parametrize(
    ("column", "values", "reason"),
    [
        ("running_requests", pa.array([0.0, -1.0, 0, 0, 0]), reasons.BAD_VALUE),
        ("running_requests", pa.array([0.0, np.nan, 0, 0, 0]), reasons.BAD_VALUE),
        ("running_requests", pa.array([0.0, np.inf, 0, 0, 0]), reasons.BAD_VALUE),
        ("running_requests", pa.array([0.0, None, 0, 0, 0], pa.float64()), reasons.BAD_VALUE),
        ("health_checked_at", pa.array([1.0, None, np.nan, 1, 1]), reasons.BAD_VALUE),
        ("health_checked_at", pa.array([1.0, 1.0, 1.0, 1, 1]), reasons.BAD_VALUE),
        ("health_checked_at", pa.array([None, 1.0, 1.0, 1, 1]), reasons.BAD_VALUE),
        ("health_failures", pa.array([0, None, -2, 0, 0], pa.int32()), reasons.BAD_VALUE),
        ("custom.gpu", pa.array([0.0, 1.0, None, np.inf, 0]), reasons.BAD_VALUE),
        ("custom.gpu", pa.array([0.0, 1.0, None, np.nan, 0]), reasons.BAD_VALUE),
    ],
)
def test_value_rules(column: str, values: pa.Array, reason: str) -> None:
    batch, meta = good_batch()
    assert reason_of(fpc1(with_column(batch, column, values), meta)) == reason


def test_replica_id_rules() -> None:
    batch, meta = good_batch()
    d = batch.column(0).dictionary

    def ids(indices: list[int | None], dictionary: pa.Array = d, safe: bool = True) -> bytes:
        arr = pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), dictionary, safe=safe)
        return fpc1(with_column(batch, "replica_id", arr), meta)

    assert reason_of(ids([0, 1, 2, 3, 3])) == reasons.DUPLICATE_REPLICA
    assert reason_of(ids([0, 1, 2, 3, None])) == reasons.BAD_VALUE
    assert reason_of(ids([0, 1, 2, 3, 9], safe=False)) == reasons.MALFORMED
    assert reason_of(ids([0, 1, 2, 3, -1], safe=False)) == reasons.MALFORMED
    twice = pa.array(["a", "b", "c", "d", "a"])
    assert reason_of(ids([0, 1, 2, 3, 4], twice)) == reasons.DUPLICATE_REPLICA
    # A repeated dictionary value that no row uses twice is harmless; so is an unused value.
    c = decode_handle_report_columnar(
        ids([4, 1, 2, 3, 5], pa.array(["a", "b", "c", "d", "e", "f", "a"]))
    )
    assert c.replica_id_list() == ["e", "b", "c", "d", "f"]
    assert (
        reason_of(ids([0, 1, 2, 3, 4], pa.array(["a", None, "c", "d", "e"]))) == reasons.BAD_VALUE
    )


def test_invalid_utf8_in_the_dictionary_is_malformed() -> None:
    batch, meta = good_batch()
    data = fpc1(batch, meta)
    assert data.count(b"r3") == 1
    assert reason_of(data.replace(b"r3", b"\xff3")) == reasons.MALFORMED


# --- object path <-> columnar ------------------------------------------------------------------

H1 = HealthStatus("a", True, 10.0, 0)
H2 = HealthStatus("b", False, 11.0, 4)


def test_object_report_round_trip() -> None:
    rep = HandleReport(
        "h",
        "app",
        "dep",
        5.0,
        2,
        1.5,
        {"a": 1.0, "b": 0.0},
        (H1, H2),
        3,
        {"m": {"b": 2.0}, "empty": {}},
    )
    (data,) = handle_report_to_columnar(rep)
    assert columnar_to_handle_report(decode_handle_report_columnar(data)) == rep


def test_health_only_replicas_get_a_zero_running_row() -> None:
    rep = HandleReport("h", "a", "d", 5.0, 2, 0.0, {"a": 1.0}, (H1, H2), 3, {"m": {"c": 1.0}})
    (data,) = handle_report_to_columnar(rep)
    back = columnar_to_handle_report(decode_handle_report_columnar(data))
    assert back.running == {"a": 1.0, "b": 0.0, "c": 0.0}
    assert back.health == (H1, H2) and back.custom == {"m": {"c": 1.0}}


def test_duplicate_health_cannot_go_columnar() -> None:
    rep = HandleReport("h", "a", "d", 5.0, 2, 0.0, {}, (H1, H1), 3)
    with pytest.raises(UsageError):
        handle_report_to_columnar(rep)


def test_parts_merge_back_into_one_report() -> None:
    running = {f"r{i}": float(i) for i in range(300)}
    h = HealthStatus("r5", False, 12.0, 1)
    rep = HandleReport("h", "a", "d", 5.0, 2, 7.0, running, (h,), 3, {"m": {"r7": 1.0}})
    parts = [decode_handle_report_columnar(p) for p in handle_report_to_columnar(rep, 4000)]
    assert len(parts) > 1
    assert columnar_parts_to_handle_report(parts) == rep
    other = decode_handle_report_columnar(
        handle_report_to_columnar(HandleReport("h", "a", "d", 5.0, 3, 0.0, {}, (), 3))[0]
    )
    with pytest.raises(UsageError):
        columnar_parts_to_handle_report([parts[0], other])
    with pytest.raises(UsageError):
        columnar_parts_to_handle_report([])


def test_fixed_fields_are_the_first_columns() -> None:
    c = decode_handle_report_columnar(one())
    assert c.batch.schema.names[:5] == [f.name for f in HANDLE_REPORT_FIXED_FIELDS]


@pytest.mark.parametrize("n", [64, 512])
def test_remembered_dictionary_does_not_let_duplicates_through(n: int) -> None:
    """The distinctness memo may only skip the check for an exactly equal dictionary (narrow
    parts are remembered too, and their check on a miss is a Python set)."""
    import numpy as np
    import pyarrow as pa

    from shared.errors import WireError
    from shared.wire.columnar import (
        COLUMNAR_MAGIC,
        decode_handle_report_columnar,
        encode_handle_report_columnar,
    )

    ids = [f"r{i}" for i in range(n)]
    (good,) = encode_handle_report_columnar(
        handle_id=f"memo-h-{n}",
        app="a",
        deployment="d",
        sent_at=1.0,
        seq=1,
        queued_requests=0.0,
        membership_epoch=1,
        replica_ids=ids,
        running=np.zeros(n),
    )
    batch = decode_handle_report_columnar(good).batch  # proven distinct: now remembered
    # the same handle and part, a dictionary that differs only by a duplicated id
    dup_dict = pa.array([*ids[:-1], "r0"])
    dup_col = pa.DictionaryArray.from_arrays(pa.array(np.arange(n, dtype=np.int32)), dup_dict)
    schema = pa.ipc.open_stream(good[len(COLUMNAR_MAGIC) :]).schema  # with the metadata
    forged = pa.RecordBatch.from_arrays([dup_col, *batch.columns[1:]], schema=schema)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, forged.schema) as writer:
        writer.write_batch(forged)
    payload = COLUMNAR_MAGIC + sink.getvalue().to_pybytes()
    with pytest.raises(WireError) as err:
        decode_handle_report_columnar(payload)
    assert err.value.reason == "duplicate_replica"


def test_a_wide_report_splits_into_few_parts_under_a_small_limit() -> None:
    """The per-part overhead is measured on a one-row part: a zero-length slice is written with
    some buffers of the whole report, which made a 65,536-row report at 256 KiB 65,536 parts."""
    n = 20_000
    ids = pa.array([f"bench-d00-abcd-{i:x}" for i in range(n)])
    parts = encode_handle_report_columnar(
        handle_id="h", app="bench", deployment="d00", sent_at=1.0, seq=1, queued_requests=0.0,
        membership_epoch=3, replica_ids=ids, running=np.zeros(n),
        health_healthy=np.ones(n, bool), health_checked_at=np.ones(n),
        health_failures=np.zeros(n, np.int32), max_payload=64 * 1024,
    )  # fmt: skip
    assert all(len(p) <= 64 * 1024 for p in parts)
    assert len(parts) <= 16
    rows = sum(len(decode_handle_report_columnar(p).replica_ids) for p in parts)
    assert rows == n


def test_an_empty_report_over_the_limit_is_a_usage_error_not_a_crash() -> None:
    with pytest.raises(UsageError, match="0 replica row"):
        encode_handle_report_columnar(
            handle_id="h", app="a", deployment="d", sent_at=1.0, seq=1, queued_requests=0.0,
            membership_epoch=1, replica_ids=pa.array([], pa.utf8()), running=np.zeros(0),
            max_payload=64,
        )  # fmt: skip

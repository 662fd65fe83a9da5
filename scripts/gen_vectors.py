"""Regenerate the golden wire vectors under schemas/vectors/ (deterministic; output is committed).

    .venv/bin/python scripts/gen_vectors.py          # rewrite schemas/vectors
    .venv/bin/python scripts/gen_vectors.py --check  # exit 1 if the committed files differ

Layout: <name>.msgpack + <name>.json for msgpack messages, <name>.fpc1 + <name>.json for columnar
handle report parts, invalid/<name>.bin for inputs every decoder must reject, and `kv/` for the
control-state documents' vectors (scripts/gen_kv_vectors.py makes them). index.json lists every
file of them all; invalid/index.json and kv/index.json repeat their folder's entries.

A msgpack vector's JSON view is the map its bytes hold, unpacked by plain msgpack (`JSON_VIEW`
says how each type is shown), never the decoder's reading of it: a non-canonical vector's index
entry carries that reading apart, as `decoded`. Each invalid vector's reason is checked against
the Python decoder while generating, so the index cannot drift from the implementation.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import random
import struct
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa

from shared.errors import WireError
from shared.wire import codec, columnar, jsonview
from shared.wire.limits import MAX_CUSTOM_METRICS, MAX_CUSTOM_NAME_LEN
from shared.wire.messages import (
    Admission,
    CallArgs,
    Chunk,
    End,
    ErrorReply,
    HandleReport,
    HealthFrame,
    HealthStatus,
    Heartbeat,
    HttpRequest,
    HttpResponse,
    Lifecycle,
    ProbeRequest,
    ReplicaReport,
    Request,
    RequestStats,
    WireMessage,
)

VECTORS = Path(__file__).resolve().parent.parent / "schemas" / "vectors"
T0 = 1_712_345_678.5  # a fixed wall-clock instant so vectors never depend on the clock
GOOD = HealthStatus("replica-0001", True, T0, 0)
BAD = HealthStatus("replica-0002", False, T0 + 0.25, 3)
ARGS = CallArgs((1, "two", 3.5, None, True, [1, 2], b"\x00\x01\xff"), {"temperature": 0.7})
HTTP_REQ = HttpRequest(
    "POST",
    "/v1/predict",
    "model=small&n=2",
    (("content-type", "application/json"), ("x-tag", "a"), ("x-tag", "b")),
    b'{"prompt": "hi"}',
)
READY = Lifecycle(
    "replica-0001",
    "agent-1",
    "ready",
    T0,
    "fp.v1.rpc.shop.ranker.replica-0001",
    "v3",
    None,
    "shop",
    "ranker",
)
STATS = RequestStats(
    arrived=120, completed=117, service_s=23.4, service_sq_s2=4.875, wait_s=1.25, rejected=1,
    timed_out=2, concurrency_sum=234, concurrency_sq_sum=520, concurrency_service_s=49.5,
)  # fmt: skip
HANDLE_STATS = HandleReport("router-a/h1", "shop", "ranker", T0, 9, 0.0, {}, (), 12, stats=STATS)
EXITED = Lifecycle(
    "replica-0001",
    "agent-1",
    "exited",
    T0 + 9.0,
    "fp.v1.rpc.shop.ranker.replica-0001",
    "v3",
    -9,
    "shop",
    "ranker",
)


def canonical_messages() -> list[tuple[str, WireMessage, str]]:
    return [
        ("health_ok", GOOD, "healthy replica"),
        ("health_failing", BAD, "three failed checks in a row"),
        ("probe", ProbeRequest(T0), "pull probe; the reply is a health message"),
        (
            "probe_request",
            ProbeRequest(T0, "req-0001"),
            "asks about one request; not held: the reply is an error not_held",
        ),
        (
            "error_not_held",
            ErrorReply("not_held", "request req-0001 is not running here", True),
            "a probe's reply when the replica does not hold the request it names",
        ),
        ("args", ARGS, "call arguments: any msgpack values, bin included"),
        ("args_empty", CallArgs((), {}), "no arguments"),
        (
            "request_args",
            Request("req-0001", "__call__", True, False, T0 + 30.0, codec.encode(ARGS), "args"),
            "body is the msgpack of the 'args' vector",
        ),
        (
            "request_http",
            Request("req-0002", "__call__", False, True, None, codec.encode(HTTP_REQ), "http"),
            "streaming HTTP request without deadline; body is the 'http_request' vector",
        ),
        (
            "request_model",
            Request(
                "req-0003", "__call__", True, False, None, codec.encode(ARGS), "args", "model-7"
            ),
            "for the multiplexed model 'model-7' (optional, added after v1)",
        ),
        ("http_request", HTTP_REQ, "repeated header names keep order"),
        (
            "http_response",
            HttpResponse(200, (("content-type", "application/json"),), b'{"ok": true}'),
            "",
        ),
        ("admission_accepted", Admission(True, 3, GOOD, True), "frames declared"),
        ("admission_rejected", Admission(False, 5, GOOD, False), "rejection ends the stream"),
        (
            "admission_models",
            Admission(True, 1, GOOD, False, ("model-7", "model-2")),
            "a multiplexing replica lists the models it holds (optional, added after v1)",
        ),
        (
            "http_response_more",
            HttpResponse(200, (("content-type", "text/event-stream"),), b"data: 0\n\n", True),
            "chunk 0 of a streamed response: the body goes on (optional, added after v1)",
        ),
        (
            "admission_inline_result",
            Admission(True, 1, GOOD, False, inline_result=b"\x93\x01\x02\x03"),
            "a unary result riding on the admission: nothing follows (optional, added after v1)",
        ),
        (
            "request_inline_result",
            Request("req-0005", "echo", True, False, None, b"", "args", accepts_inline_result=True),
            "the router takes a unary result on the admission (optional, added after v1)",
        ),
        ("health_frame", HealthFrame(BAD), ""),
        ("chunk", Chunk(0, b"hello"), "first chunk"),
        ("end", End(), "no chunk count: what replicas sent before end.chunks"),
        ("end_chunks", End(1), "a unary result: one chunk sent before the end"),
        (
            "error",
            ErrorReply("replica_shutdown", "replica stopped before the request finished", True),
            "a code the replica sends (docs/dataplane.md lists them all)",
        ),
        (
            "replica_report",
            ReplicaReport("replica-0001", T0, 42, 1.75, {"gpu_util": 0.5, "kv_cache": 12.0}, GOOD),
            "carries health",
        ),
        (
            "replica_report_no_health",
            ReplicaReport("replica-0003", T0, 43, 0.0, {}, None),
            "health nil",
        ),
        (
            "handle_report",
            HandleReport(
                "router-a/h1",
                "shop",
                "ranker",
                T0,
                7,
                2.0,
                {"replica-0001": 1.0, "replica-0002": 0.5, "replica-0003": 0.0},
                (GOOD, BAD),
                12,
                {"ttft_ms": {"replica-0001": 81.5, "replica-0002": 240.0}},
            ),
            "object path",
        ),
        (
            "handle_report_empty",
            HandleReport("router-a/h1", "shop", "ranker", T0, 8, 4.0, {}, (), 12),
            "requests queued while the deployment has no replicas (scale from zero)",
        ),
        (
            "handle_report_stats",
            dataclasses.replace(HANDLE_STATS, running={"replica-0001": 1.5}),
            "optional request counters (stats v1): what the what-if model calibrates from",
        ),
        ("heartbeat", Heartbeat(GOOD, T0 + 1.0), ""),
        ("lifecycle_ready", READY, ""),
        (
            "lifecycle_ready_max_ongoing",
            dataclasses.replace(READY, max_ongoing_requests=5),
            "optional admission limit, sent on ready",
        ),
        (
            "lifecycle_ready_http_address",
            dataclasses.replace(READY, max_ongoing_requests=5, http_address="10.0.0.7:41234"),
            "a replica of an ingress deployment: where it serves HTTP itself, sent on ready",
        ),
        ("lifecycle_exited", EXITED, "killed by SIGKILL (negative exit code = signal)"),
    ]


def _pack(obj: Any) -> bytes:
    return bytes(msgpack.packb(obj, use_bin_type=True))


def lenient_maps() -> list[tuple[str, dict[str, Any], str]]:
    """Encodings other writers may produce; decoding must accept them."""
    health = codec.to_wire_map(GOOD)
    request = Request("req-0003", "__call__", False, False, None, codec.encode(ARGS), "args")
    return [
        (
            "health_unknown_fields",
            {**health, "zone": "eu-west-1", "extra": {"nested": [1, 2]}},
            "unknown fields are ignored (forward compatibility)",
        ),
        (
            "replica_report_int_numbers",
            {
                "kind": "replica_report",
                "v": 1,
                "replica_id": "replica-0009",
                "sent_at": 1712345678,
                "seq": 1,
                "running_requests": 2,
            },
            "integers in float fields (as JS encoders write 2.0); custom and health omitted",
        ),
        (
            "handle_report_stats_v2",
            {**codec.to_wire_map(HANDLE_STATS), "stats": {"v": 2, "arrived": "later"}},
            "a stats map of an unknown version is skipped (decodes as no stats)",
        ),
        (
            "lifecycle_no_exit_code",
            {k: v for k, v in codec.to_wire_map(READY).items() if k != "exit_code"},
            "optional field omitted instead of nil",
        ),
        # every optional field appears both absent and nil across the vectors (docs/wire.md):
        # the fields added after v1 are left out by the Python encoder, so here they are nil
        (
            "request_no_deadline",
            {k: v for k, v in codec.to_wire_map(request).items() if k != "deadline"},
            "optional deadline omitted instead of nil",
        ),
        (
            "replica_report_nil_custom",
            {
                **codec.to_wire_map(ReplicaReport("replica-0003", T0, 44, 0.5, {}, None)),
                "custom": None,
            },
            "custom nil: empty",
        ),
        (
            "handle_report_nil_optionals",
            {**codec.to_wire_map(HANDLE_STATS), "custom": None, "stats": None},
            "custom and stats nil: no custom metrics, no counters",
        ),
        (
            "handle_report_no_custom",
            {k: v for k, v in codec.to_wire_map(HANDLE_STATS).items() if k != "custom"},
            "custom omitted: no custom metrics",
        ),
        (
            "lifecycle_nil_max_ongoing",
            {**codec.to_wire_map(READY), "max_ongoing_requests": None},
            "optional max_ongoing_requests nil instead of omitted",
        ),
        (
            "lifecycle_nil_http_address",
            {**codec.to_wire_map(READY), "http_address": None},
            "optional http_address nil: serves no HTTP itself",
        ),
        (
            "probe_nil_request_id",
            {**codec.to_wire_map(ProbeRequest(T0)), "request_id": None},
            "request_id nil: a plain probe",
        ),
        (
            "end_nil_chunks",
            {**codec.to_wire_map(End()), "chunks": None},
            "chunks nil: the sender does not say how many chunks it sent",
        ),
        (
            "http_response_nil_more",
            {**codec.to_wire_map(HttpResponse(200, (), b"x")), "more": None},
            "more nil: read on to find out whether the body goes on",
        ),
        (
            "admission_nil_inline_result",
            {**codec.to_wire_map(Admission(True, 1, GOOD, False)), "inline_result": None},
            "inline_result nil: the result follows as chunks and an end",
        ),
        (
            "request_nil_inline_result",
            {
                **codec.to_wire_map(Request("req-0006", "f", False, False, None, b"", "args")),
                "accepts_inline_result": None,
            },
            "accepts_inline_result nil: false",
        ),
        (
            "admission_nil_models",
            {**codec.to_wire_map(Admission(True, 1, GOOD, False)), "models": None},
            "models nil: the deployment multiplexes no models",
        ),
        (
            "request_nil_model",
            {
                **codec.to_wire_map(Request("req-0004", "f", False, False, None, b"", "args")),
                "multiplexed_model_id": None,
            },
            "multiplexed_model_id nil: no model",
        ),
    ]


def _columnar_inputs(n: int, seed: int) -> dict[str, Any]:
    # random.Random, not numpy: its stream is stable across versions, so are the vectors.
    rng = random.Random(seed)

    def draw(scale: float, digits: int) -> np.ndarray:
        return np.array([round(rng.random() * scale, digits) for _ in range(n)], np.float64)

    gpu = draw(1.0, 3)
    gpu[draw(1.0, 3) < 0.2] = np.nan
    return dict(
        handle_id="router-b/h7",
        app="shop",
        deployment="ranker",
        sent_at=T0,
        seq=99,
        queued_requests=3.0,
        membership_epoch=4,
        replica_ids=[f"replica-{i:04d}" for i in range(n)],
        running=draw(4.0, 2),
        health_healthy=draw(1.0, 3) < 0.9,
        health_checked_at=T0 - draw(1.0, 2),
        health_failures=np.array([rng.randrange(3) for _ in range(n)], np.int32),
        health_valid=draw(1.0, 3) < 0.7,
        custom={"gpu_util": gpu},
    )


def columnar_vectors() -> list[tuple[str, bytes, str]]:
    (small,) = columnar.encode_handle_report_columnar(**_columnar_inputs(6, 1))
    (with_stats,) = columnar.encode_handle_report_columnar(**_columnar_inputs(3, 4), stats=STATS)
    (empty,) = columnar.encode_handle_report_columnar(
        **{
            **_columnar_inputs(0, 2),
            "custom": None,
            "health_healthy": None,
            "health_checked_at": None,
            "health_failures": None,
            "health_valid": None,
        }
    )
    split = columnar.encode_handle_report_columnar(**_columnar_inputs(40, 3), max_payload=3000)
    out = [
        ("columnar_small", small, "6 replicas, some without health, one custom metric"),
        ("columnar_empty", empty, "no replicas; all health columns absent as nulls"),
        ("columnar_stats", with_stats, "optional request counters (stats v1) as JSON metadata"),
    ]
    out += [
        (f"columnar_split_p{i}", p, f"part {i} of a 40-replica report split at 3000 bytes")
        for i, p in enumerate(split)
    ]
    return out


def _fpc1(batch: pa.RecordBatch, meta: dict[bytes, bytes] | None, **opts: Any) -> bytes:
    sink = pa.BufferOutputStream()
    sink.write(columnar.COLUMNAR_MAGIC)
    schema = batch.schema.with_metadata(meta) if meta is not None else batch.schema
    with pa.ipc.new_stream(sink, schema, options=pa.ipc.IpcWriteOptions(**opts)) as w:
        w.write_batch(batch.replace_schema_metadata(meta))
    return bytes(sink.getvalue().to_pybytes())


def _hostile_columnar(good: bytes) -> list[tuple[str, bytes, str, str]]:
    c = columnar.decode_handle_report_columnar(good)
    schema = pa.ipc.open_stream(good[4:]).schema
    meta = dict(schema.metadata)
    b = c.batch
    cols = b.columns
    neg = pa.array(np.r_[-1.0, np.zeros(b.num_rows - 1)])
    dup_ids = pa.DictionaryArray.from_arrays(
        pa.array(np.zeros(b.num_rows, np.int32)), b.column(0).dictionary
    )
    oob_ids = pa.DictionaryArray.from_arrays(
        pa.array(np.full(b.num_rows, 99, np.int32)), b.column(0).dictionary, safe=False
    )
    f32 = pa.record_batch([cols[0], cols[1].cast(pa.float32()), *cols[2:]], names=b.schema.names)

    def swap(i: int, arr: pa.Array) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays([*cols[:i], arr, *cols[i + 1 :]], schema=b.schema)

    no_seq = {k: v for k, v in meta.items() if k != b"seq"}
    return [
        ("columnar_bad_magic", b"FPC2" + good[4:], "bad_magic", "unknown magic"),
        ("columnar_truncated", good[: len(good) // 2], "malformed", "cut in the middle"),
        (
            "columnar_compressed",
            _fpc1(b, meta, compression="lz4"),
            "bad_schema",
            "compressed IPC bodies are refused (decompression bombs)",
        ),
        ("columnar_negative_running", _fpc1(swap(1, neg), meta), "bad_value", "running < 0"),
        (
            "columnar_duplicate_replica",
            _fpc1(swap(0, dup_ids), meta),
            "duplicate_replica",
            "every row points at the same replica_id",
        ),
        (
            "columnar_index_out_of_range",
            _fpc1(swap(0, oob_ids), meta),
            "malformed",
            "dictionary index past the dictionary",
        ),
        ("columnar_missing_seq", _fpc1(b, no_seq), "missing_field", "metadata without seq"),
        (
            "columnar_part_ge_parts",
            _fpc1(b, {**meta, b"part": b"1", b"parts": b"1"}),
            "bad_value",
            "part must be < parts",
        ),
        (
            "columnar_nan_sent_at",
            _fpc1(b, {**meta, b"sent_at": b"NaN"}),
            "wrong_type",
            "metadata numbers use JSON number syntax (no NaN)",
        ),
        ("columnar_float32_running", _fpc1(f32, meta), "wrong_type", "running_requests as float32"),
    ]


def invalid_vectors() -> list[tuple[str, bytes, str, str, str]]:
    health = codec.to_wire_map(GOOD)
    good = codec.encode(GOOD)
    report = codec.to_wire_map(ReplicaReport("replica-0001", T0, 1, 0.0, {}, None))
    stats = codec.to_wire_map(HANDLE_STATS)["stats"]
    msgpack_cases = [
        ("truncated", good[:-1], "truncated", "last byte missing"),
        ("trailing_bytes", good + b"\x00", "malformed", "a second value after the map"),
        ("not_a_map", _pack([1, "health"]), "not_a_map", "top level is an array"),
        ("version_2", _pack({**health, "v": 2}), "unsupported_version", "v = 2"),
        ("unknown_kind", _pack({**health, "kind": "gossip"}), "unknown_kind", ""),
        (
            "missing_field",
            _pack({k: v for k, v in health.items() if k != "checked_at"}),
            "missing_field",
            "health without checked_at",
        ),
        ("wrong_type", _pack({**health, "healthy": "yes"}), "wrong_type", "healthy as str"),
        (
            "bool_as_int",
            _pack({**health, "consecutive_failures": True}),
            "wrong_type",
            "a bool is not an int",
        ),
        ("nan_float", _pack({**health, "checked_at": float("nan")}), "bad_value", "NaN"),
        ("inf_float", _pack({**health, "checked_at": float("inf")}), "bad_value", "infinity"),
        ("negative_count", _pack({**health, "consecutive_failures": -1}), "bad_value", ""),
        (
            "negative_stats_count",
            _pack({**codec.to_wire_map(HANDLE_STATS), "stats": {**stats, "arrived": -1}}),
            "bad_value",
            "stats v1 counters are >= 0",
        ),
        (
            "admission_rejected_inline_result",
            _pack({**codec.to_wire_map(Admission(False, 1, GOOD, False)), "inline_result": b"x"}),
            "bad_value",
            "a result rides only on an accepted admission",
        ),
        (
            "admission_inline_result_text",
            _pack({**codec.to_wire_map(Admission(True, 1, GOOD, False)), "inline_result": "x"}),
            "wrong_type",
            "admission.inline_result is bin",
        ),
        (
            "admission_model_int",
            _pack({**codec.to_wire_map(Admission(True, 1, GOOD, False)), "models": ["a", 7]}),
            "wrong_type",
            "admission.models holds str ids",
        ),
        (
            "request_empty_model",
            _pack(
                {
                    **codec.to_wire_map(Request("req-0005", "f", False, False, None, b"", "args")),
                    "multiplexed_model_id": "",
                }
            ),
            "bad_value",
            "a model id is not empty",
        ),
        (
            "negative_end_chunks",
            _pack({**codec.to_wire_map(End()), "chunks": -1}),
            "bad_value",
            "end.chunks is a count (>= 0)",
        ),
        (
            "bad_lifecycle_state",
            _pack({**codec.to_wire_map(EXITED), "state": "zombie"}),
            "bad_value",
            "state not in the enum",
        ),
        (
            "lifecycle_http_address_no_port",
            _pack({**codec.to_wire_map(READY), "http_address": "10.0.0.7"}),
            "bad_value",
            "http_address must be host:port",
        ),
        (
            "lifecycle_http_address_port_zero",
            _pack({**codec.to_wire_map(READY), "http_address": "10.0.0.7:0"}),
            "bad_value",
            "http_address port must be 1..65535",
        ),
        (
            "lifecycle_http_address_empty_host",
            _pack({**codec.to_wire_map(READY), "http_address": ":8080"}),
            "bad_value",
            "http_address host must not be empty",
        ),
        (
            "lifecycle_http_address_int",
            _pack({**codec.to_wire_map(READY), "http_address": 8080}),
            "wrong_type",
            "http_address is a string",
        ),
        (
            "huge_str_header",
            b"\x81\xa1v\xdb\xff\xff\xff\xff",
            "truncated",
            "str32 header declaring 4 GiB in an 8-byte payload",
        ),
        ("huge_array_header", b"\xdd\x7f\xff\xff\xff", "malformed", "array32 of 2^31 items"),
        (
            "str_past_end",
            b"\x81\xa1v\xd9\xc8abc",
            "truncated",
            "str8 declaring 200 bytes, 3 present: a str/bin body past the end is truncated",
        ),
        (
            "items_past_end",
            b"\x81\xa1a\xdc\x00\x03\x01",
            "truncated",
            "array16 of 3 items, 1 present: items missing at the end are truncated",
        ),
        (
            "count_past_payload",
            b"\x81\xa1a\xdc\x00\x64\x01\x02\x03",
            "malformed",
            "array16 of 100 items in a 10-byte payload: a count no payload could hold is malformed",
        ),
        (
            "invalid_utf8",
            _pack({**health, "replica_id": "x"}).replace(b"\xa1x", b"\xa1\xff"),
            "malformed",
            "str that is not UTF-8",
        ),
        ("int_map_key", b"\x81\x01\x02", "malformed", "map keys must be strings"),
        (
            "custom_name_too_long",
            _pack({**report, "custom": {"m" * (MAX_CUSTOM_NAME_LEN + 1): 1.0}}),
            "bad_value",
            "a custom metric name is 1-128 UTF-8 bytes, as in custom.<name> columns",
        ),
        (
            "custom_too_many_names",
            _pack({**report, "custom": {f"m{i}": 1.0 for i in range(MAX_CUSTOM_METRICS + 1)}}),
            "bad_value",
            "at most 256 custom metrics per report, as in columnar reports",
        ),
    ]
    out = [(n, d, "msgpack", r, note) for n, d, r, note in msgpack_cases]
    (good_c,) = columnar.encode_handle_report_columnar(**_columnar_inputs(4, 5))
    out += [(n, d, "columnar", r, note) for n, d, r, note in _hostile_columnar(good_c)]
    out.append(
        (
            "columnar_continuation_only",
            struct.pack("<4sI", b"FPC1", 0xFFFFFFFF),
            "columnar",
            "malformed",
            "continuation marker then nothing",
        )
    )
    return out


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode()


JSON_VIEW = (
    "<name>.json of a msgpack vector is exactly the msgpack map its bytes hold, unpacked by any "
    "msgpack library: every key in the bytes' order, nil as null, str as string, bool as "
    "true/false, int as a JSON number without '.' or exponent, float (either width) as one with, "
    'array as array, map as object, bin as {"$bytes_b64": "<standard base64>"}. For a '
    "canonical vector that is also the message as the Python encoder writes it; a non-canonical "
    "entry's `decoded` is the message a reader must decode it to, in that same form (unknown "
    "fields gone, a stats map of an unknown version dropped, ints in float fields as floats)."
)


def msgpack_json_view(data: bytes) -> Any:
    """The JSON view of a msgpack vector: the plain unpacked map (nothing dropped or added)."""
    return jsonview.to_json_value(msgpack.unpackb(data, raw=False))


def _msgpack_entry(name: str, data: bytes, kind: str, canonical: bool, note: str) -> Any:
    decoded = jsonview.message_to_json(codec.decode(data))
    view = msgpack_json_view(data)
    entry: dict[str, Any] = {"name": name, "kind": kind, "canonical": canonical, "note": note}
    if canonical:
        if decoded != view:
            raise SystemExit(f"{name}: the encoder's map and its bytes disagree")
    else:
        entry["decoded"] = decoded
    return entry


def build() -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    index: dict[str, Any] = {
        "version": 1,
        "json_view": JSON_VIEW,
        "bytes_in_json": {"$bytes_b64": "<base64>"},
    }
    entries = []
    messages = [(n, codec.encode(m), m.KIND, True, note) for n, m, note in canonical_messages()]
    messages += [(n, _pack(w), w["kind"], False, note) for n, w, note in lenient_maps()]
    for name, data, kind, canonical, note in messages:
        files[f"{name}.msgpack"] = data
        files[f"{name}.json"] = _json_bytes(msgpack_json_view(data))
        entries.append(_msgpack_entry(name, data, kind, canonical, note))
    index["msgpack"] = entries
    index["columnar"] = []
    for name, data, note in columnar_vectors():
        raw = dict(pa.ipc.open_stream(data[4:]).schema.metadata)
        part = columnar.decode_handle_report_columnar(data)
        files[f"{name}.fpc1"] = data
        files[f"{name}.json"] = _json_bytes(jsonview.columnar_to_json(part, raw))
        index["columnar"].append({"name": name, "note": note})
    invalid = []
    for name, data, decoder, reason, note in invalid_vectors():
        _expect_reason(data, decoder, reason, name)
        files[f"invalid/{name}.bin"] = data
        invalid.append({"file": f"{name}.bin", "decoder": decoder, "reason": reason, "note": note})
    files["invalid/index.json"] = _json_bytes(invalid)
    kv = _sibling("gen_kv_vectors").build()
    files.update({f"kv/{k}": v for k, v in kv.items()})
    # this index lists every file under schemas/vectors; the two folders keep their own index
    # too (the same entries), for readers that start there
    index["invalid"] = {"dir": "invalid", "index": "invalid/index.json", "vectors": invalid}
    kv_index = json.loads(kv["index.json"])
    index["kv"] = {
        "dir": "kv",
        "index": "kv/index.json",
        "documents": kv_index["documents"],
        "invalid": kv_index["invalid"],
    }
    files["index.json"] = _json_bytes(index)
    return files


def _sibling(name: str) -> ModuleType:
    """A script next to this one (scripts/ is not a package: both also run as files)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _expect_reason(data: bytes, decoder: str, reason: str, name: str) -> None:
    try:
        if decoder == "msgpack":
            codec.decode(data)
        else:
            columnar.decode_handle_report_columnar(data)
    except WireError as exc:
        if exc.reason != reason:
            msg = f"invalid/{name}: decoder says {exc.reason!r}, index says {reason!r}"
            raise SystemExit(msg) from None
        return
    raise SystemExit(f"invalid/{name}: decoder accepted it")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    args = ap.parse_args(argv)
    files = build()
    on_disk = {
        str(p.relative_to(VECTORS)): p.read_bytes() for p in VECTORS.rglob("*") if p.is_file()
    }
    if args.check:
        diff = sorted(k for k in files.keys() | on_disk.keys() if files.get(k) != on_disk.get(k))
        for k in diff:
            print(f"differs: schemas/vectors/{k}", file=sys.stderr)
        return 1 if diff else 0
    for stale in on_disk.keys() - files.keys():
        (VECTORS / stale).unlink()
    for rel, data in files.items():
        path = VECTORS / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    print(f"wrote {len(files)} files under {VECTORS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""msgpack codec: round trips, forward compatibility, and one test per rejection rule."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack
import pytest

from shared.errors import UsageError, WireError
from shared.wire import codec, reasons
from shared.wire.limits import MAX_CONTAINERS, MAX_MESSAGE_BYTES
from shared.wire.messages import (
    KINDS,
    LIFECYCLE_STATES,
    MESSAGE_TYPES,
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

H = HealthStatus("r-1", True, 1700000000.25, 0)
ARGS = CallArgs((1, "a", None, [1.5, b"\x00"], {"k": True}), {"x": b"\xff", "y": [1, 2]})
REQ = Request("q1", "__call__", True, False, 1700000030.0, codec.encode(ARGS), "args")
HTTP_REQ = HttpRequest("GET", "/a b/é", "x=1&x=2", (("a", "1"), ("a", "2")), b"body")
HTTP_RESP = HttpResponse(503, (("retry-after", "1"),), b"")
ADMIT = Admission(True, 4, H, True)
CHUNK = Chunk(7, bytes(range(256)))
RR = ReplicaReport("r-1", 1.5, 9, 2.25, {"m": -1.5, "n": 1e300}, H)
HR = HandleReport("h", "app", "dep", 2.0, 1, 3.0, {"r-1": 1.0}, (H,), 5, {"m": {"r-1": 0.5}})
EXITED = Lifecycle("r-1", "ag", "exited", 4.0, "fp.v1.rpc.a.d.r-1", "v1", -9, "a", "d")
PROBE = ProbeRequest(5.0)
SAMPLES: list[WireMessage] = [
    H,
    HealthStatus("r-2", False, 0.0, 2**63),
    REQ,
    Request("q2", "m", False, True, None, b"", "http"),
    ARGS,
    CallArgs((), {}),
    HTTP_REQ,
    HTTP_RESP,
    ADMIT,
    Admission(False, 0, H, False),
    HealthFrame(H),
    Chunk(0, b""),
    CHUNK,
    End(),
    End(3),
    ErrorReply("deadline_exceeded", "too slow", False),
    ReplicaReport("r-1", 1.5, 0, 0.0, {}, None),
    RR,
    HandleReport("h", "app", "dep", 2.0, 1, 0.0, {}, (), 0),
    HR,
    Heartbeat(H, 3.0),
    EXITED,
    Lifecycle("r-1", "", "starting", 4.0, "fp.v1.rpc.a.d.r-1", "v1", None, "a", "d"),
    dataclasses.replace(EXITED, state="ready", exit_code=None, max_ongoing_requests=5),
    dataclasses.replace(EXITED, state="ready", exit_code=None, http_address="[::1]:8080"),
    dataclasses.replace(HR, stats=RequestStats(10, 8, 1.5, 0.5, 0.25, 1, 1, 12, 20, 2.5)),
    PROBE,
    ProbeRequest(5.0, "req-1"),
]


def wire(msg: WireMessage, **changes: Any) -> dict[str, Any]:
    m = dict(codec.to_wire_map(msg))
    for k, v in changes.items():
        if v is DELETE:
            del m[k]
        else:
            m[k] = v
    return m


DELETE = object()


def pack(obj: object) -> bytes:
    return bytes(msgpack.packb(obj, use_bin_type=True))


def reason_of(data: bytes, cls: type[WireMessage] | None = None) -> str:
    with pytest.raises(WireError) as info:
        if cls is None:
            codec.decode(data)
        else:
            codec.decode_as(data, cls)
    return info.value.reason


def test_every_message_type_has_a_sample_and_a_unique_kind() -> None:
    assert {type(m) for m in SAMPLES} == set(MESSAGE_TYPES)
    assert len(KINDS) == len(MESSAGE_TYPES)


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(msg: WireMessage) -> None:
    data = codec.encode(msg)
    assert codec.decode(data) == msg
    assert codec.decode_as(data, type(msg)) == msg
    assert codec.decode(bytearray(data)) == msg
    assert codec.decode(memoryview(data)) == msg


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_wire_map_names_are_the_dataclass_fields(msg: WireMessage) -> None:
    m = codec.to_wire_map(msg)
    assert m["v"] == 1 and m["kind"] == msg.KIND
    # optional fields added after v1 are omitted when unset, so older vectors stay byte-identical
    optional = {f.name for f in dataclasses.fields(msg) if f.name in OPTIONAL_ADDED}
    unset = {n for n in optional if getattr(msg, n) in (None, False)}  # False: a bool's unset
    assert set(m) - {"v", "kind"} == {f.name for f in dataclasses.fields(msg)} - unset


OPTIONAL_ADDED = {
    "stats", "max_ongoing_requests", "request_id", "chunks", "multiplexed_model_id", "models",
    "accepts_inline_result", "inline_result", "http_address", "more",
}  # fmt: skip


def test_stats_of_an_unknown_version_are_skipped_and_bad_counts_refused() -> None:
    stats = codec.to_wire_map(
        dataclasses.replace(HR, stats=RequestStats(3, 2, 1.0, 0.5, 0.0, 0, 0, 2, 2, 1.0))
    )
    assert codec.decode(pack({**stats, "stats": {"v": 2, "anything": "new"}})) == HR
    with pytest.raises(WireError) as exc:
        codec.decode(pack({**stats, "stats": {**stats["stats"], "completed": -1}}))
    assert exc.value.reason == reasons.BAD_VALUE
    with pytest.raises(WireError) as exc:
        codec.decode(pack({**codec.to_wire_map(EXITED), "max_ongoing_requests": 0}))
    assert exc.value.reason == reasons.BAD_VALUE


def test_an_end_may_count_its_chunks_and_older_ends_still_decode() -> None:
    assert codec.decode(pack({"v": 1, "kind": "end"})) == End(None)
    assert codec.decode(pack({"v": 1, "kind": "end", "chunks": None})) == End(None)
    assert codec.decode(pack({"v": 1, "kind": "end", "chunks": 0})) == End(0)
    assert codec.encode(End(2)) == pack({"v": 1, "kind": "end", "chunks": 2})
    with pytest.raises(WireError) as exc:
        codec.decode(pack({"v": 1, "kind": "end", "chunks": -1}))
    assert exc.value.reason == reasons.BAD_VALUE


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_unknown_fields_are_ignored(msg: WireMessage) -> None:
    data = pack(wire(msg, zzz_future={"a": [1, 2]}, extra_bin=b"\x01"))
    assert codec.decode(data) == msg


def test_messages_are_frozen_and_slotted() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        H.healthy = False  # type: ignore[misc]
    assert not hasattr(H, "__dict__")


def test_ints_are_accepted_in_float_fields() -> None:
    msg = codec.decode(pack(wire(H, checked_at=1700000000)))
    assert msg == HealthStatus("r-1", True, 1700000000.0, 0)
    assert type(msg.checked_at) is float


def test_optional_fields_may_be_absent() -> None:
    rr = ReplicaReport("r", 1.0, 1, 0.5, {}, None)
    assert codec.decode(pack(wire(rr, custom=DELETE, health=DELETE))) == rr
    req = Request("q", "m", False, False, None, b"x", "args")
    assert codec.decode(pack(wire(req, deadline=DELETE))) == req
    got = codec.decode(pack(wire(EXITED, exit_code=DELETE)))
    assert got == dataclasses.replace(EXITED, exit_code=None)
    hr = HandleReport("h", "a", "d", 1.0, 1, 0.0, {}, (), 0)
    assert codec.decode(pack(wire(hr, custom=DELETE))) == hr


@pytest.mark.parametrize("msg", [m for m in SAMPLES if dataclasses.fields(m)], ids=repr)
def test_missing_required_field_is_reported_by_name(msg: WireMessage) -> None:
    optional = {"deadline", "custom", "health", "exit_code"}
    for f in dataclasses.fields(msg):
        if isinstance(msg, ReplicaReport | Request | Lifecycle) and f.name in optional:
            continue
        if isinstance(msg, HandleReport) and f.name == "custom":
            continue
        if f.name in OPTIONAL_ADDED:
            continue
        with pytest.raises(WireError) as info:
            codec.decode(pack(wire(msg, **{f.name: DELETE})))
        assert info.value.reason == reasons.MISSING_FIELD
        assert f.name in info.value.detail


@pytest.mark.parametrize(
    ("msg", "field", "value"),
    [
        (H, "replica_id", 5),
        (H, "healthy", 1),
        (H, "checked_at", "1.0"),
        (H, "consecutive_failures", True),
        (H, "consecutive_failures", 1.0),
        (REQ, "body", "text, not bin"),
        (REQ, "deadline", "soon"),
        (ARGS, "args", {"a": 1}),
        (ARGS, "kwargs", [1]),
        (HTTP_REQ, "headers", [["a"]]),
        (HTTP_REQ, "headers", [["a", 1]]),
        (HTTP_REQ, "headers", "a: b"),
        (ADMIT, "health", [1, 2]),
        (ADMIT, "health", {"replica_id": "r", "healthy": "yes"}),
        (RR, "custom", {"m": "high"}),
        (RR, "custom", [1.0]),
        (HR, "running", {"r": None}),
        (HR, "health", [{"replica_id": "r"}]),
        (HR, "custom", {"m": 1.0}),
        (EXITED, "exit_code", 1.5),
        (PROBE, "request_id", 7),
        (End(1), "chunks", "1"),
        (End(1), "chunks", True),
    ],
)
def test_ill_typed_fields_are_rejected(msg: WireMessage, field: str, value: object) -> None:
    with pytest.raises(WireError) as info:
        codec.decode(pack(wire(msg, **{field: value})))
    assert info.value.reason in (reasons.WRONG_TYPE, reasons.MISSING_FIELD)
    assert field in info.value.detail


def test_nested_missing_field_names_the_path() -> None:
    health = {k: v for k, v in codec.to_wire_map(H).items() if k not in ("v", "kind", "healthy")}
    with pytest.raises(WireError) as info:
        codec.decode(pack(wire(ADMIT, health=health)))
    assert info.value.reason == reasons.MISSING_FIELD
    assert info.value.detail.startswith("admission.health.healthy")


@pytest.mark.parametrize(
    ("msg", "field", "value"),
    [
        (H, "checked_at", float("nan")),
        (H, "checked_at", float("inf")),
        (H, "checked_at", float("-inf")),
        (H, "consecutive_failures", -1),
        (REQ, "deadline", float("nan")),
        (REQ, "body_kind", "pickle"),
        (HTTP_RESP, "status", 42),
        (HTTP_RESP, "status", 600),
        (ADMIT, "num_ongoing", -3),
        (CHUNK, "seq", -1),
        (RR, "running_requests", -0.5),
        (RR, "custom", {"m": float("nan")}),
        (HR, "queued_requests", -1.0),
        (HR, "running", {"r": -1.0}),
        (HR, "running", {"r": float("inf")}),
        (HR, "custom", {"m": {"r": float("-inf")}}),
        (RR, "custom", {"": 1.0}),  # custom metric names: 1-128 UTF-8 bytes, at most 256
        (RR, "custom", {"é" * 65: 1.0}),
        (RR, "custom", {f"m{i}": 1.0 for i in range(257)}),
        (HR, "custom", {"x" * 129: {"r": 1.0}}),
        (HR, "membership_epoch", -2),
        (EXITED, "state", "zombie"),
        (PROBE, "sent_at", float("nan")),
    ],
)
def test_bad_values_are_rejected(msg: WireMessage, field: str, value: object) -> None:
    with pytest.raises(WireError) as info:
        codec.decode(pack(wire(msg, **{field: value})))
    assert info.value.reason == reasons.BAD_VALUE
    assert field in info.value.detail


def test_negative_exit_code_and_zero_values_are_legal() -> None:
    lc = Lifecycle("r", "a", "exited", 0.0, "s", "v", -15, "a", "d")
    assert codec.decode(codec.encode(lc)) == lc
    assert set(LIFECYCLE_STATES) == {"starting", "ready", "draining", "exited"}


def test_envelope_errors() -> None:
    good = codec.encode(H)
    assert reason_of(pack(wire(H, v=2))) == reasons.UNSUPPORTED_VERSION
    assert reason_of(pack(wire(H, v="1"))) == reasons.UNSUPPORTED_VERSION
    assert reason_of(pack(wire(H, v=DELETE))) == reasons.MISSING_FIELD
    assert reason_of(pack(wire(H, kind=DELETE))) == reasons.MISSING_FIELD
    assert reason_of(pack(wire(H, kind=7))) == reasons.WRONG_TYPE
    assert reason_of(pack(wire(H, kind="gossip"))) == reasons.UNKNOWN_KIND
    assert reason_of(pack([1, 2])) == reasons.NOT_A_MAP
    assert reason_of(b"") == reasons.TRUNCATED
    assert reason_of(good[:-1]) == reasons.TRUNCATED
    assert reason_of(good + b"\xc0") == reasons.MALFORMED
    assert reason_of(b"\xc1") == reasons.MALFORMED
    assert reason_of(b"\x81\x01\x02") == reasons.MALFORMED  # int map key
    assert reason_of("text") == reasons.NOT_BYTES  # type: ignore[arg-type]


def test_oversize_is_rejected_before_parsing() -> None:
    data = b"\x80" + b"\x00" * MAX_MESSAGE_BYTES
    assert reason_of(data) == reasons.OVERSIZE


def test_container_count_is_bounded() -> None:
    # top-level map + kwargs map + args array = 3 containers, then k empty arrays.
    def args_with(k: int) -> bytes:
        head = pack({"v": 1, "kind": "args", "kwargs": {}})
        return b"\x84" + head[1:] + pack("args") + b"\xdd" + k.to_bytes(4, "big") + b"\x90" * k

    ok = codec.decode(args_with(MAX_CONTAINERS - 3))
    assert isinstance(ok, CallArgs) and len(ok.args) == MAX_CONTAINERS - 3
    assert reason_of(args_with(MAX_CONTAINERS - 2)) == reasons.MALFORMED


def test_decode_as_checks_the_kind() -> None:
    data = codec.encode(H)
    assert codec.decode_as(data, HealthStatus) == H
    with pytest.raises(WireError) as info:
        codec.decode_as(data, Heartbeat)
    assert info.value.reason == reasons.UNEXPECTED_KIND
    assert "health" in info.value.detail and "heartbeat" in info.value.detail
    assert reason_of(pack(wire(H, kind="gossip")), HealthStatus) == reasons.UNKNOWN_KIND


def test_decode_body_follows_body_kind() -> None:
    assert codec.decode_body(REQ) == ARGS
    http = HttpRequest("GET", "/", "", (), b"")
    assert (
        codec.decode_body(Request("q", "m", False, False, None, codec.encode(http), "http")) == http
    )
    wrong = Request("q", "m", False, False, None, codec.encode(http), "args")
    with pytest.raises(WireError) as info:
        codec.decode_body(wrong)
    assert info.value.reason == reasons.UNEXPECTED_KIND


def test_encode_misuse_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        codec.encode(CallArgs((object(),), {}))
    with pytest.raises(UsageError):
        codec.encode(Chunk(2**64, b""))
    with pytest.raises(UsageError):
        codec.encode(Chunk(0, b"\x00" * (MAX_MESSAGE_BYTES + 1)))
    with pytest.raises(UsageError):
        codec.encode("not a message")  # type: ignore[arg-type]


def test_encoding_is_deterministic_and_compact() -> None:
    assert codec.encode(End()) == pack({"v": 1, "kind": "end"})
    assert codec.encode(H) == codec.encode(HealthStatus("r-1", True, 1700000000.25, 0))

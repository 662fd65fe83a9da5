"""The request path's decoders check the usual message inline and hand anything else to the
field readers: whatever the map, both ways must agree (the same message, or the same error)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.errors import UsageError, WireError
from shared.wire import codec, uservalues
from shared.wire.messages import BODY_KINDS, Admission, CallArgs, HealthStatus, Request

# half the time a value at a type's edge (what an inline check most easily lets through)
edge = st.sampled_from([math.inf, -math.inf, math.nan, -1, 0, 1, 1.0, True, False, "", b"", None])
anything = st.integers(-3, 2**64 - 1) | st.floats() | st.text(max_size=4) | st.binary(max_size=4)
odd = edge | anything | st.lists(st.integers(), max_size=2) | st.dictionaries(st.text(), edge)
health = st.builds(
    HealthStatus,
    st.text(max_size=8),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(0, 9),
)
requests = st.builds(
    Request,
    st.text(max_size=8),
    st.text(max_size=8),
    st.booleans(),
    st.booleans(),
    st.none() | st.floats(allow_nan=False, allow_infinity=False),
    st.binary(max_size=8),
    st.sampled_from(BODY_KINDS),
    st.none() | st.text(min_size=1, max_size=4),
    st.booleans(),
)
admissions = st.builds(
    Admission,
    st.booleans(),
    st.integers(0, 9),
    health,
    st.booleans(),
    st.none() | st.lists(st.text(min_size=1, max_size=4), max_size=2).map(tuple),
    st.none() | st.binary(max_size=8),
)
args = st.builds(
    CallArgs,
    st.lists(st.integers(-(2**63), 2**64 - 1) | st.text(max_size=4), max_size=3).map(tuple),
    st.dictionaries(st.text(max_size=4), st.integers(-(2**63), 2**64 - 1), max_size=2),
)


def _outcome(decoder: Callable[[dict[str, Any]], object], m: dict[str, Any]) -> object:
    try:
        return decoder(m)
    except WireError as exc:
        return ("error", exc.reason, str(exc))


def _mutate(m: dict[str, Any], data: st.DataObject) -> dict[str, Any]:
    """The map of a message with some fields replaced by odd values, removed, or nested ones
    (the health map) changed: valid or not, what a peer could send."""
    m = dict(m)
    for _ in range(data.draw(st.integers(1, 3))):
        key = data.draw(st.sampled_from(sorted(m)))
        action = data.draw(st.sampled_from(("replace", "remove", "nested")))
        if action == "remove":
            m.pop(key)
        elif action == "nested" and type(m[key]) is dict and m[key]:
            inner = dict(m[key])
            inner[data.draw(st.sampled_from(sorted(inner)))] = data.draw(odd)
            m[key] = inner
        else:
            m[key] = data.draw(odd)
    return m


EDGES = [
    math.inf,
    -math.inf,
    math.nan,
    -1,
    0,
    1,
    1.0,
    True,
    False,
    "",
    "x",
    b"",
    b"x",
    None,
    [],
    {},
]


def _every_edge(m: dict[str, Any]) -> list[dict[str, Any]]:
    """Each field (and each field of a nested map) set in turn to each edge value, or removed."""
    out = []
    for key, value in m.items():
        out.append({k: v for k, v in m.items() if k != key})
        out.extend({**m, key: e} for e in EDGES)
        if type(value) is dict:
            for inner in value:
                out.extend({**m, key: {**value, inner: e}} for e in EDGES)
    return out


def _map_of(msg: Any) -> dict[str, Any]:
    m = msgpack.unpackb(codec.encode(msg))
    assert type(m) is dict
    return m


@settings(max_examples=150)
@given(req=requests, data=st.data())
def test_request_fast_path_agrees_with_the_field_readers(req: Request, data: st.DataObject) -> None:
    m = _map_of(req)
    assert codec._d_request(m) == codec._d_request_checked(m) == req
    for bent in [_mutate(m, data), *_every_edge(m)]:
        assert _outcome(codec._d_request, bent) == _outcome(codec._d_request_checked, bent), bent


@settings(max_examples=150)
@given(adm=admissions, data=st.data())
def test_admission_fast_path_agrees_with_the_field_readers(
    adm: Admission, data: st.DataObject
) -> None:
    if not adm.accepted and adm.inline_result is not None:
        adm = Admission(False, adm.num_ongoing, adm.health, adm.will_send_health_frames)
    m = _map_of(adm)
    assert codec._d_admission(m) == codec._d_admission_checked(m) == adm
    for bent in [_mutate(m, data), *_every_edge(m)]:
        assert _outcome(codec._d_admission, bent) == _outcome(codec._d_admission_checked, bent)


@settings(max_examples=150)
@given(call=args, data=st.data())
def test_call_args_fast_path_agrees_with_the_field_readers(
    call: CallArgs, data: st.DataObject
) -> None:
    m = _map_of(call)
    assert codec._d_args(m) == codec._d_args_checked(m) == call
    for bent in [_mutate(m, data), *_every_edge(m)]:
        assert _outcome(codec._d_args, bent) == _outcome(codec._d_args_checked, bent)


def test_a_header_claiming_more_than_the_payload_fails_fast() -> None:
    # the bounds now come from msgpack's own defaults (every length <= the payload's size)
    for header in (b"\xdd\x7f\xff\xff\xff", b"\xdf\x7f\xff\xff\xff", b"\xdb\x7f\xff\xff\xff"):
        try:
            codec.unpack_map(header)
        except WireError as exc:
            assert exc.reason in ("malformed", "truncated")
        else:
            raise AssertionError(f"{header!r} decoded")


@settings(max_examples=150)
@given(req=requests)
def test_encode_request_writes_the_bytes_encode_writes(req: Request) -> None:
    fields = (
        req.request_id, req.method, req.supports_health_frames, req.stream, req.deadline,
        req.body, req.body_kind, req.multiplexed_model_id, req.accepts_inline_result,
    )  # fmt: skip
    assert codec.encode_request(*fields) == codec.encode(req)


def test_a_kept_packer_packs_again_after_a_failure_and_inside_its_own_default() -> None:
    class Odd:
        pass

    with pytest.raises(UsageError):
        codec.encode(CallArgs((Odd(),), {}))
    assert codec.encode(CallArgs((1,), {})) == msgpack.packb(
        {"v": 1, "kind": "args", "args": [1], "kwargs": {}}, use_bin_type=True
    )

    class Nested:  # a default hook that packs a wire message itself (re-entrant pack)
        pass

    def default(value: object) -> object:
        if isinstance(value, Nested):
            return codec.encode(CallArgs(("inner",), {}))
        raise TypeError("no")

    inner = codec.encode(CallArgs(("inner",), {}))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(uservalues, "_default", default)
        mp.setattr(uservalues._PACKERS, "packer", None)  # a new packer takes the new hook
        outer = uservalues.pack([Nested(), "after"])
    assert msgpack.unpackb(outer) == [inner, "after"]
    assert uservalues._PACKERS.packer is None or uservalues._PACKERS.packer.pack(1) == b"\x01"


def test_a_packer_that_grew_is_not_kept() -> None:
    uservalues.pack(b"x" * (uservalues.KEEP_PACKER_BYTES + 1))
    assert uservalues._PACKERS.packer is None
    uservalues.pack(b"small")
    assert uservalues._PACKERS.packer is not None


@settings(max_examples=100)
@given(msg=requests | admissions | args, data=st.data())
def test_kind_fast_path_agrees_with_the_field_readers(msg: Any, data: st.DataObject) -> None:
    m = _map_of(msg)
    assert codec._kind(m) == codec._kind_checked(m) == msg.KIND
    kinds = st.sampled_from(["request", "nope", "args" * 20]) | odd
    for bent in [
        _mutate(m, data),
        *_every_edge({"v": m["v"], "kind": m["kind"]}),
        {**m, "kind": data.draw(kinds)},
    ]:
        assert _outcome(codec._kind, bent) == _outcome(codec._kind_checked, bent), bent

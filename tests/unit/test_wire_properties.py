"""Property tests: every message type survives encode -> decode, and the JSON view, unchanged."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.wire import codec, jsonview
from shared.wire.messages import (
    BODY_KINDS,
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
    WireMessage,
)

text = st.text(max_size=24)
finite = st.floats(allow_nan=False, allow_infinity=False)
nonneg = st.floats(min_value=0.0, allow_nan=False, allow_infinity=False)
count = st.integers(0, 2**64 - 1)
blob = st.binary(max_size=64)
headers = st.lists(st.tuples(text, text), max_size=4).map(tuple)
health = st.builds(HealthStatus, text, st.booleans(), finite, count)
float_map = st.dictionaries(text, finite, max_size=5)
metric_name = st.text(min_size=1, max_size=24)  # 1-128 UTF-8 bytes (docs/wire.md)
custom_map = st.dictionaries(metric_name, finite, max_size=5)
msgpack_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | finite | text | blob,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)

STRATEGIES: dict[type, st.SearchStrategy[Any]] = {
    HealthStatus: health,
    Request: st.builds(
        Request,
        text,
        text,
        st.booleans(),
        st.booleans(),
        st.none() | finite,
        blob,
        st.sampled_from(BODY_KINDS),
    ),
    CallArgs: st.builds(
        CallArgs,
        st.lists(msgpack_value, max_size=5).map(tuple),
        st.dictionaries(text, msgpack_value, max_size=5),
    ),
    HttpRequest: st.builds(HttpRequest, text, text, text, headers, blob),
    HttpResponse: st.builds(HttpResponse, st.integers(100, 599), headers, blob),
    Admission: st.builds(Admission, st.booleans(), count, health, st.booleans()),
    HealthFrame: st.builds(HealthFrame, health),
    Chunk: st.builds(Chunk, count, blob),
    End: st.builds(End, st.none() | count),
    ErrorReply: st.builds(ErrorReply, text, text, st.booleans()),
    ReplicaReport: st.builds(
        ReplicaReport, text, finite, count, nonneg, custom_map, st.none() | health
    ),
    HandleReport: st.builds(
        HandleReport,
        text,
        text,
        text,
        finite,
        count,
        nonneg,
        st.dictionaries(text, nonneg, max_size=6),
        st.lists(health, max_size=4).map(tuple),
        count,
        st.dictionaries(metric_name, float_map, max_size=3),
    ),
    Heartbeat: st.builds(Heartbeat, health, finite),
    Lifecycle: st.builds(
        Lifecycle,
        text,
        text,
        st.sampled_from(LIFECYCLE_STATES),
        finite,
        text,
        text,
        st.none() | st.integers(-(2**63), 2**63 - 1),
        text,
        text,
    ),
    ProbeRequest: st.builds(ProbeRequest, finite, st.none() | text),
}


def test_every_message_type_has_a_strategy() -> None:
    assert set(STRATEGIES) == set(MESSAGE_TYPES)


@pytest.mark.parametrize("cls", MESSAGE_TYPES, ids=lambda c: c.__name__)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_round_trip(cls: type[WireMessage], data: st.DataObject) -> None:
    msg = data.draw(STRATEGIES[cls])
    encoded = codec.encode(msg)
    assert codec.decode(encoded) == msg
    assert codec.decode_as(encoded, cls) == msg
    # Re-encoding the decoded message is byte-identical: the encoding is canonical.
    assert codec.encode(codec.decode(encoded)) == encoded


@pytest.mark.parametrize("cls", MESSAGE_TYPES, ids=lambda c: c.__name__)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_json_view_round_trip(cls: type[WireMessage], data: st.DataObject) -> None:
    msg = data.draw(STRATEGIES[cls])
    assert jsonview.message_from_json(jsonview.message_to_json(msg)) == msg

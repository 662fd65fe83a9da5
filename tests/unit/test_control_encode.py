"""TargetSet.encode writes the replica list by hand (speed); its bytes must stay exactly those of
`json.dumps(asdict-based document, sort_keys=True)`, the encoding it replaced."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.control import ReplicaTarget, TargetSet


def reference_encode(t: TargetSet) -> bytes:
    """The previous implementation, kept verbatim as the oracle."""
    doc = {
        "v": 1,
        "kind": "targets",
        "app": t.app,
        "deployment": t.deployment,
        "version": t.version,
        "owner_epoch": t.owner_epoch,
        "membership_epoch": t.membership_epoch,
        "replicas": [asdict(r) for r in t.replicas],
        "config": dict(t.config),
    }
    return json.dumps(doc, sort_keys=True).encode()


# every code point class json escapes differently: quotes, backslashes, controls, non-ASCII,
# astral (surrogate pairs in \u escapes)
text = st.text(
    alphabet=st.one_of(
        st.sampled_from('"\\/\b\f\n\r\t\x00\x1f\x7f'),
        st.characters(codec="utf-8"),
    ),
    max_size=12,
)
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), text)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(text, inner, max_size=3)),
    max_leaves=10,
)
replica = st.builds(ReplicaTarget, text, text, text, text, text)
target_set = st.builds(
    TargetSet,
    app=text,
    deployment=text,
    version=text,
    owner_epoch=st.integers(min_value=0, max_value=2**63),
    membership_epoch=st.integers(min_value=0, max_value=2**63),
    replicas=st.lists(replica, max_size=20).map(tuple),
    config=st.dictionaries(text, json_value, max_size=5),
)


@settings(max_examples=300, deadline=None)
@given(target_set)
def test_encode_is_byte_identical_to_the_asdict_encoding(t: TargetSet) -> None:
    assert t.encode() == reference_encode(t)


@given(target_set)
def test_encode_round_trips(t: TargetSet) -> None:
    back = TargetSet.decode(t.encode())
    assert back.replicas == t.replicas
    assert (back.app, back.deployment, back.version) == (t.app, t.deployment, t.version)
    assert back.config == json.loads(json.dumps(dict(t.config)))


def test_config_keys_that_look_like_the_replica_list_are_left_alone() -> None:
    t = TargetSet(
        "a", "d", "v", 1, 2, (ReplicaTarget("r-1", "v", "RUNNING"),),
        {"replicas": None, "x": '"replicas": null'},
    )  # fmt: skip
    assert t.encode() == reference_encode(t)


def test_a_field_that_is_not_a_string_takes_the_slow_path_with_the_same_bytes() -> None:
    odd: Any = 7  # typed str, but json must decide how anything else looks
    t = TargetSet(
        "a", "d", "v", 1, 2,
        (ReplicaTarget("r-1", "v", "RUNNING"), ReplicaTarget("r-2", "v", "RUNNING", odd)),
        {},
    )  # fmt: skip
    assert t.encode() == reference_encode(t)


def test_empty_and_large_sets() -> None:
    for n in (0, 1, 5000):
        reps = tuple(
            ReplicaTarget(f"app-dep-ab12-{i:x}", "v1", "RUNNING", "", f"fp.v1.rpc.app.dep.{i:x}")
            for i in range(n)
        )
        t = TargetSet("app", "dep", "v1", 3, 9, reps, {"name": "dep", "n": n})
        assert t.encode() == reference_encode(t)

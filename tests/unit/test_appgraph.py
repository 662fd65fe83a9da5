"""Handle markers in stored constructor arguments (shared/appgraph.py): properties."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from shared.appgraph import HANDLE_KEY, handle_ref, ref_name, referenced, replace_refs

names = st.from_regex(r"[A-Za-z][A-Za-z0-9_-]{0,8}", fullmatch=True)
scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=5)
values = st.recursive(
    scalars | names.map(handle_ref),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=4).filter(lambda k: k != HANDLE_KEY), inner, max_size=4)
    ),
    max_leaves=20,
)


def _names(value: Any) -> set[str]:
    if ref_name(value) is not None:
        return {value[HANDLE_KEY]}
    if isinstance(value, list):
        return set().union(*map(_names, value)) if value else set()
    if isinstance(value, dict):
        return set().union(*map(_names, value.values())) if value else set()
    return set()


@given(values)
def test_every_marker_is_found_and_replaced(value: Any) -> None:
    assert referenced(value) == _names(value)
    assert replace_refs(value, handle_ref) == value  # replacing by itself changes nothing
    replaced = replace_refs(value, lambda name: ("handle", name))
    assert referenced(replaced) == set()


def test_a_marker_is_exactly_one_key() -> None:
    assert ref_name({HANDLE_KEY: "A"}) == "A"
    assert ref_name({HANDLE_KEY: "A", "other": 1}) is None
    assert ref_name({HANDLE_KEY: 3}) is None

"""The staleness gate: per-source (sent_at, seq) ordering, split parts, retention."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.controller.staleness import (
    MIN_SOURCE_TIMEOUT_S,
    SourceGate,
    Verdict,
    source_timeout_s,
)


def test_first_report_is_accepted() -> None:
    gate = SourceGate()
    assert gate.admit("h", 100.0, 1, recv=0.0) is Verdict.NEW_REPORT
    assert gate.last("h") == (100.0, 1)
    assert gate.complete("h")


def test_older_report_is_stale() -> None:
    gate = SourceGate()
    gate.admit("h", 100.0, 5, recv=0.0)
    assert gate.admit("h", 99.0, 9, recv=1.0) is Verdict.STALE  # older sent_at, any seq
    assert gate.admit("h", 100.0, 4, recv=1.0) is Verdict.STALE  # same sent_at, older seq
    assert gate.last("h") == (100.0, 5)
    assert gate.last_recv("h") == 0.0


def test_duplicate_is_dropped() -> None:
    gate = SourceGate()
    gate.admit("h", 100.0, 5, recv=0.0)
    assert gate.admit("h", 100.0, 5, recv=1.0) is Verdict.DUPLICATE
    assert gate.last_recv("h") == 0.0


def test_newer_report_is_accepted_lexicographically() -> None:
    gate = SourceGate()
    gate.admit("h", 100.0, 5, recv=0.0)
    assert gate.admit("h", 100.0, 6, recv=1.0) is Verdict.NEW_REPORT
    # A restarted sender resets seq but its wall clock moved on: sent_at decides first.
    assert gate.admit("h", 101.0, 0, recv=2.0) is Verdict.NEW_REPORT
    assert gate.last("h") == (101.0, 0)


def test_split_parts_each_accepted_once() -> None:
    gate = SourceGate()
    assert gate.admit("h", 100.0, 1, recv=0.0, part=1, parts=3) is Verdict.NEW_REPORT
    assert not gate.complete("h")
    assert gate.admit("h", 100.0, 1, recv=0.1, part=0, parts=3) is Verdict.NEW_PART
    assert gate.admit("h", 100.0, 1, recv=0.2, part=1, parts=3) is Verdict.DUPLICATE
    assert not gate.complete("h")
    assert gate.admit("h", 100.0, 1, recv=0.3, part=2, parts=3) is Verdict.NEW_PART
    assert gate.complete("h")
    assert gate.last_recv("h") == 0.3


def test_part_of_an_older_report_is_stale() -> None:
    gate = SourceGate()
    gate.admit("h", 100.0, 1, recv=0.0, part=0, parts=2)
    assert gate.admit("h", 101.0, 2, recv=1.0, part=0, parts=2) is Verdict.NEW_REPORT
    # The rest of the superseded report arrives late.
    assert gate.admit("h", 100.0, 1, recv=1.1, part=1, parts=2) is Verdict.STALE
    assert not gate.complete("h")


def test_check_records_nothing_and_sources_are_independent() -> None:
    gate = SourceGate()
    assert gate.check("a", 5.0, 1) is Verdict.NEW_REPORT
    assert "a" not in gate
    gate.admit("a", 5.0, 1, recv=0.0)
    assert gate.admit("b", 1.0, 0, recv=0.0) is Verdict.NEW_REPORT
    assert gate.check("a", 5.0, 1) is Verdict.DUPLICATE
    assert len(gate) == 2


def test_prune_and_forget_by_receipt_time() -> None:
    gate = SourceGate()
    gate.admit("old", 1e9, 1, recv=10.0)
    gate.admit("new", 1.0, 1, recv=20.0)  # sent_at is a remote clock: never used for age
    assert gate.prune(older_than=15.0) == ["old"]
    assert "old" not in gate and "new" in gate
    gate.forget("new")
    assert len(gate) == 0
    assert gate.last("new") is None and gate.last_recv("new") is None


def test_source_timeout() -> None:
    assert source_timeout_s(1.0) == MIN_SOURCE_TIMEOUT_S
    assert source_timeout_s(5.0) == 10.0
    assert source_timeout_s(20.0) == 40.0


events = st.lists(
    st.tuples(
        st.integers(0, 4).map(float),  # sent_at
        st.integers(0, 3),  # seq
        st.integers(0, 2),  # part (of 3)
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(events=events)
def test_gate_properties(events: list[tuple[float, int, int]]) -> None:
    gate = SourceGate()
    accepted: list[tuple[float, int, int]] = []
    for i, (sent_at, seq, part) in enumerate(events):
        newest = max(((a, b) for a, b, _ in accepted), default=None)
        verdict = gate.admit("src", sent_at, seq, recv=float(i), part=part, parts=3)
        if newest is None or (sent_at, seq) > newest:
            assert verdict is Verdict.NEW_REPORT  # anything newer always gets in
        elif (sent_at, seq) < newest:
            assert verdict is Verdict.STALE
        else:
            want = Verdict.DUPLICATE if (sent_at, seq, part) in accepted else Verdict.NEW_PART
            assert verdict is want
        if verdict.accepted:
            accepted.append((sent_at, seq, part))
    keys = [(a, b) for a, b, _ in accepted]
    assert keys == sorted(keys)  # accepted reports never go back in time
    assert len(set(accepted)) == len(accepted)  # each part at most once


def test_same_key_with_another_part_count_is_a_duplicate() -> None:
    gate = SourceGate()
    gate.admit("h", 100.0, 1, recv=0.0)  # a whole (single-part) report
    assert gate.admit("h", 100.0, 1, recv=0.1, part=1, parts=2) is Verdict.DUPLICATE
    assert gate.complete("h")

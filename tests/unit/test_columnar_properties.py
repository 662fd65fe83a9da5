"""Property tests for FPC1: any report, split under any max_payload, recombines to the original."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.wire.columnar import (
    ColumnarHandleReport,
    columnar_parts_to_handle_report,
    decode_handle_report_columnar,
    encode_handle_report_columnar,
    handle_report_to_columnar,
)
from shared.wire.messages import HandleReport, HealthStatus

MAX_WIDTH = 2000
# 1..128 UTF-8 bytes: the legal size of a custom metric name (dots and non-ASCII included).
metric_name = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=32).filter(
    lambda s: len(s.encode()) <= 128
)
replica_id = st.text(st.characters(blacklist_categories=("Cs",)), min_size=0, max_size=40)


@st.composite
def wide_reports(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(0, 50) | st.integers(500, MAX_WIDTH))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    names = draw(st.lists(metric_name, max_size=4, unique=True))
    scale = draw(st.sampled_from([0.0, 1.0, 1e9]))
    health = draw(st.sampled_from(["none", "all", "some"]))
    args: dict[str, Any] = dict(
        handle_id=draw(replica_id), app="app", deployment="dep",
        sent_at=draw(st.floats(-1e12, 1e12)), seq=draw(st.integers(0, 2**64 - 1)),
        queued_requests=draw(st.floats(0, 1e9)), membership_epoch=draw(st.integers(0, 2**64 - 1)),
        replica_ids=[f"replica-{i}-{rng.integers(1 << 30)}" for i in range(n)],
        running=rng.random(n) * scale,
        custom={name: np.where(rng.random(n) < 0.2, np.nan, rng.normal(size=n) * 1e3)
                for name in names},
    )  # fmt: skip
    if health != "none":
        args["health_healthy"] = rng.random(n) < 0.5
        args["health_checked_at"] = 1.7e9 + rng.random(n)
        args["health_failures"] = rng.integers(0, 2**31 - 1, n)
        args["health_valid"] = None if health == "all" else rng.random(n) < 0.5
    low = 8_000 + 500 * len(names)  # always room for one row; small limits force many parts
    args["max_payload"] = draw(st.integers(low, 40_000) | st.integers(low, 2_000_000))
    return args


def _merged(parts: list[ColumnarHandleReport], getter: Any) -> np.ndarray:
    arrays = [getter(c) for c in parts]
    return np.concatenate(arrays) if arrays else np.zeros(0)


@settings(max_examples=40, deadline=None)
@given(args=wide_reports())
def test_split_and_recombine(args: dict[str, Any]) -> None:
    encoded = encode_handle_report_columnar(**args)
    assert all(len(p) <= args["max_payload"] for p in encoded)
    parts = [decode_handle_report_columnar(p) for p in encoded]
    assert [c.part for c in parts] == list(range(len(parts)))
    for c in parts:
        assert (c.parts, c.seq, c.sent_at, c.handle_id) == (
            len(parts), args["seq"], args["sent_at"], args["handle_id"],
        )  # fmt: skip
        assert (c.queued_requests, c.membership_epoch) == (
            args["queued_requests"], args["membership_epoch"],
        )  # fmt: skip
    n = len(args["replica_ids"])
    assert [r for c in parts for r in c.replica_id_list()] == args["replica_ids"]
    assert np.array_equal(_merged(parts, lambda c: c.running), args["running"])
    valid = _merged(parts, lambda c: c.health_valid)
    if "health_healthy" not in args:
        assert not valid.any()
    else:
        want_valid = args["health_valid"] if args["health_valid"] is not None else np.ones(n, bool)
        assert np.array_equal(valid, want_valid)
        healthy = _merged(parts, lambda c: c.health_healthy)
        checked = _merged(parts, lambda c: c.health_checked_at)
        failures = _merged(parts, lambda c: c.health_failures)
        assert np.array_equal(healthy[valid], args["health_healthy"][want_valid])
        assert np.array_equal(checked[valid], args["health_checked_at"][want_valid])
        assert np.array_equal(failures[valid], args["health_failures"][want_valid])
    for name, values in args["custom"].items():
        got = _merged(parts, lambda c, name=name: c.custom(name))
        assert np.array_equal(got, values, equal_nan=True)


health = st.builds(
    HealthStatus, replica_id, st.booleans(), st.floats(-1e12, 1e12), st.integers(0, 2**31 - 1)
)


@st.composite
def object_reports(draw: st.DrawFn) -> HandleReport:
    running = draw(st.dictionaries(replica_id, st.floats(0, 1e9), max_size=60))
    known = list(running)
    # Health and custom values name replicas that have a running entry, so nothing is added.
    healths = draw(st.lists(health, max_size=20, unique_by=lambda h: h.replica_id)) if known else []
    healths = [h for h in healths if h.replica_id in running] + [
        HealthStatus(r, True, 1.0, 0)
        for r in known[: draw(st.integers(0, len(known)))]
        if r not in {h.replica_id for h in healths}
    ]
    custom = {
        name: {r: draw(st.floats(-1e6, 1e6)) for r in known if draw(st.booleans())}
        for name in draw(st.lists(metric_name, max_size=3, unique=True))
    }
    return HandleReport(
        handle_id=draw(replica_id), app="a", deployment="d", sent_at=draw(st.floats(0, 2e9)),
        seq=draw(st.integers(0, 2**64 - 1)), queued_requests=draw(st.floats(0, 1e6)),
        running=running, health=tuple(healths), membership_epoch=draw(st.integers(0, 2**32)),
        custom=custom,
    )  # fmt: skip


def _row_order(rep: HandleReport) -> HandleReport:
    """Columnar health comes back in row (running) order; object health may be in any order."""
    order = {r: i for i, r in enumerate(rep.running)}
    return HandleReport(
        rep.handle_id, rep.app, rep.deployment, rep.sent_at, rep.seq, rep.queued_requests,
        rep.running, tuple(sorted(rep.health, key=lambda h: order[h.replica_id])),
        rep.membership_epoch, rep.custom,
    )  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(rep=object_reports(), max_payload=st.integers(6_000, 100_000))
def test_object_columnar_object_preserves_data(rep: HandleReport, max_payload: int) -> None:
    parts = [decode_handle_report_columnar(p) for p in handle_report_to_columnar(rep, max_payload)]
    assert columnar_parts_to_handle_report(parts) == _row_order(rep)

"""DeploymentMetrics: staleness, format switching, running-replica gate, expiry, aggregates,
health extraction, and object path == columnar path (hypothesis)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.controller.metrics_store import DeploymentMetrics
from services.controller.metrics_types import (
    ACCEPTED,
    DUPLICATE,
    NOT_RUNNING,
    STALE,
    UNKNOWN_REPLICA,
    HealthBatch,
    IngestResult,
)
from services.controller.replica_index import ReplicaIndex
from shared.errors import UsageError
from shared.wire.columnar import (
    ColumnarHandleReport,
    decode_handle_report_columnar,
    encode_handle_report_columnar,
    handle_report_to_columnar,
)
from shared.wire.messages import HandleReport, HealthStatus, ReplicaReport

INTERVAL = 10.0
TIMEOUT = 20.0  # max(2 x 10 s, 10 s)
SPLIT_PAYLOAD = 9_000  # small enough to split a few hundred rows into parts


def store_for(
    ids: list[str], running: list[str] | None = None
) -> tuple[ReplicaIndex, DeploymentMetrics]:
    index = ReplicaIndex()
    index.sync(ids)
    store = DeploymentMetrics(index, INTERVAL)
    store.set_running(ids if running is None else running)
    return index, store


def hr(
    handle: str,
    seq: int,
    running: dict[str, float],
    *,
    queued: float = 0.0,
    health: tuple[HealthStatus, ...] = (),
    custom: dict[str, dict[str, float]] | None = None,
    sent_at: float | None = None,
    epoch: int = 1,
) -> HandleReport:
    return HandleReport(
        handle_id=handle,
        app="app",
        deployment="dep",
        sent_at=1000.0 + seq if sent_at is None else sent_at,
        seq=seq,
        queued_requests=queued,
        running=running,
        health=health,
        membership_epoch=epoch,
        custom=custom or {},
    )


def rr(
    replica: str,
    seq: int,
    running: float,
    custom: dict[str, float] | None = None,
    health: HealthStatus | None = None,
) -> ReplicaReport:
    return ReplicaReport(replica, 1000.0 + seq, seq, running, custom or {}, health)


def col(report: HandleReport, max_payload: int = 1 << 20) -> list[ColumnarHandleReport]:
    return [
        decode_handle_report_columnar(p) for p in handle_report_to_columnar(report, max_payload)
    ]


def split_col(report: HandleReport, reverse: bool = False) -> list[ColumnarHandleReport]:
    """The report in as many parts as a limit just under its single-part size gives (one part if
    it cannot split), optionally delivered in reverse order."""
    size = len(handle_report_to_columnar(report)[0])
    try:
        parts = col(report, size - 1)
    except UsageError:  # one row, or padding makes no part smaller than the whole
        parts = col(report)
    return parts[::-1] if reverse else parts


def ingest_col(store: DeploymentMetrics, report: HandleReport, recv: float) -> IngestResult:
    results = [store.ingest_columnar(c, recv) for c in col(report)]
    assert len(results) == 1
    return results[0]


# -- staleness through the store ------------------------------------------------------------


@pytest.mark.parametrize("columnar", [False, True])
def test_older_and_duplicate_handle_reports_are_dropped(columnar: bool) -> None:
    _, store = store_for(["a", "b"])

    def ingest(r: HandleReport) -> IngestResult:
        return ingest_col(store, r, 0.0) if columnar else store.ingest_handle_report(r, 0.0)

    assert ingest(hr("h", 5, {"a": 3.0}, queued=2.0)).reason == ACCEPTED
    older = ingest(hr("h", 4, {"a": 100.0}, queued=50.0))
    dup = ingest(hr("h", 5, {"a": 100.0}, queued=50.0))
    assert (older.accepted, older.reason, dup.accepted, dup.reason) == (
        False,
        STALE,
        False,
        DUPLICATE,
    )
    assert (store.total_running(), store.queued()) == (3.0, 2.0)
    assert ingest(hr("h", 6, {"b": 1.0})).reason == ACCEPTED  # newer replaces the row
    assert store.per_replica_by_id() == {"a": 0.0, "b": 1.0}
    assert store.queued() == 0.0


def test_replica_report_staleness() -> None:
    _, store = store_for(["a"])
    assert store.ingest_replica_report(rr("a", 5, 2.0), 0.0).reason == ACCEPTED
    assert store.ingest_replica_report(rr("a", 4, 9.0), 0.0).reason == STALE
    assert store.ingest_replica_report(rr("a", 5, 9.0), 0.0).reason == DUPLICATE
    assert store.total_running() == 2.0
    assert store.ingest_replica_report(rr("a", 6, 1.0), 0.0).accepted
    assert store.total_running() == 1.0


def test_replica_report_from_unknown_replica_is_dropped() -> None:
    _, store = store_for(["a"])
    res = store.ingest_replica_report(rr("ghost", 1, 5.0), 0.0)
    assert (res.accepted, res.reason, res.health) == (False, UNKNOWN_REPLICA, None)
    assert store.total_running() == 0.0


def wide(n: int, prefix: str = "r") -> list[str]:
    return [f"{prefix}{i:04d}" for i in range(n)]


def test_split_parts_accepted_once_each_and_queued_is_set_not_added() -> None:
    ids = wide(400)
    _, store = store_for(ids)
    report = hr("h", 1, dict.fromkeys(ids, 1.0), queued=7.0)
    parts = col(report, SPLIT_PAYLOAD)
    assert len(parts) >= 2
    for i, c in enumerate(parts):
        assert store.ingest_columnar(c, float(i)).reason == ACCEPTED
        assert store.queued() == 7.0
    assert store.ingest_columnar(parts[1], 9.0).reason == DUPLICATE
    assert store.total_running() == 400.0
    # A newer report arrives; the rest of the old one is stale now.
    newer = col(hr("h", 2, dict.fromkeys(ids, 2.0), queued=1.0), SPLIT_PAYLOAD)
    assert store.ingest_columnar(newer[0], 10.0).accepted
    assert store.ingest_columnar(parts[0], 10.0).reason == STALE
    assert store.queued() == 1.0


def test_split_report_lost_part_keeps_values_complete_report_clears_departed() -> None:
    ids = wide(400)
    _, store = store_for(ids)
    for c in col(hr("h", 1, dict.fromkeys(ids, 1.0)), SPLIT_PAYLOAD):
        store.ingest_columnar(c, 0.0)
    # Report 2 loses its last part: those replicas keep report 1's values (not zero load).
    parts2 = col(hr("h", 2, dict.fromkeys(ids, 3.0)), SPLIT_PAYLOAD)
    for c in parts2[:-1]:
        store.ingest_columnar(c, 1.0)
    lost = parts2[-1].num_rows
    assert store.total_running() == 3.0 * (400 - lost) + 1.0 * lost
    # Report 3 covers only the first 100 replicas, split too; once complete the rest are gone.
    parts3 = col(hr("h", 3, dict.fromkeys(ids[:100], 5.0) | {"zz": 0.0}), 1_800)
    assert len(parts3) >= 2
    for c in parts3:
        store.ingest_columnar(c, 2.0)
    assert store.total_running() == 500.0
    assert sum(store.per_replica_by_id()[r] for r in ids[100:]) == 0.0


# -- one store per source, mixed formats -----------------------------------------------------


def test_handle_switching_format_clears_the_other_store() -> None:
    _, store = store_for(["a", "b", "c"])
    store.ingest_handle_report(hr("h", 1, {"a": 4.0}, custom={"m": {"a": 1.0}}), 0.0)
    assert store.handle_format("h") == "object"
    # Same (sent_at, seq) in the other format: the gate is shared, so it is a duplicate.
    assert ingest_col(store, hr("h", 1, {"a": 4.0}), 0.0).reason == DUPLICATE
    assert ingest_col(store, hr("h", 2, {"b": 2.0}, custom={"n": {"b": 3.0}}), 1.0).accepted
    assert store.handle_format("h") == "columnar"
    assert store.per_replica_by_id() == {"a": 0.0, "b": 2.0, "c": 0.0}
    assert store.custom_total("m") is None and store.custom_total("n") == 3.0
    # And back, from a split columnar report to an object one.
    store.ingest_handle_report(hr("h", 3, {"c": 1.0}), 2.0)
    assert store.handle_format("h") == "object"
    assert store.per_replica_by_id() == {"a": 0.0, "b": 0.0, "c": 1.0}
    assert store.custom_total("n") is None
    assert store.handle_ids() == ["h"]


def test_switch_to_split_columnar_counts_each_replica_once() -> None:
    ids = wide(400)
    _, store = store_for(ids)
    store.ingest_handle_report(hr("h", 1, dict.fromkeys(ids, 1.0)), 0.0)
    parts = col(hr("h", 2, dict.fromkeys(ids, 1.0)), SPLIT_PAYLOAD)
    store.ingest_columnar(parts[0], 1.0)
    assert store.total_running() == float(parts[0].num_rows)  # never 400 + part
    for c in parts[1:]:
        store.ingest_columnar(c, 1.0)
    assert store.total_running() == 400.0


# -- running-replica gate --------------------------------------------------------------------


def test_stopped_replica_is_dropped_at_once_and_cannot_inflate() -> None:
    _, store = store_for(["a", "b"])
    store.ingest_handle_report(hr("h1", 1, {"a": 2.0, "b": 3.0}), 0.0)
    ingest_col(store, hr("h2", 1, {"a": 1.0, "b": 4.0}), 0.0)
    store.ingest_replica_report(rr("b", 1, 9.0, {"m": 1.0}), 0.0)
    assert store.total_running() == 12.0
    store.set_running(["a"])
    assert store.total_running() == 3.0
    assert store.custom_total("m") is None
    # Late reports still naming b (built against old membership) change nothing for b.
    store.ingest_handle_report(hr("h1", 2, {"a": 2.0, "b": 50.0}), 1.0)
    res = ingest_col(store, hr("h2", 2, {"a": 1.0, "b": 50.0}), 1.0)
    assert (res.rows, res.ignored) == (1, 1)
    late = store.ingest_replica_report(rr("b", 2, 70.0), 1.0)
    assert (late.accepted, late.reason) == (False, NOT_RUNNING)
    assert store.total_running() == 3.0
    # b running again starts from nothing, not from its old arrays.
    store.set_running(["a", "b"])
    assert store.per_replica_by_id() == {"a": 3.0, "b": 0.0}


def test_reused_slot_carries_nothing_over() -> None:
    index, store = store_for(["a", "b"])
    slot_b = index.slot("b")
    store.ingest_replica_report(rr("b", 1, 0.0), 0.0)  # b's own report would win over sums
    store.ingest_handle_report(hr("h", 1, {"b": 6.0}, custom={"m": {"b": 1.0}}), 0.0)
    index.remove("b")
    assert index.add("c") == slot_b
    store.set_running(["a", "c"])
    ingest_col(store, hr("h2", 1, {"c": 4.0}), 1.0)
    assert store.per_replica_by_id() == {"a": 0.0, "c": 4.0}
    assert store.custom_total("m") is None


def test_index_change_without_set_running_drops_removed_replica() -> None:
    index, store = store_for(["a", "b"])
    store.ingest_handle_report(hr("h", 1, {"a": 1.0, "b": 2.0}), 0.0)
    index.remove("b")
    assert store.total_running() == 1.0
    assert store.running_ids() == ["a"]


def test_running_ids_unknown_to_the_index_count_once_added() -> None:
    index, store = store_for(["a"], running=["a", "late"])
    assert store.running_ids() == ["a"]
    index.add("late")
    store.ingest_handle_report(hr("h", 1, {"late": 2.0}), 0.0)
    assert store.per_replica_by_id() == {"a": 0.0, "late": 2.0}


def test_index_growth_keeps_existing_values() -> None:
    index, store = store_for(["a"])
    store.ingest_handle_report(hr("h", 1, {"a": 1.0}, custom={"m": {"a": 2.0}}), 0.0)
    store.ingest_replica_report(rr("a", 1, 5.0, {"m": 3.0}), 0.0)
    more = wide(100)
    for r in more:
        index.add(r)
    store.set_running(["a", *more])
    ingest_col(store, hr("h2", 1, dict.fromkeys(more, 1.0)), 0.0)
    assert store.total_running() == 105.0
    assert store.custom_total("m") == 3.0


# -- expiry ----------------------------------------------------------------------------------


def test_handle_expires_by_receipt_time() -> None:
    _, store = store_for(["a"])
    # sent_at is far in the past (remote clock): only local receipt time counts.
    store.ingest_handle_report(hr("h1", 1, {"a": 1.0}, queued=2.0, sent_at=1.0), 100.0)
    ingest_col(store, hr("h2", 1, {"a": 3.0}, sent_at=1.0), 105.0)
    assert store.expire(100.0 + TIMEOUT - 0.001) == []
    assert store.cold_start_signal()
    snap = store.snapshot(100.0 + TIMEOUT)
    assert snap.expired == ("h1",)
    assert (snap.total_running, snap.queued, snap.handles) == (3.0, 0.0, 1)
    assert not snap.cold_start_signal
    assert store.expire(105.0 + TIMEOUT) == ["h2"]
    assert store.total_running() == 0.0


def test_expiry_timeout_has_a_floor() -> None:
    index = ReplicaIndex()
    assert DeploymentMetrics(index, 1.0).timeout_s == 10.0
    assert DeploymentMetrics(index, 30.0).timeout_s == 60.0


def test_expired_gate_outlives_data_so_old_reports_cannot_resurrect() -> None:
    _, store = store_for(["a"])
    store.ingest_handle_report(hr("h", 5, {"a": 1.0}), 0.0)
    store.expire(TIMEOUT)
    assert store.handle_ids() == []
    assert store.ingest_handle_report(hr("h", 4, {"a": 9.0}), TIMEOUT + 1).reason == STALE
    assert store.total_running() == 0.0
    assert store.ingest_handle_report(hr("h", 6, {"a": 2.0}), TIMEOUT + 1).accepted


def test_replica_report_expires_back_to_handle_sums() -> None:
    _, store = store_for(["a"])
    store.ingest_handle_report(hr("h", 1, {"a": 2.0}), 15.0)
    store.ingest_replica_report(rr("a", 1, 7.0), 0.0)
    assert store.total_running() == 7.0
    store.expire(TIMEOUT)
    assert store.total_running() == 2.0


# -- aggregates --------------------------------------------------------------------------------


def test_replica_report_wins_over_handle_sums() -> None:
    index, store = store_for(["a", "b", "c"], running=["a", "b"])
    store.ingest_handle_report(hr("h1", 1, {"a": 1.0, "b": 2.0}, queued=1.5), 0.0)
    ingest_col(store, hr("h2", 1, {"a": 4.0, "b": 8.0, "c": 9.0}, queued=0.5), 0.0)
    store.ingest_replica_report(rr("a", 1, 3.0), 0.0)
    snap = store.snapshot(1.0)
    assert store.per_replica_by_id() == {"a": 3.0, "b": 10.0}
    assert snap.per_replica[index.slot("c")] == 0.0
    assert (snap.total_running, snap.queued, snap.total_demand) == (13.0, 2.0, 15.0)
    assert (snap.running_replicas, snap.self_reporting, snap.handles) == (2, 1, 2)
    assert snap.cold_start_signal


def test_cold_start_signal_only_from_queued_requests() -> None:
    _, store = store_for([])
    assert not store.cold_start_signal()
    store.ingest_handle_report(hr("h", 1, {}, queued=0.0), 0.0)
    assert not store.cold_start_signal()
    ingest_col(store, hr("h2", 1, {}, queued=1.0), 0.0)
    assert store.cold_start_signal()
    assert store.snapshot(0.0).total_demand == 1.0


def test_custom_totals_prefer_replica_value_and_skip_missing() -> None:
    _, store = store_for(["a", "b", "c"])
    store.ingest_handle_report(hr("h1", 1, {}, custom={"m": {"a": 1.0, "b": -2.0}}), 0.0)
    ingest_col(store, hr("h2", 1, {}, custom={"m": {"a": 0.5}, "k": {"c": 4.0}}), 0.0)
    assert store.custom_total("m") == -0.5
    assert store.custom_total("k") == 4.0
    assert store.custom_total("nope") is None
    store.ingest_replica_report(rr("a", 1, 0.0, {"m": 10.0}), 0.0)
    assert store.custom_total("m") == 8.0
    store.ingest_replica_report(rr("a", 2, 0.0, {}), 0.0)  # a stops reporting m itself
    assert store.custom_total("m") == -0.5
    assert store.custom_names() == ["k", "m"]


# -- slot-map cache ------------------------------------------------------------------------------


def test_cache_reused_in_steady_state_and_rebuilt_on_epoch_version_or_dictionary() -> None:
    index, store = store_for(["a", "b", "c"])
    ingest_col(store, hr("h", 1, {"a": 1.0, "b": 1.0}), 0.0)
    ingest_col(store, hr("h", 2, {"a": 2.0, "b": 2.0}), 0.0)
    assert store.slot_map_builds == 1
    ingest_col(store, hr("h", 3, {"a": 2.0, "b": 2.0}, epoch=2), 0.0)
    assert store.slot_map_builds == 2
    ingest_col(store, hr("h", 4, {"a": 1.0, "c": 1.0}, epoch=2), 0.0)  # same length, new ids
    assert store.slot_map_builds == 3
    # The index moves b to another slot; the identical dictionary must not reuse old slots.
    index.remove("b")
    index.add("x")
    index.add("b")
    store.set_running(["a", "b", "c", "x"])
    ingest_col(store, hr("h", 5, {"a": 1.0, "c": 5.0}, epoch=2), 0.0)
    assert store.slot_map_builds == 4
    ingest_col(store, hr("h", 6, {"a": 1.0, "b": 7.0}, epoch=2), 0.0)
    assert store.per_replica_by_id() == {"a": 1.0, "b": 7.0, "c": 0.0, "x": 0.0}


def test_running_set_change_refreshes_cached_mapping() -> None:
    _, store = store_for(["a", "b"])
    ingest_col(store, hr("h", 1, {"a": 1.0, "b": 1.0}), 0.0)
    store.set_running(["a"])
    res = ingest_col(store, hr("h", 2, {"a": 1.0, "b": 1.0}), 0.0)
    assert (res.rows, res.ignored) == (1, 1)
    store.set_running(["a", "b"])
    assert ingest_col(store, hr("h", 3, {"a": 1.0, "b": 1.0}), 0.0).rows == 2
    assert store.total_running() == 2.0
    assert store.slot_map_builds == 1


def test_rows_out_of_dictionary_order_use_the_general_path() -> None:
    index, store = store_for(["a", "b", "c"])
    raw = encode_handle_report_columnar(
        handle_id="h", app="app", deployment="dep", sent_at=1.0, seq=1, queued_requests=0.0,
        membership_epoch=1, replica_ids=["c", "a"], running=[3.0, 1.0],
    )  # fmt: skip
    c = decode_handle_report_columnar(raw[0])
    # Rebuild the batch with a shuffled dictionary (another writer's choice).
    ids = pa.DictionaryArray.from_arrays(pa.array([1, 0], pa.int32()), pa.array(["a", "c"]))
    batch = pa.RecordBatch.from_arrays([ids, *c.batch.columns[1:]], schema=c.batch.schema)
    shuffled = ColumnarHandleReport(**{**_fields(c), "batch": batch})
    assert store.ingest_columnar(shuffled, 0.0).rows == 2
    assert store.per_replica_by_id() == {"a": 1.0, "b": 0.0, "c": 3.0}
    assert index.slot("a") != index.slot("c")


def _fields(c: ColumnarHandleReport) -> dict[str, Any]:
    return {name: getattr(c, name) for name in ColumnarHandleReport.__slots__}


# -- health extraction ---------------------------------------------------------------------------


def sorted_health(b: HealthBatch | None) -> list[tuple[int, bool, float, int]]:
    if b is None:
        return []
    dtypes = [a.dtype for a in (b.slots, b.healthy, b.checked_at, b.failures)]
    assert dtypes == [np.dtype(t) for t in (np.int64, np.bool_, np.float64, np.int32)]
    cols = (b.slots, b.healthy, b.checked_at, b.failures)
    rows = zip(*(c.tolist() for c in cols), strict=True)
    return sorted(rows)


def test_health_extraction_known_slots_only_running_or_not() -> None:
    index, store = store_for(["a", "b", "c"], running=["a"])
    health = (
        HealthStatus("a", True, 10.0, 0),
        HealthStatus("b", False, 11.0, 3),  # known, not running: the registry still wants it
        HealthStatus("ghost", True, 12.0, 0),  # no slot: dropped
    )
    report = hr("h", 1, {"a": 1.0, "c": 2.0}, health=health)
    want = [(index.slot("a"), True, 10.0, 0), (index.slot("b"), False, 11.0, 3)]
    assert sorted_health(store.ingest_handle_report(report, 0.0).health) == sorted(want)
    _, store2 = store_for(["a", "b", "c"], running=["a"])
    res = ingest_col(store2, report, 0.0)
    assert sorted_health(res.health) == sorted(want)
    # Rows without health (c) are not health rows; a report with no health gives None.
    assert ingest_col(store2, hr("h", 2, {"a": 1.0}), 0.0).health is None
    assert store2.ingest_handle_report(hr("h", 3, {"a": 1.0}), 0.0).health is None
    only_ghost = hr("h", 4, {"a": 1.0}, health=(HealthStatus("ghost", True, 1.0, 0),))
    assert ingest_col(store2, only_ghost, 0.0).health is None


def test_replica_report_health_even_when_not_running() -> None:
    index, store = store_for(["a", "b"], running=["a"])
    res = store.ingest_replica_report(rr("b", 1, 3.0, health=HealthStatus("b", True, 5.0, 0)), 0.0)
    assert res.reason == NOT_RUNNING
    assert sorted_health(res.health) == [(index.slot("b"), True, 5.0, 0)]
    ok = store.ingest_replica_report(rr("a", 1, 1.0, health=HealthStatus("a", False, 6.0, 2)), 0.0)
    assert sorted_health(ok.health) == [(index.slot("a"), False, 6.0, 2)]
    assert store.ingest_replica_report(rr("a", 2, 1.0), 0.0).health is None
    stale = store.ingest_replica_report(
        rr("a", 1, 1.0, health=HealthStatus("a", True, 9.0, 0)), 0.0
    )
    assert stale.health is None


# -- object path == columnar path -----------------------------------------------------------------

POOL = [f"rep-{i}" for i in range(12)]
values = st.floats(0.0, 1e6, allow_nan=False) | st.sampled_from([0.0, 1.0, 0.1, 1 / 3])
custom_values = st.floats(-1e6, 1e6, allow_nan=False)


@st.composite
def handle_reports(draw: st.DrawFn, handle: str, seq: int) -> HandleReport:
    ids = draw(st.lists(st.sampled_from([*POOL, "ghost-1", "ghost-2"]), unique=True))
    running = {r: draw(values) for r in ids}
    health_ids = draw(st.lists(st.sampled_from([*POOL, "ghost-1"]), unique=True, max_size=6))
    health = tuple(
        HealthStatus(r, draw(st.booleans()), draw(st.floats(0, 2e9)), draw(st.integers(0, 9)))
        for r in health_ids
    )
    custom: dict[str, dict[str, float]] = {}
    for name in draw(st.lists(st.sampled_from(["m", "k", "z"]), unique=True, max_size=2)):
        per_ids = draw(st.lists(st.sampled_from(POOL), unique=True, max_size=5))
        custom[name] = {r: draw(custom_values) for r in per_ids}
    return hr(
        handle,
        seq,
        running,
        queued=draw(values),
        health=health,
        custom=custom,
        epoch=draw(st.integers(1, 2)),
    )


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    known = draw(st.lists(st.sampled_from(POOL), unique=True, min_size=1))
    running = draw(st.lists(st.sampled_from(known), unique=True))
    handles = [f"h{i}" for i in range(draw(st.integers(1, 3)))]
    steps: list[Any] = []
    seqs = dict.fromkeys(handles, 5)
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["handle", "handle", "handle", "replica", "running"]))
        if kind == "handle":
            h = draw(st.sampled_from(handles))
            seqs[h] += draw(st.integers(-1, 2))  # some stale or duplicate reports too
            split = draw(st.sampled_from(["whole", "split", "reversed"]))
            steps.append(("handle", draw(handle_reports(h, seqs[h])), split))
        elif kind == "replica":
            rid = draw(st.sampled_from(known))
            custom = {"m": draw(custom_values)} if draw(st.booleans()) else {}
            steps.append(("replica", rr(rid, draw(st.integers(0, 5)), draw(values), custom)))
        else:
            steps.append(("running", draw(st.lists(st.sampled_from(known), unique=True))))
    formats = {h: draw(st.sampled_from(["object", "columnar"])) for h in handles}
    return {"known": known, "running": running, "steps": steps, "formats": formats}


def aggregates(store: DeploymentMetrics) -> tuple[Any, ...]:
    return (
        store.per_replica_running().tolist(),
        store.total_running(),
        store.queued(),
        store.total_demand(),
        store.cold_start_signal(),
        store.custom_names(),
        [store.custom_total(n) for n in ("m", "k", "z")],
        store.running_ids(),
        sorted(store.handle_ids()),
    )


def run(scenario: dict[str, Any], formats: dict[str, str]) -> list[tuple[Any, ...]]:
    _, store = store_for(scenario["known"], scenario["running"])
    seen: list[tuple[Any, ...]] = []
    for step in scenario["steps"]:
        if step[0] == "replica":
            res = store.ingest_replica_report(step[1], 0.0)
            seen.append((res.reason, sorted_health(res.health)))
        elif step[0] == "running":
            store.set_running(step[1])
        else:
            _, report, split = step
            if formats[report.handle_id] == "object":
                res = store.ingest_handle_report(report, 0.0)
                seen.append((res.reason, sorted_health(res.health)))
            else:
                parts = col(report) if split == "whole" else split_col(report, split == "reversed")
                results = [store.ingest_columnar(c, 0.0) for c in parts]
                rows = [h for r in results for h in sorted_health(r.health)]
                seen.append((results[0].reason, sorted(rows)))
        seen.append(aggregates(store))
    return seen


@settings(max_examples=80, deadline=None)
@given(scenario=scenarios())
def test_object_and_columnar_paths_give_identical_aggregates(scenario: dict[str, Any]) -> None:
    handles = scenario["formats"]
    all_object = run(scenario, dict.fromkeys(handles, "object"))
    assert run(scenario, dict.fromkeys(handles, "columnar")) == all_object
    # A mixed-format rollout (each handle in its own format) aggregates like all-object.
    assert run(scenario, handles) == all_object


@settings(max_examples=60, deadline=None)
@given(scenario=scenarios(), data=st.data())
def test_handles_switching_format_mid_stream_never_double_count(
    scenario: dict[str, Any], data: st.DataObject
) -> None:
    _, store = store_for(scenario["known"], scenario["running"])
    _, reference = store_for(scenario["known"], scenario["running"])
    for step in scenario["steps"]:
        if step[0] == "replica":
            store.ingest_replica_report(step[1], 0.0)
            reference.ingest_replica_report(step[1], 0.0)
        elif step[0] == "running":
            store.set_running(step[1])
            reference.set_running(step[1])
        else:
            report = step[1]
            reference.ingest_handle_report(report, 0.0)
            if data.draw(st.booleans()):  # each report picks its own format
                store.ingest_handle_report(report, 0.0)
            else:
                split = step[2]
                parts = col(report) if split == "whole" else split_col(report, split == "reversed")
                for c in parts:
                    store.ingest_columnar(c, 0.0)
        assert aggregates(store) == aggregates(reference)


def test_handed_out_health_slots_cannot_corrupt_the_cache() -> None:
    _, store = store_for(["a", "b"])
    health = (HealthStatus("a", True, 1.0, 0), HealthStatus("b", True, 1.0, 0))
    batch = ingest_col(store, hr("h", 1, {"a": 1.0, "b": 1.0}, health=health), 0.0).health
    assert batch is not None
    with pytest.raises(ValueError):
        batch.slots[0] = 99
    ingest_col(store, hr("h", 2, {"a": 1.0, "b": 2.0}), 0.0)
    assert store.per_replica_by_id() == {"a": 1.0, "b": 2.0}

from hypothesis import given
from hypothesis import strategies as st

from services.router.carried_health import MAX_AGE_S, CarriedHealthMap
from shared.wire.messages import HealthStatus


def hs(rid: str, checked_at: float, healthy: bool = True, failures: int = 0) -> HealthStatus:
    return HealthStatus(rid, healthy, checked_at, failures)


def test_newest_checked_at_wins_and_older_or_equal_is_ignored() -> None:
    m = CarriedHealthMap()
    assert m.observe(hs("r1", 100.0), now_mono=5.0)
    assert m.observe(hs("r1", 101.0, healthy=False, failures=1), now_mono=6.0)
    assert not m.observe(hs("r1", 100.5), now_mono=7.0)  # arrived late
    assert not m.observe(hs("r1", 101.0), now_mono=8.0)  # equal: a re-delivery
    assert m.get("r1") == hs("r1", 101.0, healthy=False, failures=1)
    # the receipt time is that of the entry kept, not of the ignored ones
    assert m.received_at("r1") == 6.0


@given(st.permutations(list(range(12))))
def test_out_of_order_delivery_converges_to_the_newest(order: list[int]) -> None:
    m = CarriedHealthMap()
    for i, k in enumerate(order):
        m.observe(hs("r", float(k), failures=k), now_mono=float(i))
    assert m.get("r") == hs("r", 11.0, failures=11)


def test_age_is_judged_by_receipt_time_not_the_remote_clock() -> None:
    m = CarriedHealthMap()
    # a replica whose wall clock is a day behind, and one a day ahead
    m.observe(hs("behind", 1_000.0 - 86_400), now_mono=0.0)
    m.observe(hs("ahead", 1_000.0 + 86_400), now_mono=0.0)
    assert {s.replica_id for s in m.snapshot(now_mono=MAX_AGE_S)} == {"behind", "ahead"}
    assert m.expire(now_mono=MAX_AGE_S) == 0
    assert m.snapshot(now_mono=MAX_AGE_S + 0.001) == ()
    assert m.expire(now_mono=MAX_AGE_S + 0.001) == 2
    assert len(m) == 0


def test_refresh_keeps_an_entry_and_expired_entries_are_never_resent() -> None:
    m = CarriedHealthMap()
    m.observe(hs("a", 1.0), now_mono=0.0)
    m.observe(hs("b", 1.0), now_mono=0.0)
    m.observe(hs("a", 2.0), now_mono=20.0)
    # b is past its age but expire() has not run yet: the snapshot leaves it out anyway
    snap = m.snapshot(now_mono=40.0)
    assert [s.replica_id for s in snap] == ["a"]
    assert m.expire(now_mono=40.0) == 1
    assert list(m) == ["a"]


def test_an_expired_entry_accepts_an_older_status_again() -> None:
    # a replica whose wall clock stepped back is heard again once its old entry aged out
    m = CarriedHealthMap()
    m.observe(hs("a", 500.0), now_mono=0.0)
    assert not m.observe(hs("a", 400.0), now_mono=10.0)
    m.expire(now_mono=31.0)
    assert m.observe(hs("a", 401.0), now_mono=31.0)


def test_prune_to_membership() -> None:
    m = CarriedHealthMap()
    for rid in ("a", "b", "c"):
        m.observe(hs(rid, 1.0), now_mono=0.0)
    assert m.prune_to({"b", "z"}) == 2
    assert list(m) == ["b"]
    assert m.prune_to(()) == 1
    assert len(m) == 0


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),
            st.floats(-1e9, 1e9, allow_nan=False),
            st.floats(0, 100, allow_nan=False),
        ),
        max_size=40,
    ),
    st.floats(0, 200, allow_nan=False),
)
def test_snapshot_holds_the_max_checked_at_received_within_max_age(
    events: list[tuple[str, float, float]], now: float
) -> None:
    m = CarriedHealthMap()
    events = sorted(events, key=lambda e: e[2])  # receipt times move forward
    for rid, checked, at in events:
        m.observe(hs(rid, checked), now_mono=at)
    snap = {s.replica_id: s for s in m.snapshot(now_mono=now)}
    for rid in ("a", "b", "c"):
        mine = [(c, at) for r, c, at in events if r == rid]
        if not mine:
            assert rid not in snap
            continue
        best = max(c for c, _ in mine)
        # the receipt time of the first arrival of the max checked_at
        kept_at = next(at for c, at in mine if c == best)
        if now - kept_at <= MAX_AGE_S:
            assert snap[rid].checked_at == best
        else:
            assert rid not in snap

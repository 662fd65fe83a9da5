import math
import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.router.choice import (
    BACKOFF_INITIAL_S,
    BACKOFF_MAX_S,
    EXTERNAL_HALF_LIFE_S,
    ReplicaChooser,
)


def chooser(members: list[str], seed: int = 1) -> ReplicaChooser:
    c = ReplicaChooser(random.Random(seed))
    c.set_members(members)
    return c


def test_no_members_no_choice() -> None:
    c = chooser([])
    assert c.choose(0.0) is None
    assert c.next_available_at(0.0) is None


def test_prefers_the_shorter_queue() -> None:
    c = chooser(["a", "b"])
    for _ in range(3):
        c.on_dispatch("a")
    assert all(c.choose(0.0) == "b" for _ in range(50))


def test_power_of_two_spreads_load_evenly() -> None:
    c = chooser([f"r{i}" for i in range(8)], seed=7)
    for _ in range(800):
        rid = c.choose(0.0)
        assert rid is not None
        c.on_dispatch(rid)
    loads = [c.in_flight(f"r{i}") for i in range(8)]
    # uniform random choice would spread these about +-10 around 100; two choices keep them tight
    assert max(loads) - min(loads) <= 6


def test_external_load_from_admissions_counts_and_decays() -> None:
    c = chooser(["a", "b"])
    c.on_dispatch("a")
    # a is busy with 9 requests from other routers besides ours
    c.on_admission("a", accepted=True, num_ongoing=10, now=0.0)
    c.on_finish("a")
    assert c.queue_length("a", 0.0) == pytest.approx(9.0)
    assert c.choose(0.0) == "b"
    assert c.queue_length("a", 10.0) < 0.01  # forgotten without fresh admissions


def test_rejecting_replica_is_avoided_with_exponential_backoff_reset_on_accept() -> None:
    c = chooser(["a", "b"])
    c.on_admission("a", accepted=False, num_ongoing=5, now=0.0)
    assert c.backoff_s("a") == BACKOFF_INITIAL_S
    assert all(c.choose(0.001) == "b" for _ in range(20))
    assert c.available("a", BACKOFF_INITIAL_S)
    for i in range(20):
        c.on_admission("a", accepted=False, num_ongoing=5, now=float(i))
    assert c.backoff_s("a") == BACKOFF_MAX_S
    c.on_admission("a", accepted=True, num_ongoing=1, now=30.0)
    assert c.backoff_s("a") == 0.0
    assert c.available("a", 30.0)


def test_all_backing_off_returns_none_and_says_when_to_retry() -> None:
    c = chooser(["a", "b"])
    c.on_admission("a", accepted=False, num_ongoing=1, now=0.0)
    c.on_unreachable("b", now=0.0)
    c.on_unreachable("b", now=0.0)  # second failure: doubled
    assert c.choose(0.0) is None
    assert c.next_available_at(0.0) == pytest.approx(BACKOFF_INITIAL_S)
    assert c.choose(BACKOFF_INITIAL_S) == "a"


def test_exclude_is_respected() -> None:
    c = chooser(["a", "b", "c"])
    got = Counter(c.choose(0.0, exclude={"a"}) for _ in range(100))
    assert set(got) == {"b", "c"}
    assert c.choose(0.0, exclude={"a", "b", "c"}) is None


def test_membership_change_keeps_survivors_and_in_flight_of_departed() -> None:
    c = chooser(["a", "b"])
    c.on_dispatch("a")
    c.on_admission("b", accepted=False, num_ongoing=0, now=0.0)
    c.set_members(["b", "c"])
    assert c.members == ("b", "c")
    assert c.backoff_s("b") == BACKOFF_INITIAL_S  # survivor keeps its backoff
    assert c.in_flight("a") == 1  # still counted until it finishes
    assert all(c.choose(0.0) == "c" for _ in range(10))
    c.on_finish("a")
    assert c.in_flight("a") == 0
    assert c.in_flight_total() == 0


@given(
    st.lists(st.sampled_from("abcdef"), min_size=1, max_size=6, unique=True),
    st.sets(st.sampled_from("abcdef")),
    st.sets(st.sampled_from("abcdef")),
    st.integers(0, 2**32),
)
def test_choice_is_always_an_available_member(
    members: list[str], backing_off: set[str], exclude: set[str], seed: int
) -> None:
    c = chooser(members, seed)
    for rid in backing_off:
        c.on_unreachable(rid, now=0.0)
    got = c.choose(0.0, exclude=exclude)
    allowed = {m for m in members if m not in backing_off and m not in exclude}
    if allowed:
        assert got in allowed
    else:
        assert got is None


def test_a_replica_at_its_limit_is_not_chosen_until_one_of_ours_finishes() -> None:
    c = ReplicaChooser(random.Random(1))
    c.set_members(["a", "b"], {"a": 2, "b": None})
    for _ in range(2):
        c.on_dispatch("a")
    assert all(c.choose(0.0) == "b" for _ in range(50)), "a is full, b has no known limit"
    c.set_members(["a"], {"a": 2})
    assert c.choose(0.0) is None
    assert c.next_available_at(0.0) is None, "only a finish of ours frees it: no timer"
    c.on_finish("a")
    assert c.choose(0.0) == "a"


def test_a_replica_full_with_other_routers_requests_opens_as_that_estimate_decays() -> None:
    c = ReplicaChooser(random.Random(1))
    c.set_members(["a"], {"a": 4})
    c.on_dispatch("a")
    c.on_admission("a", True, 4, now=10.0)  # 3 of the 4 are other routers'
    assert c.choose(10.0) is None
    opens = c.next_available_at(10.0)
    assert opens is not None
    # 1 + 3 * 2^(-age) < 4 needs age > 0; with two of ours it needs 3 * 2^(-age) < 2
    c.on_dispatch("a")
    opens = c.next_available_at(10.0)
    assert opens == pytest.approx(10.0 + EXTERNAL_HALF_LIFE_S * math.log2(3 / 2))
    assert c.choose(opens - 1e-3) is None and c.choose(opens + 1e-6) == "a"

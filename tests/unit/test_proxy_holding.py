"""The hold queue: per-app bound on held requests, release, and waking the waiters of a lost app."""

from __future__ import annotations

import pytest

from services.proxy.holding import Gone, Holds


async def test_bound_is_per_app_on_held_requests_only() -> None:
    holds = Holds(max_held_per_app=2)
    a1, a2 = holds.enter("a", held=True), holds.enter("a", held=True)
    assert a1 is not None and a2 is not None
    assert holds.enter("a", held=True) is None  # full
    passing = holds.enter("a", held=False)  # replicas are up: not held, not bounded here
    assert passing is not None
    b = holds.enter("b", held=True)
    assert b is not None  # another app has its own queue
    assert holds.counts() == {"a": 2, "b": 1} and holds.total == 3
    assert holds.waiting("a") == 3
    a1.release()
    a1.release()  # idempotent
    assert holds.held("a") == 1
    again = holds.enter("a", held=True)
    assert again is not None
    for h in (a2, again, b, passing):
        h.release()
    assert holds.counts() == {} and holds.total == 0 and holds.waiting("a") == 0


async def test_zero_bound_holds_nothing() -> None:
    holds = Holds(0)
    assert holds.enter("a", held=True) is None
    assert holds.waiting("a") == 0  # a refusal leaves nothing behind
    with pytest.raises(ValueError):
        Holds(-1)


async def test_release_app_wakes_every_waiter_with_the_reason_and_starts_afresh() -> None:
    holds = Holds(3)
    a, a_passing, b = (
        holds.enter("a", held=True),
        holds.enter("a", held=False),
        holds.enter("b", held=True),
    )
    assert a is not None and a_passing is not None and b is not None
    assert a.gone is a_passing.gone  # one future per app: waiters need no task of their own
    assert holds.release_app("a", "Api: UNHEALTHY with no replica running") == 2
    assert a.gone.done() and a.gone.result() == Gone("Api: UNHEALTHY with no replica running", True)
    assert not b.gone.done()
    # a request arriving after the release waits on a fresh future, and the old waiters'
    # releases do not disturb the new count
    later = holds.enter("a", held=True)
    assert later is not None and not later.gone.done()
    a.release()
    a_passing.release()
    assert holds.held("a") == 1
    assert holds.release_app("b", "deleted", known=False) == 1
    assert b.gone.result() == Gone("deleted", False)
    assert holds.release_app("nobody", "x") == 0

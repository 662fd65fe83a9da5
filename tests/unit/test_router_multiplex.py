"""Model-aware choice (services/router/choice.py, core.py): a request for a multiplexed model goes
to a replica holding it when one has room, else by the usual power of two choices; pure, with
time as a number the test advances."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from services.router.choice import ReplicaChooser
from services.router.config import RouterConfig
from services.router.core import RouterCore, Take, view_of
from services.router.testing import Seat, members_of
from shared.subjects import DEFAULT_SUBJECTS
from shared.wire.messages import Admission, HealthStatus

APP, DEP = "shop", "models"
H = HealthStatus("x", True, 1.0, 0)


def chooser(members: list[str], limit: int | None = None, seed: int = 1) -> ReplicaChooser:
    c = ReplicaChooser(random.Random(seed))
    c.set_members(members, {m: limit for m in members})
    return c


def test_a_holder_is_chosen_even_when_busier_than_the_others() -> None:
    c = chooser(["a", "b", "c", "d"], limit=8)
    c.on_admission("c", True, 1, 0.0, models=("m1", "m2"))
    for _ in range(3):
        c.on_dispatch("c")
    assert c.holders("m1") == {"c"}
    assert all(c.choose(0.0, model_id="m1") == "c" for _ in range(50))
    # without a model the usual choice avoids the busy replica
    assert all(c.choose(0.0) != "c" for _ in range(50))


def test_a_full_holder_is_passed_over_for_the_usual_choice() -> None:
    c = chooser(["a", "b"], limit=2)
    c.on_admission("a", True, 1, 0.0, models=("m1",))
    c.on_dispatch("a")
    c.on_dispatch("a")  # a is at its limit of 2
    assert all(c.choose(0.0, model_id="m1") == "b" for _ in range(20))


def test_a_backing_off_or_excluded_holder_is_passed_over() -> None:
    c = chooser(["a", "b"])
    c.on_admission("a", False, 5, 0.0, models=("m1",))  # rejected: backs off
    assert c.holders("m1") == {"a"}
    assert c.choose(0.0, model_id="m1") == "b"
    assert c.choose(1.0, model_id="m1") == "a"  # the backoff ended
    assert c.choose(1.0, exclude={"a"}, model_id="m1") == "b"


def test_among_holders_the_shorter_queue_wins() -> None:
    c = chooser(["a", "b", "c"])
    c.on_admission("a", True, 1, 0.0, models=("m1",))
    c.on_admission("b", True, 1, 0.0, models=("m1",))
    for _ in range(4):
        c.on_dispatch("a")
    assert all(c.choose(0.0, model_id="m1") == "b" for _ in range(30))


def test_a_dispatch_counts_the_model_at_once_and_the_next_admission_corrects_it() -> None:
    c = chooser(["a", "b", "c"])
    first = c.choose(0.0, model_id="new")
    assert first is not None
    c.on_dispatch(first, "new")
    # the burst for a new model follows the first request instead of loading it everywhere
    assert c.holders("new") == {first}
    assert c.choose(0.0, model_id="new") == first
    # the replica evicted it since: its admission's list replaces what the router believed
    c.on_admission(first, True, 1, 0.0, models=("other",))
    assert c.holders("new") == frozenset() and c.holders("other") == {first}
    # an accepted request for a model counts it as loading there
    c.on_admission(first, True, 1, 0.0, models=("other",), model_id="new")
    assert c.models_of(first) == {"other", "new"}
    # a replica that does not multiplex (no list) keeps what was known
    c.on_admission(first, True, 1, 0.0, models=None)
    assert c.models_of(first) == {"other", "new"}


def test_an_admission_answering_an_earlier_request_keeps_models_sent_since() -> None:
    c = chooser(["a", "b"])
    first = c.on_dispatch("a", "x")
    second = c.on_dispatch("a", "m")
    # a answered the first request before the second arrived: its list cannot show m yet
    c.on_admission("a", True, 2, 0.0, models=("x",), model_id="x", dispatch=first)
    assert c.holders("m") == {"a"}
    c.on_admission("a", True, 2, 0.0, models=("x", "m"), model_id="m", dispatch=second)
    third = c.on_dispatch("a", "y")
    # an answer to a later request is the truth about m (evicted since): m goes
    c.on_admission("a", True, 1, 0.0, models=("y",), model_id="y", dispatch=third)
    assert c.models_of("a") == {"y"} and c.holders("m") == frozenset()


def test_no_holder_falls_back_to_the_replicas_holding_the_fewest_models() -> None:
    c = chooser(["a", "b"])
    c.on_admission("a", True, 0, 0.0, models=("x", "y", "z"))
    c.on_admission("b", True, 0, 0.0, models=("w",))
    c.on_dispatch("b")
    c.on_dispatch("b")  # busier, but the load evicts less there (Ray's order)
    assert all(c.choose(0.0, model_id="new") == "b" for _ in range(30))
    assert c.choose(0.0) == "a"  # a request without a model goes by load alone


def test_a_departed_replica_holds_nothing() -> None:
    c = chooser(["a", "b"])
    c.on_admission("a", True, 1, 0.0, models=("m1",))
    c.on_dispatch("a")
    c.set_members(["b"])
    assert c.holders("m1") == frozenset()
    assert c.choose(0.0, model_id="m1") == "b"
    c.on_dispatch("a", "m2")  # a late event for a departed replica indexes nothing
    assert c.holders("m2") == frozenset()
    c.set_members(["a", "b"])  # back: known afresh from its next admission
    assert c.models_of("a") == frozenset()


def test_the_core_routes_queues_and_learns_by_model() -> None:
    core: RouterCore[object] = RouterCore(
        APP, DEP, handle_id="h", config=RouterConfig(), subjects=DEFAULT_SUBJECTS, now=0.0,
        rng=random.Random(3),
    )  # fmt: skip
    seats = [Seat(r, f"fp.v1.rpc.{APP}.{DEP}.{r}", 1) for r in ("a", "b", "c")]
    core.install_view(view_of(APP, DEP, 1, members_of(APP, DEP, 1, seats)))
    core.admitted("b", Admission(True, 0, H, False, ("m1",)), 0.0)
    assert core.choose(0.0, (), model_id="m1") == "b"
    core.dispatched("b", 0.0, "m1")  # b is now full (limit 1)
    rid = core.choose(0.0, (), model_id="m1")
    assert rid in {"a", "c"}
    core.dispatched(rid, 0.0, "m1")
    assert core.chooser.holders("m1") == {"b", rid}
    # all full: the request waits in line; a finish on b lets it take b (it holds the model)
    last = ({"a", "b", "c"} - {"b", rid}).pop()
    core.dispatched(last, 0.0, "zz")
    token = object()
    look = core.queue_step(token, False, 0.0, math.inf, set(), model_id="m1")
    assert not isinstance(look, Take)
    core.finished("b", 0.1)
    assert core.queue_step(token, True, 0.1, math.inf, set(), model_id="m1") == Take("b")


# -- properties -------------------------------------------------------------------------------

REPLICAS = ["r0", "r1", "r2", "r3", "r4"]
MODELS = ["m0", "m1", "m2", "m3"]

events = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), st.sampled_from(REPLICAS), st.booleans(),
                  st.integers(0, 6), st.lists(st.sampled_from(MODELS), max_size=3)),
        st.tuples(st.just("dispatch"), st.sampled_from(REPLICAS), st.sampled_from(MODELS)),
        st.tuples(st.just("finish"), st.sampled_from(REPLICAS)),
        st.tuples(st.just("members"), st.lists(st.sampled_from(REPLICAS), min_size=1, unique=True)),
        st.tuples(st.just("tick"), st.floats(0.0, 3.0)),
    ),
    max_size=40,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    events,
    st.sampled_from(MODELS),
    st.integers(1, 4),
    st.integers(0, 2**32 - 1),
    st.frozensets(st.sampled_from(REPLICAS), max_size=2),
)
def test_property_never_full_prefers_a_holder_with_room(
    evs: list[tuple[object, ...]], model: str, limit: int, seed: int, exclude: frozenset[str]
) -> None:
    c = ReplicaChooser(random.Random(seed))
    members = list(REPLICAS)
    c.set_members(members, {m: limit for m in members})
    now = 0.0
    for ev in evs:
        kind = ev[0]
        if kind == "admit":
            _, rid, ok, n, models = ev
            c.on_admission(str(rid), bool(ok), int(n), now, models=list(models))  # type: ignore[call-overload]
        elif kind == "dispatch":
            c.on_dispatch(str(ev[1]), str(ev[2]))
        elif kind == "finish":
            c.on_finish(str(ev[1]))
        elif kind == "members":
            members = list(ev[1])  # type: ignore[call-overload]
            c.set_members(members, {m: limit for m in members})
        else:
            now += float(ev[1])  # type: ignore[arg-type]
    # the index agrees with the per-replica lists, and holds members only
    for m in MODELS:
        assert c.holders(m) == {r for r in members if m in c.models_of(r)}
    picked = c.choose(now, exclude, model_id=model)
    open_ = {r for r in members if r not in exclude and c.available(r, now)}
    if picked is None:
        assert not open_
        return
    assert picked in open_  # never a full, backing-off, excluded or departed replica
    holders_with_room = c.holders(model) & open_
    if holders_with_room:
        assert picked in holders_with_room
    else:  # the model loads where the fewest are held
        assert len(c.models_of(picked)) == min(len(c.models_of(r)) for r in open_)

"""fp_targets and fp_membership documents (shared/kv/targets.py, membership.py): their keys and
key patterns, encode/decode, their bounded size, and the router's MembershipView. Ported from the
tests of shared/control.py (TargetSet, Membership), which they replace. Schemas, golden vectors
and the envelope rules of every kind are in test_kv_contract.py."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.bus import subject_matches
from shared.errors import WireError
from shared.kv import envelope
from shared.kv.membership import (
    Member,
    MembershipView,
    deployment_pattern,
    member_key,
    parse_member_key,
)
from shared.kv.status import AppStatusView, DeploymentStatusView
from shared.kv.targets import ReplicaTarget, TargetKey, agent_pattern, app_pattern, target_key
from shared.replicaspec import ReplicaSpec
from shared.subjects import deployment_key

TOK = st.from_regex(r"\A[A-Za-z0-9_-]{1,20}\Z")
SPEC = ReplicaSpec(
    "pkg.mod:Model",
    init_args=(1, "two", None),
    init_kwargs={"k": [1, 2], "nested": {"x": 1.5}},
    max_ongoing_requests=7,
    health_check_period_s=0.5,
    graceful_shutdown_timeout_s=0.0,
    metrics_interval_s=2.0,
    push_metrics=True,
    env={"MODEL_DIR": "/models", "EMPTY": ""},
)


def target(**kw: object) -> ReplicaTarget:
    base: dict[str, object] = dict(
        app="shop", deployment="Cart", replica_id="shop-Cart-ab12-1f", agent_id="agent-a",
        slot=3, order=12, version=SPEC.version(), rpc_subject="fp.v1.rpc.shop.Cart.shop-Cart-ab12-1f",
        spec=SPEC, owner_epoch=7,
    )  # fmt: skip
    base.update(kw)
    return ReplicaTarget(**base)  # type: ignore[arg-type]


def member(**kw: object) -> Member:
    base: dict[str, object] = dict(
        app="shop", deployment="Cart", slot=3, replica_id="shop-Cart-ab12-1f",
        rpc_subject="fp.v1.rpc.shop.Cart.shop-Cart-ab12-1f", order=12, epoch=4, owner_epoch=7,
    )  # fmt: skip
    base.update(kw)
    return Member(**base)  # type: ignore[arg-type]


# -- keys ------------------------------------------------------------------------------------------


def test_deployment_key() -> None:
    assert deployment_key("shop", "Cart") == "shop.Cart"


@given(TOK, TOK, TOK, st.integers(0, 2**31))
def test_target_key_round_trips(agent: str, app: str, dep: str, slot: int) -> None:
    key = target_key(agent, app, dep, slot)
    assert TargetKey.parse(key) == TargetKey(agent, app, dep, slot)
    assert subject_matches(agent_pattern(agent), key)
    assert subject_matches(app_pattern(app), key)


@given(TOK, TOK, st.integers(0, 2**31))
def test_member_key_round_trips(app: str, dep: str, slot: int) -> None:
    key = member_key(app, dep, slot)
    assert parse_member_key(key) == (app, dep, slot)
    assert subject_matches(deployment_pattern(app, dep), key)


@pytest.mark.parametrize(
    "key", ["a.shop.Cart", "a.shop.Cart.x", "a.shop.Cart.-1", "a.shop.Cart.1.2", "a b.shop.C.1", ""]
)
def test_a_bad_target_key_is_a_wire_error(key: str) -> None:
    with pytest.raises(WireError) as err:
        TargetKey.parse(key)
    assert err.value.reason == "bad_value"


@pytest.mark.parametrize("key", ["shop.Cart", "shop.Cart.x", "shop.Cart.1.2", "nodot", "a b.C.1"])
def test_a_bad_member_key_is_a_wire_error(key: str) -> None:
    with pytest.raises(WireError) as err:
        parse_member_key(key)
    assert err.value.reason == "bad_value"


def test_patterns_select_exactly_their_keys() -> None:
    # an agent reads only its own targets; a takeover reads one app's; a router one deployment's
    assert subject_matches(agent_pattern("a"), "a.shop.Cart.0")
    assert not subject_matches(agent_pattern("a"), "ab.shop.Cart.0")
    assert subject_matches(app_pattern("shop"), "any-agent.shop.Cart.0")
    assert not subject_matches(app_pattern("shop"), "any-agent.shopx.Cart.0")
    assert not subject_matches(app_pattern("shop"), "shop.Cart.0.1")
    assert subject_matches(deployment_pattern("shop", "Cart"), "shop.Cart.0")
    assert not subject_matches(deployment_pattern("shop", "Cart"), "shop.Cartx.0")
    assert not subject_matches(deployment_pattern("shop", "Cart"), "shop.Other.0")


def test_a_value_must_sit_under_its_own_key() -> None:
    t, m = target(), member()
    assert t.key == "agent-a.shop.Cart.3" and m.key == "shop.Cart.3"
    t.check_key("agent-a.shop.Cart.3")
    m.check_key("shop.Cart.3")
    for key in ("agent-b.shop.Cart.3", "agent-a.shop.Cart.4", "agent-a.shop.Other.3"):
        with pytest.raises(WireError):
            t.check_key(key)
    for key in ("shop.Cart.4", "shop.Other.3", "blog.Cart.3"):
        with pytest.raises(WireError):
            m.check_key(key)


# -- encode / decode -------------------------------------------------------------------------------


def reference_encode(document: ReplicaTarget | Member) -> bytes:
    """The documented encoding (docs/wire.md): the envelope and the fields as a JSON object with
    sorted keys and no spaces, so the same document always gives the same bytes."""
    body = {"v": 1, "kind": document.KIND, **document.to_doc()}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def test_targets_members_and_status_round_trip() -> None:
    t, m = target(), member()
    assert envelope.decode(envelope.encode(t), ReplicaTarget) == t
    assert envelope.decode(envelope.encode(m), Member) == m
    assert envelope.encode(t) == reference_encode(t)
    assert envelope.encode(m) == reference_encode(m)
    doc = json.loads(envelope.encode(t))
    assert (doc["v"], doc["kind"], doc["spec"]["env"]) == (1, "replica_target", dict(SPEC.env))
    s = AppStatusView(
        "shop",
        "RUNNING",
        "/shop",
        "Cart",
        1.5,
        7,
        {"Cart": DeploymentStatusView("HEALTHY", "1/1", 1, 1, 0.5, 1, 0, "hold")},
    )
    assert AppStatusView.decode(s.encode()) == s
    # one document kind is never read as another
    for data, cls in (
        (s.encode(), ReplicaTarget),
        (envelope.encode(m), ReplicaTarget),
        (envelope.encode(t), Member),
    ):
        with pytest.raises(WireError) as err:
            envelope.decode(data, cls)  # type: ignore[type-var]
        assert err.value.reason == "unexpected_kind"
    with pytest.raises(WireError):
        AppStatusView.decode(b"{not json")


@given(TOK, TOK, TOK, TOK, st.integers(0, 2**31), st.integers(0, 2**62), st.integers(0, 2**62))
def test_member_and_target_round_trip(
    app: str, dep: str, rid: str, agent: str, slot: int, order: int, epoch: int
) -> None:
    m = Member(app, dep, slot, rid, f"fp.v1.rpc.{app}.{dep}.{rid}", order, epoch, epoch // 2)
    assert envelope.decode(envelope.encode(m), Member) == m
    t = ReplicaTarget(app, dep, rid, agent, slot, order, "v1", m.rpc_subject, SPEC, epoch)
    assert envelope.decode(envelope.encode(t), ReplicaTarget) == t
    assert envelope.encode(t) == reference_encode(t)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"epoch": -1}, "bad_value"),
        ({"epoch": 1.5}, "wrong_type"),
        ({"slot": "3"}, "wrong_type"),
        ({"replica_id": [1]}, "wrong_type"),
        ({"replica_id": "a.b"}, "bad_value"),
        ({"rpc_subject": None}, "wrong_type"),
    ],
)
def test_bad_member_fields_are_wire_errors(change: dict[str, object], reason: str) -> None:
    doc = json.loads(envelope.encode(member()))
    doc.update(change)
    with pytest.raises(WireError) as err:
        envelope.decode(json.dumps(doc).encode(), Member)
    assert err.value.reason == reason


def test_an_older_writer_s_target_without_owner_epoch_decodes() -> None:
    doc = json.loads(envelope.encode(target()))
    del doc["owner_epoch"]
    assert envelope.decode(json.dumps(doc).encode(), ReplicaTarget).owner_epoch == 0


def test_values_are_small_whatever_the_deployment_size() -> None:
    # what the old layout sent per deployment (~150 B per replica in one value) is now one small
    # value per replica; a member is what a router reads per change
    assert len(envelope.encode(member(slot=65535, order=2**40, epoch=2**40))) < 300
    plain = target(spec=ReplicaSpec("pkg.mod:Model"), slot=65535, order=2**40)
    assert len(envelope.encode(plain)) < 1024


# -- the router's view ---------------------------------------------------------------------------


def test_membership_view_applies_puts_and_deletes_per_slot() -> None:
    view = MembershipView("shop", "Cart")
    a = member(slot=0, replica_id="a", rpc_subject="rpc.a", order=2, epoch=1)
    b = member(slot=1, replica_id="b", rpc_subject="rpc.b", order=1, epoch=3)
    assert view.put(a.key, a) and view.put(b.key, b)
    assert [m.replica_id for m in view.members()] == ["b", "a"]  # start order, not slot order
    assert view.epoch == 3 and len(view) == 2
    # the same member again (a re-delivery, or only the epoch moved): not a change
    assert not view.put(
        a.key, member(slot=0, replica_id="a", rpc_subject="rpc.a", order=2, epoch=4)
    )
    assert view.epoch == 4
    # another replica in the slot, or a new rpc subject: a change
    c = member(slot=0, replica_id="c", rpc_subject="rpc.c", order=3, epoch=5)
    assert view.put(c.key, c)
    assert view.put(c.key, member(slot=0, replica_id="c", rpc_subject="rpc.c2", order=3, epoch=5))
    assert [m.replica_id for m in view.members()] == ["b", "c"]
    assert view.delete("shop.Cart.1") and not view.delete("shop.Cart.1")
    assert not view.delete("not a key")
    assert [m.replica_id for m in view.members()] == ["c"] and view.epoch == 5
    assert view.clear() and not view.clear() and view.members() == []
    assert view.epoch == 5  # an empty view keeps its epoch


def test_membership_view_refuses_another_deployment_s_member() -> None:
    view = MembershipView("shop", "Cart")
    other = member(deployment="Other")
    with pytest.raises(WireError):
        view.put(other.key, other)
    with pytest.raises(WireError):
        view.put("shop.Cart.3", other)  # under our key, but not ours
    with pytest.raises(WireError):
        view.put("shop.Cart.4", member())  # another slot's value
    assert len(view) == 0 and view.epoch == 0

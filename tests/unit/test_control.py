import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.control import Member, Membership, deployment_key, split_deployment_key
from shared.errors import WireError

TOK = st.from_regex(r"\A[A-Za-z0-9_-]{1,20}\Z")


@given(TOK, TOK, st.integers(0, 2**62), st.lists(st.tuples(TOK, TOK), max_size=20))
def test_membership_round_trips(
    app: str, dep: str, epoch: int, reps: list[tuple[str, str]]
) -> None:
    m = Membership(app, dep, epoch, tuple(Member(a, b) for a, b in reps))
    assert Membership.decode(m.encode()) == m


@pytest.mark.parametrize(
    "payload,reason",
    [
        (b"\xc1", "malformed"),
        (msgpack.packb([1, 2]), "wrong_type"),
        (msgpack.packb({"v": 2, "kind": "membership"}), "unsupported_version"),
        (msgpack.packb({"v": 1, "kind": "status"}), "unexpected_kind"),
        (
            msgpack.packb(
                {
                    "v": 1,
                    "kind": "membership",
                    "app": "a",
                    "deployment": "d",
                    "epoch": -1,
                    "replicas": [],
                }
            ),
            "wrong_type",
        ),
        (
            msgpack.packb(
                {
                    "v": 1,
                    "kind": "membership",
                    "app": "a",
                    "deployment": "d",
                    "epoch": 1,
                    "replicas": [[1]],
                }
            ),
            "wrong_type",
        ),
    ],
)
def test_bad_membership_is_a_wire_error(payload: bytes, reason: str) -> None:
    with pytest.raises(WireError) as e:
        Membership.decode(payload)
    assert e.value.reason == reason


def test_deployment_key_round_trip() -> None:
    assert split_deployment_key(deployment_key("shop", "Cart")) == ("shop", "Cart")
    with pytest.raises(WireError):
        split_deployment_key("nodot")


def test_targets_and_status_round_trip() -> None:
    from shared.control import (
        AppStatusView,
        DeploymentStatusView,
        ReplicaTarget,
        TargetSet,
    )

    t = TargetSet(
        "shop",
        "Cart",
        "v3",
        owner_epoch=7,
        membership_epoch=4,
        replicas=(
            ReplicaTarget("Cart-1", "v3", "RUNNING", "agent-a", "fp.v1.rpc.shop.Cart.Cart-1"),
        ),
        config={"name": "Cart", "import_path": "m:C"},
    )
    assert TargetSet.decode(t.encode()) == t
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
    with pytest.raises(WireError):
        TargetSet.decode(s.encode())
    with pytest.raises(WireError):
        AppStatusView.decode(b"{not json")

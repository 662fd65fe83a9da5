"""The HAProxy front door's pure core: state from registry + membership, slots, transitions, and
the configuration's routing rules (services/proxy/haproxy_config.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.proxy.haproxy_config import (
    PASSIVE_HEALTH,
    PYTHON_BACKEND,
    AppFront,
    Endpoint,
    FrontSettings,
    FrontState,
    assign_slots,
    endpoints_of,
    front_state,
    normalize_prefix,
    render_config,
    transition,
)
from services.proxy.registry import Route, RouteTable
from shared.kv.membership import Member

SETTINGS = FrontSettings(
    bind="127.0.0.1:18080",
    python_host="127.0.0.1",
    python_port=18081,
    admin_socket="/tmp/x/admin.sock",
    queue_timeout_s=60.0,
    retry_after_s=5,
)


def route(app: str, prefix: str | None, registered: bool = True, ingress: str = "Api") -> Route:
    return Route(app, prefix, ingress, registered, False, "", {})


def table(*routes: Route) -> RouteTable:
    return RouteTable({r.app: r for r in routes})


def ep(rid: str, port: int = 9000, maxconn: int = 5, host: str = "10.0.0.1") -> Endpoint:
    return Endpoint(rid, host, port, maxconn)


def member(rid: str, address: str | None, slot: int = 0, ongoing: int | None = 7) -> Member:
    return Member(
        app="shop",
        deployment="Api",
        slot=slot,
        replica_id=rid,
        rpc_subject=f"fp.rpc.{rid}",
        order=slot,
        epoch=1,
        max_ongoing_requests=ongoing,
        http_address=address,
    )


# -- slots ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("previous", "now", "expected"),
    [
        # first fill: lowest slots, by replica id; at least 4 slots
        ((), ["b", "a"], ("a", "b", None, None)),
        # a replica keeps its slot; a newcomer takes the lowest free one
        (("a", "b", None, None), ["b", "c"], ("c", "b", None, None)),
        # removal empties the slot, nothing moves
        (("a", "b", "c", None), ["a", "c"], ("a", None, "c", None)),
        # growth past the slots doubles them; existing ones stay put
        (("a", "b", "c", "d"), ["a", "b", "c", "d", "e"], ("a", "b", "c", "d", "e") + (None,) * 3),
        # never shrinks
        (("a", None, None, None, None, None, None, None), [], (None,) * 8),
    ],
)
def test_slots_are_sticky_and_grow_in_powers_of_two(
    previous: tuple[str | None, ...], now: list[str], expected: tuple[str | None, ...]
) -> None:
    before = tuple(ep(r) if r else None for r in previous)
    slots = assign_slots(before, [ep(r) for r in now])
    assert tuple(s.replica_id if s else None for s in slots) == expected


@given(st.lists(st.lists(st.sampled_from("abcdefghij"), unique=True, max_size=10), max_size=6))
def test_slots_hold_every_endpoint_once_and_keep_survivors_in_place(
    rounds: list[list[str]],
) -> None:
    slots: tuple[Endpoint | None, ...] = ()
    for ids in rounds:
        new = assign_slots(slots, [ep(r) for r in ids])
        placed = [s.replica_id for s in new if s is not None]
        assert sorted(placed) == sorted(ids)
        assert len(new) >= len(slots) and len(new) >= 4
        for i, old in enumerate(slots):
            if old is not None and old.replica_id in ids:
                assert new[i] is not None and new[i].replica_id == old.replica_id  # type: ignore[union-attr]
        slots = new


# -- the state ----------------------------------------------------------------------------------


def test_state_from_registry_and_members() -> None:
    t = table(route("shop", "/shop/"), route("nohttp", None), route("down", "/down", False))
    state = front_state(t, {"shop": [ep("r1")]}, {"shop": 50}, None, default_max_queued=1000)
    assert [a.app for a in state.apps] == ["down", "shop"]  # nohttp has no prefix: not served
    shop = state.app("shop")
    assert shop is not None and shop.prefix == "/shop" and shop.serving and shop.max_queued == 50
    down = state.app("down")
    assert down is not None and not down.serving and down.max_queued == 1000
    assert state.direct


def test_a_prefix_haproxy_cannot_match_safely_sends_everything_to_python() -> None:
    state = front_state(
        table(route("a", "/a b"), route("b", "/b")), {}, {}, None, default_max_queued=10
    )
    assert not state.direct
    config = render_config(state, SETTINGS)
    assert "use_backend app_" not in config and "backend app_b" not in config


def test_endpoints_from_members_resolve_hosts_and_default_maxconn() -> None:
    members = [
        member("r1", "10.1.2.3:8001"),
        member("r2", None),  # no HTTP: only NATS reaches it
        member("r3", "agent-1:8002", ongoing=None),
        member("r4", "gone:8003"),
        member("r5", "[::1]:8004"),
    ]
    resolved = {"agent-1": "172.18.0.5"}
    got = endpoints_of(members, resolved.get, default_maxconn=5)
    assert got == [
        Endpoint("r1", "10.1.2.3", 8001, 7),
        Endpoint("r3", "172.18.0.5", 8002, 5),
        Endpoint("r5", "::1", 8004, 7),
    ]


@pytest.mark.parametrize(
    ("given_prefix", "normal"), [("/", "/"), ("", "/"), ("shop", "/shop"), ("/a/b//", "/a/b")]
)
def test_normalize_prefix(given_prefix: str, normal: str) -> None:
    assert normalize_prefix(given_prefix) == normal


# -- transitions --------------------------------------------------------------------------------


def _state(slots: tuple[Endpoint | None, ...], serving: bool = True, **kw: object) -> FrontState:
    app = AppFront("shop", "/shop", serving, 100, slots)
    return FrontState((replace(app, **kw),))  # type: ignore[arg-type]


NONE4: tuple[Endpoint | None, ...] = (None,) * 4


@pytest.mark.parametrize(
    ("old", "new", "commands"),
    [
        pytest.param(_state(NONE4), _state(NONE4), [], id="nothing changed"),
        pytest.param(
            _state(NONE4),
            _state((ep("r1", 9001, 3), None, None, None)),
            [
                "set server app_shop/s0 addr 10.0.0.1 port 9001",
                "set server app_shop/s0 health up",
                "set maxconn server app_shop/s0 3",
                "set server app_shop/s0 state ready",
                "set server mux_shop/s0 addr 10.0.0.1 port 9001",
                "set server mux_shop/s0 health up",
                "set maxconn server mux_shop/s0 3",
                "set server mux_shop/s0 state ready",
            ],
            id="a replica joins",
        ),
        pytest.param(
            _state((ep("r1"), ep("r2"), None, None)),
            _state((ep("r1"), None, None, None)),
            ["set server app_shop/s1 state maint", "set server mux_shop/s1 state maint"],
            id="a replica leaves: maintenance before it stops",
        ),
        pytest.param(
            _state((ep("r1", maxconn=5), None, None, None)),
            _state((ep("r1", maxconn=9), None, None, None)),
            ["set maxconn server app_shop/s0 9", "set maxconn server mux_shop/s0 9"],
            id="max_ongoing_requests changes",
        ),
        pytest.param(
            _state((ep("r1", port=1), None, None, None)),
            _state((ep("r1", port=2), None, None, None)),
            [
                "set server app_shop/s0 addr 10.0.0.1 port 2",
                "set server app_shop/s0 health up",
                "set server mux_shop/s0 addr 10.0.0.1 port 2",
                "set server mux_shop/s0 health up",
            ],
            id="a replica moves",
        ),
        pytest.param(
            _state((ep("r1"), None, None, None)),
            _state((ep("r1"), None, None, None), serving=False),
            ["set server app_shop/s0 state maint", "set server mux_shop/s0 state maint"],
            id="the app is deregistered: its requests go to the Python proxy",
        ),
        pytest.param(
            _state((ep("r1"), None, None, None), serving=False),
            _state((ep("r1"), None, None, None)),
            [
                "set server app_shop/s0 addr 10.0.0.1 port 9000",
                "set server app_shop/s0 health up",
                "set maxconn server app_shop/s0 5",
                "set server app_shop/s0 state ready",
                "set server mux_shop/s0 addr 10.0.0.1 port 9000",
                "set server mux_shop/s0 health up",
                "set maxconn server mux_shop/s0 5",
                "set server mux_shop/s0 state ready",
            ],
            id="registered again",
        ),
    ],
)
def test_membership_changes_are_runtime_commands(
    old: FrontState, new: FrontState, commands: list[str]
) -> None:
    step = transition(old, new)
    assert not step.reload
    assert list(step.commands) == commands


@pytest.mark.parametrize(
    ("old", "new"),
    [
        pytest.param(None, _state(NONE4), id="first configuration"),
        pytest.param(_state(NONE4), FrontState(), id="an app goes"),
        pytest.param(FrontState(), _state(NONE4), id="an app comes"),
        pytest.param(_state(NONE4), _state(NONE4, prefix="/store"), id="its prefix changes"),
        pytest.param(_state(NONE4), _state((None,) * 8), id="more slots"),
        pytest.param(_state(NONE4), _state(NONE4, max_queued=5), id="its queue bound changes"),
    ],
)
def test_shape_changes_reload(old: FrontState | None, new: FrontState) -> None:
    step = transition(old, new)
    assert step.reload and step.commands == ()


# -- the configuration ------------------------------------------------------------------------


def _rules(config: str) -> list[str]:
    return [line.strip() for line in config.splitlines() if line.strip().startswith("use_backend")]


def test_routing_rules_longest_prefix_first_with_fallback_to_python() -> None:
    state = front_state(
        table(route("root", "/"), route("shop", "/shop"), route("deep", "/shop/cart")),
        {},
        {},
        None,
        default_max_queued=100,
    )
    config = render_config(state, SETTINGS)
    rules = _rules(config)
    assert rules[0] == f"use_backend {PYTHON_BACKEND} if {{ path /-/healthz /-/routes /metrics }}"
    order = [r.split()[1] for r in rules[1:]]
    assert order == [
        "mux_deep", "app_deep", PYTHON_BACKEND,
        "mux_shop", "app_shop", PYTHON_BACKEND,
        "mux_root", "app_root",
    ]  # fmt: skip
    assert "acl p_shop path,url_dec -m str /shop" in config
    assert "acl p_shop path,url_dec -m beg /shop/" in config  # whole segments: not /shopping
    assert "use_backend app_shop if p_shop { nbsrv(app_shop) gt 0 }" in config
    assert (
        "use_backend mux_shop if p_shop { req.hdr(serve_multiplexed_model_id) -m found } "
        "{ nbsrv(app_shop) gt 0 }" in config
    )
    assert f"default_backend {PYTHON_BACKEND}" in config


def test_backends_balance_bound_and_retry() -> None:
    state = front_state(
        table(route("shop", "/shop")),
        {"shop": [ep("r1", 9001, 3)]},
        {"shop": 20},
        None,
        default_max_queued=100,
    )
    config = render_config(state, SETTINGS)
    app = config.split("backend app_shop\n")[1].split("\n\n")[0]
    mux = config.split("backend mux_shop\n")[1].split("\n\n")[0]
    assert "balance random(2)" in app
    assert "balance hdr(serve_multiplexed_model_id)" in mux and "hash-type consistent" in mux
    assert "hash-balance-factor 150" in mux
    for backend in (app, mux):
        assert f"server s0 10.0.0.1:9001 maxconn 3 maxqueue 20 {PASSIVE_HEALTH}\n" in backend + "\n"
        assert f"server s1 127.0.0.1:9 maxconn 1 maxqueue 20 {PASSIVE_HEALTH} disabled" in backend
        assert "if { queue() ge 20 }" in backend and "Fp-Error backpressure" in backend
        assert "set-header X-Forwarded-Prefix /shop" in backend
        # no replica left (all down or gone): the Python proxy holds or says why
        assert "server fp_python 127.0.0.1:18081 backup" in backend
    assert "retry-on conn-failure empty-response 503" in config and "option redispatch 1" in config
    assert "timeout queue 60000ms" in config
    # health from what requests see: no HTTP check, a healthy replica is not probed
    assert "httpchk" not in config and "inter 24d" in PASSIVE_HEALTH
    assert "on-error mark-down" in PASSIVE_HEALTH


def test_an_unregistered_app_has_every_slot_disabled() -> None:
    state = front_state(
        table(route("shop", "/shop", registered=False)),
        {"shop": [ep("r1")]},
        {},
        None,
        default_max_queued=100,
    )
    servers = [ln for ln in render_config(state, SETTINGS).splitlines() if " server s" in ln]
    assert servers and all(ln.endswith(" disabled") for ln in servers)


def test_ipv6_servers_are_bracketed() -> None:
    state = _state((ep("r1", host="::1"), None, None, None))
    assert "server s0 [::1]:9000 maxconn 5 " in render_config(state, SETTINGS)

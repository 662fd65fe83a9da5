"""The auth callout's decisions and wire (services/auth/core.py, callout.py), without a server."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.auth import core
from services.auth.callout import parse_request, response, user_claims
from services.auth.core import (
    PASSWORD_ROLES,
    AuthPolicy,
    ConnectOpts,
    Granted,
    Refused,
    authorize,
    replica_permissions,
    role_permissions,
)
from shared.natsjwt import PREFIX_ACCOUNT, PREFIX_SERVER, PREFIX_USER, KeyPair, TokenError, decode
from shared.natsroles import ROLE_BY_NAME, ROLES, Role
from shared.replicacred import ReplicaIdentity, mint
from shared.subjects import TOKEN_PATTERN

NAMES = st.from_regex(f"\\A{TOKEN_PATTERN}\\Z", fullmatch=True)
AGENT = KeyPair.generate(PREFIX_USER)
NOW = 1_700_000_000.0
POLICY = AuthPolicy(
    trusted_replica_keys=frozenset({AGENT.public_key}),
    role_passwords={r: f"pw-{r}" for r in PASSWORD_ROLES},
)


def who(app: str = "a", dep: str = "d", rid: str = "r1") -> ReplicaIdentity:
    return ReplicaIdentity(app, dep, rid, NOW, NOW + 60, AGENT.public_key)


@given(NAMES, NAMES, NAMES)
def test_a_replica_may_speak_and_listen_for_itself_only(app: str, dep: str, rid: str) -> None:
    p = replica_permissions(who(app, dep, rid))
    fp = [s for s in (*p.pub_allow, *p.sub_allow) if s.startswith("fp.")]
    assert all(">" not in s and "*" not in s for s in fp)  # nothing wide is left
    assert sorted(p.sub_allow) == sorted(
        [f"fp.v1.rpc.{app}.{dep}.{rid}", f"fp.v1.probe.{rid}", f"_INBOX_{rid}.>"]
    )
    assert {s for s in p.pub_allow if s.startswith("fp.")} == {
        f"fp.v1.report.{k}.{app}.{dep}.{rid}" for k in ("replica", "heartbeat", "lifecycle")
    }  # its own id in the subject: not its siblings' reports
    role = ROLE_BY_NAME["replica"]
    assert p.pub_deny == tuple(role.deny_publish)
    # the KV reads stay as the role declares them (derived, not copied)
    assert [s for s in p.pub_allow if s.startswith("$")] == [
        s for s in role.publish if s.startswith("$")
    ]


def test_a_new_wide_rule_in_the_replica_role_must_get_a_narrowing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    role = ROLE_BY_NAME["replica"]
    wider = dataclasses.replace(role, subscribe=[*role.subscribe, "fp.v1.call.>"])
    monkeypatch.setitem(core.ROLE_BY_NAME, "replica", wider)
    with pytest.raises(ValueError, match="no rule narrows"):
        replica_permissions(who())


@pytest.mark.parametrize("role", [r for r in ROLES if r.user != "replica"], ids=lambda r: r.user)
def test_roles_log_in_with_their_password_and_get_their_rules(role: Role) -> None:
    got = authorize(ConnectOpts(user=role.user, password=f"pw-{role.user}"), POLICY, NOW)
    assert isinstance(got, Granted) and got.role == role.user
    assert got.permissions == role_permissions(role)
    assert got.permissions.pub_allow == tuple(role.publish)
    assert got.permissions.sub_allow == tuple(role.subscribe)
    wrong = authorize(ConnectOpts(user=role.user, password="nope"), POLICY, NOW)
    assert isinstance(wrong, Refused) and wrong.reason == "bad password"


@pytest.mark.parametrize(
    ("opts", "reason"),
    [
        (ConnectOpts(user="replica", password="pw-replica"), "unknown role"),  # no shared login
        (ConnectOpts(user="admin", password="x"), "unknown role"),
        (ConnectOpts(), "no credentials"),
        (ConnectOpts(token="garbage"), "bad token"),
        (
            ConnectOpts(token=mint(KeyPair.generate(PREFIX_USER), "a", "d", "r", now=NOW, ttl_s=9)),
            "untrusted signer",
        ),
        (ConnectOpts(token=mint(AGENT, "a", "d", "r", now=NOW - 99, ttl_s=9)), "expired"),
    ],
)
def test_refusals_say_why(opts: ConnectOpts, reason: str) -> None:
    got = authorize(opts, POLICY, NOW)
    assert isinstance(got, Refused) and got.reason == reason


def test_a_role_without_a_password_configured_cannot_log_in() -> None:
    policy = AuthPolicy(trusted_replica_keys=frozenset(), role_passwords={})
    got = authorize(ConnectOpts(user="controller", password=""), policy, NOW)
    assert isinstance(got, Refused) and got.reason == "unknown role"


def test_a_credential_grants_its_replica() -> None:
    token = mint(AGENT, "a", "d", "r1", now=NOW, ttl_s=60)
    got = authorize(ConnectOpts(token=token), POLICY, NOW + 1)
    assert isinstance(got, Granted) and got.identity is not None
    assert got.name == "replica a.d.r1" and got.permissions == replica_permissions(got.identity)


def server_request(server: KeyPair, user_nkey: str, opts: dict[str, object]) -> str:
    from shared.natsjwt import encode

    claims = {
        "sub": "AAUTH",
        "aud": "nats-authorization-request",
        "exp": NOW + 2,
        "nats": {
            "type": "authorization_request",
            "version": 2,
            "user_nkey": user_nkey,
            "server_id": {"name": "s", "host": "127.0.0.1", "id": server.public_key},
            "client_info": {"host": "10.0.0.1", "id": 7},
            "connect_opts": opts,
        },
    }
    return encode(claims, server)


def test_callout_wire_round_trip() -> None:
    server = KeyPair.generate(PREFIX_SERVER)
    issuer = KeyPair.generate(PREFIX_ACCOUNT)
    user_nkey = KeyPair.generate(PREFIX_USER).public_key
    token = mint(AGENT, "a", "d", "r1", now=NOW, ttl_s=60)
    req = parse_request(
        server_request(server, user_nkey, {"auth_token": token, "name": "replica-r1"}), now=NOW
    )
    assert (req.user_nkey, req.server_id, req.opts.token, req.opts.host) == (
        user_nkey, server.public_key, token, "10.0.0.1"
    )  # fmt: skip
    got = authorize(req.opts, POLICY, NOW)
    assert isinstance(got, Granted)
    raw = response(
        req,
        issuer,
        now=NOW,
        user=user_claims(req, got.name, got.permissions, account="$G", now=NOW),
    )
    answer = decode(raw.decode(), now=NOW)
    assert answer["iss"] == issuer.public_key and answer["sub"] == user_nkey
    assert answer["aud"] == server.public_key
    assert answer["nats"]["type"] == "authorization_response"
    user = decode(answer["nats"]["jwt"], now=NOW)
    assert user["iss"] == issuer.public_key and user["sub"] == user_nkey and user["aud"] == "$G"
    assert user["nats"]["sub"]["allow"] == list(got.permissions.sub_allow)
    assert user["nats"]["pub"]["deny"] == list(got.permissions.pub_deny)
    refused = decode(response(req, issuer, now=NOW, error="expired").decode())
    assert refused["nats"]["error"] == "expired" and "jwt" not in refused["nats"]


def test_requests_not_from_a_server_are_dropped() -> None:
    user_nkey = KeyPair.generate(PREFIX_USER).public_key
    forged = server_request(KeyPair.generate(PREFIX_USER), user_nkey, {})  # signed, not a server
    with pytest.raises(TokenError):
        parse_request(forged, now=NOW)
    with pytest.raises(TokenError, match="expired"):
        parse_request(server_request(KeyPair.generate(PREFIX_SERVER), user_nkey, {}), now=NOW + 5)

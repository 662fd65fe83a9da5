"""The auth callout's wire: the server's authorization request in, our signed response out.

How it works (nats-server's auth_callout.go): for each connecting client the server publishes a
JWT (`authorization_request`, signed by the server's key) on `$SYS.REQ.USER.AUTH`, naming a fresh
user nkey made for this connection and the client's CONNECT options. The answer is a JWT
(`authorization_response`) for that user nkey and that server id, signed by the issuer key the
server config names, carrying either a user JWT (the connection's account and permissions) or
an error. Because the user nkey is new per attempt, an answer cannot be replayed for another.

Pure: `now` comes from the caller; the keys are passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.natsjwt import PREFIX_SERVER, PREFIX_USER, KeyPair, TokenError, decode, decode_public
from shared.natsjwt import encode as encode_jwt

from .core import ConnectOpts, Permissions

CALLOUT_SUBJECT = "$SYS.REQ.USER.AUTH"
GLOBAL_ACCOUNT = "$G"
"""Where callout users land on a server without an `accounts` block (the embedded server)."""


@dataclass(frozen=True, slots=True)
class AuthRequest:
    user_nkey: str
    server_id: str
    opts: ConnectOpts


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def parse_request(token: str, *, now: float) -> AuthRequest:
    """The request in a server's JWT; TokenError if it is not one (bad signature, not signed by
    a server key, expired, fields missing)."""
    claims = decode(token, now=now)
    decode_public(claims["iss"], PREFIX_SERVER)
    nats = claims.get("nats")
    if not isinstance(nats, dict) or nats.get("type") != "authorization_request":
        raise TokenError("bad request", "not an authorization request")
    user_nkey = _str(nats.get("user_nkey"))
    server = nats.get("server_id")
    server_id = _str(server.get("id")) if isinstance(server, dict) else None
    if user_nkey is None or server_id is None:
        raise TokenError("bad request", "no user nkey or server id")
    decode_public(user_nkey, PREFIX_USER)
    co = nats.get("connect_opts")
    co = co if isinstance(co, dict) else {}
    ci = nats.get("client_info")
    ci = ci if isinstance(ci, dict) else {}
    opts = ConnectOpts(
        user=_str(co.get("user")),
        password=_str(co.get("pass")),
        token=_str(co.get("auth_token")),
        name=_str(co.get("name")),
        host=_str(ci.get("host")),
    )
    return AuthRequest(user_nkey, server_id, opts)


def _perm(allow: tuple[str, ...], deny: tuple[str, ...]) -> dict[str, list[str]]:
    out = {"allow": list(allow)}
    if deny:
        out["deny"] = list(deny)
    return out


def user_claims(
    req: AuthRequest, name: str, perms: Permissions, *, account: str, now: float
) -> dict[str, Any]:
    """A user JWT's claims: no expiry (the connection lives as long as its socket; the
    credential's window governs connecting, see docs/architecture.md), no limits beyond the
    server's."""
    return {
        "sub": req.user_nkey,
        "aud": account,
        "name": name,
        "iat": int(now),
        "nats": {
            "pub": _perm(perms.pub_allow, perms.pub_deny),
            "sub": _perm(perms.sub_allow, perms.sub_deny),
            "subs": -1,
            "data": -1,
            "payload": -1,
            "type": "user",
            "version": 2,
        },
    }


def response(
    req: AuthRequest,
    issuer: KeyPair,
    *,
    now: float,
    user: dict[str, Any] | None = None,
    error: str | None = None,
) -> bytes:
    """The signed answer: the user JWT (issued by `issuer` too) or the error."""
    nats: dict[str, Any] = {"type": "authorization_response", "version": 2}
    if user is not None:
        nats["jwt"] = encode_jwt(user, issuer)
    else:
        nats["error"] = error or "not authorized"
    claims = {"sub": req.user_nkey, "aud": req.server_id, "iat": int(now), "nats": nats}
    return encode_jwt(claims, issuer).encode()

"""Replica credentials: what a node agent hands a replica so the auth callout knows who it is.

How it works: a credential is a NATS-style JWT (shared.natsjwt) signed with the agent's replica
key (an nkey seed, `U...` public key) whose claims bind one replica: `sub` the replica id, `fp`
its app and deployment, `iat`/`exp` a short window. The auth callout (services/auth) accepts it
only when the signature verifies, the signing key is one it trusts, and the window is open; the
permissions it then grants name that app, deployment and replica, so the credential is useless
for any other. A replica presents it as its NATS token, read from a file at every (re)connect:
the agent rewrites the file before the window closes (see `renew_at`), so a replica that
reconnects after a NATS restart, hours after its start, still gets in.

Pure: `now` comes from the caller.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from shared import settings
from shared.errors import UsageError
from shared.natsjwt import KeyPair, TokenError, decode, encode
from shared.subjects import TOKEN_PATTERN, validate_name

CREDENTIAL_TYPE = "fleetpulse-replica"
DEFAULT_TTL_S: float = settings.AGENT_CREDENTIAL_TTL.default
"""How long a credential lets its replica connect; the agent refreshes it at a third left."""
REFRESH_FRACTION = 1 / 3
INBOX_PREFIX = "_INBOX_"
"""A replica's inboxes are `_INBOX_{replica}.>`: its own, and subscribable by it alone."""

__all__ = ["CREDENTIAL_TYPE", "ReplicaIdentity", "TokenError", "inbox_prefix", "mint", "verify"]


@dataclass(frozen=True, slots=True)
class ReplicaIdentity:
    app: str
    deployment: str
    replica_id: str
    issued_at: float
    expires_at: float
    signer: str
    """The public key that signed it (which agent key, for logs and revocation)."""


def inbox_prefix(replica_id: str) -> str:
    return INBOX_PREFIX + validate_name(replica_id, "replica id")


def mint(
    key: KeyPair, app: str, deployment: str, replica_id: str, *, now: float, ttl_s: float
) -> str:
    if not ttl_s > 0:
        raise ValueError(f"a credential needs a positive lifetime, not {ttl_s!r}")
    claims = {
        "sub": validate_name(replica_id, "replica id"),
        "iat": int(now),
        "exp": int(now + ttl_s) + 1,  # whole seconds, never shorter than asked
        "name": f"replica {app}.{deployment}.{replica_id}",
        "fp": {
            "type": CREDENTIAL_TYPE,
            "app": validate_name(app, "app"),
            "deployment": validate_name(deployment, "deployment"),
        },
    }
    return encode(claims, key)


def verify(token: str, trusted: Collection[str], *, now: float) -> ReplicaIdentity:
    """The identity in `token`, or TokenError: bad encoding or signature, a signer not in
    `trusted`, outside its window, or not a replica credential."""
    claims = decode(token, now=now)
    if claims["iss"] not in trusted:
        raise TokenError("untrusted signer", f"key {claims['iss'][:12]}... is not trusted")
    fp = claims.get("fp")
    if not isinstance(fp, dict) or fp.get("type") != CREDENTIAL_TYPE:
        raise TokenError("not a replica credential")
    exp, iat = claims.get("exp"), claims.get("iat")
    if not isinstance(exp, int | float) or not isinstance(iat, int | float):
        raise TokenError("not a replica credential", "no validity window")
    names = (fp.get("app"), fp.get("deployment"), claims.get("sub"))
    if not all(isinstance(n, str) for n in names):
        raise TokenError("not a replica credential", "app, deployment or replica missing")
    try:
        app, deployment, replica = (validate_name(str(n)) for n in names)
    except UsageError as exc:  # names must stay single subject tokens
        raise TokenError("not a replica credential", f"names must match {TOKEN_PATTERN}") from exc
    return ReplicaIdentity(app, deployment, replica, float(iat), float(exp), claims["iss"])


def renew_at(issued_at: float, ttl_s: float) -> float:
    """When a credential issued at `issued_at` is due for renewal: with a third of its window
    left, so a renewal that fails has two more chances before the replica is locked out."""
    return issued_at + ttl_s * (1 - REFRESH_FRACTION)


def write_credential(path: Path, token: str) -> None:
    """Replace the file at once (a reader never sees half a token), readable by its owner only."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as out:
        out.write(token)
    os.replace(tmp, path)

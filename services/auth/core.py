"""Who a connection is and what it may do: the auth callout's decisions, without I/O.

How it works: `authorize(opts, policy, now)` looks at what the client sent in CONNECT.
- A token is a replica credential (shared.replicacred): verified against the trusted agent keys
  and the clock, it grants the replica role narrowed to that one replica (`replica_permissions`).
- A user and password name a role of shared.natsroles (controller, agent, router, recorder,
  operator) and grant that role's rules as they are; the shared `replica` role is not offered:
  a replica proves who it is with its own credential.
- Anything else is refused, with a reason (a metric label) and a detail (for the log).

The permissions come from the one role table (shared.natsroles); `replica_permissions` narrows
each wide subject of the replica role to the replica's own, and fails on one it does not know,
so a rule added to the role cannot silently stay wide for replicas.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field

from shared.natsjwt import TokenError
from shared.natsroles import ROLE_BY_NAME, Role
from shared.replicacred import ReplicaIdentity, inbox_prefix, verify

REPLICA_ROLE = "replica"
PASSWORD_ROLES = tuple(r for r in ROLE_BY_NAME if r != REPLICA_ROLE)
_PREFIX = "fp.v1."


@dataclass(frozen=True, slots=True)
class Permissions:
    pub_allow: tuple[str, ...]
    pub_deny: tuple[str, ...] = ()
    sub_allow: tuple[str, ...] = ()
    sub_deny: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ConnectOpts:
    """What the client sent, as the server forwards it in the authorization request."""

    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    name: str | None = None
    host: str | None = None


@dataclass(frozen=True, slots=True)
class AuthPolicy:
    trusted_replica_keys: frozenset[str]
    """Public keys (U...) of the agents' replica keys; a credential by another is refused."""
    role_passwords: Mapping[str, str] = field(default_factory=dict, repr=False)
    """Role name -> password; a role missing here cannot log in."""


@dataclass(frozen=True, slots=True)
class Granted:
    name: str
    """Who, for the server's logs and `connz` (`replica app.dep.id`, `role controller`)."""
    role: str
    permissions: Permissions
    identity: ReplicaIdentity | None = None


@dataclass(frozen=True, slots=True)
class Refused:
    reason: str
    detail: str


def role_permissions(role: Role) -> Permissions:
    return Permissions(
        pub_allow=tuple(role.publish),
        pub_deny=tuple(role.deny_publish),
        sub_allow=tuple(role.subscribe),
    )


def _narrow(subject: str, who: ReplicaIdentity) -> str:
    """The replica's own part of one wide subject of the replica role."""
    if subject == "_INBOX.>":
        return f"{inbox_prefix(who.replica_id)}.>"
    if not subject.startswith(_PREFIX) or not subject.endswith(".>"):
        raise ValueError(f"no rule narrows {subject!r} to one replica")
    family = subject[len(_PREFIX) : -2].split(".")
    if family[0] == "report" and len(family) == 2:
        # the subject names the replica too, so the server refuses it a sibling's reports
        return f"{_PREFIX}report.{family[1]}.{who.app}.{who.deployment}.{who.replica_id}"
    if family == ["rpc"]:
        return f"{_PREFIX}rpc.{who.app}.{who.deployment}.{who.replica_id}"
    if family == ["probe"]:
        return f"{_PREFIX}probe.{who.replica_id}"
    raise ValueError(f"no rule narrows {subject!r} to one replica")


def _kept(subject: str) -> bool:
    # KV reads name their bucket (their wildcard tails are consumers, keys); replies go to
    # whoever asked
    return subject == "_INBOX.>" or subject.startswith(("$JS.API.", "$JS.FC."))


def replica_permissions(who: ReplicaIdentity) -> Permissions:
    """The replica role for one replica: reports only on its deployment's subjects, requests
    only on its own rpc and probe subjects, inboxes only its own. Replies to callers' inboxes
    (`_INBOX.>` publish) stay: a replica answers whoever asked."""
    role = ROLE_BY_NAME[REPLICA_ROLE]
    pub = tuple(s if _kept(s) else _narrow(s, who) for s in role.publish)
    sub = tuple(_narrow(s, who) for s in role.subscribe)
    return Permissions(pub_allow=pub, pub_deny=tuple(role.deny_publish), sub_allow=sub)


def authorize(opts: ConnectOpts, policy: AuthPolicy, now: float) -> Granted | Refused:
    if opts.token:
        try:
            who = verify(opts.token, policy.trusted_replica_keys, now=now)
        except TokenError as exc:
            return Refused(exc.reason, str(exc))
        return Granted(
            f"replica {who.app}.{who.deployment}.{who.replica_id}",
            REPLICA_ROLE,
            replica_permissions(who),
            who,
        )
    if opts.user is None:
        return Refused("no credentials", "neither a replica credential nor a role login")
    expected = policy.role_passwords.get(opts.user)
    if opts.user not in PASSWORD_ROLES or expected is None:
        return Refused("unknown role", f"no role {opts.user!r} logs in with a password here")
    if not hmac.compare_digest((opts.password or "").encode(), expected.encode()):
        return Refused("bad password", f"wrong password for role {opts.user!r}")
    return Granted(f"role {opts.user}", opts.user, role_permissions(ROLE_BY_NAME[opts.user]))

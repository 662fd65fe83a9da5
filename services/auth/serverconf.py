"""The nats-server config block that sends every client through the auth callout.

For a server without an `accounts` block (the embedded one of `fleetpulse up`, the tests): the
listed users log in with their passwords and bypass the callout (the auth service itself, and
whoever is trusted with the whole server); everyone else is asked about, and lands in the
global account with the permissions the answer gives.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

AUTH_TIMEOUT_S = 2.0
"""How long the server waits for an answer before refusing the client: short, since a client
refused for a slow answer retries anyway."""


def callout_config(
    issuer_public_key: str, direct_users: Mapping[str, str], *, timeout_s: float = AUTH_TIMEOUT_S
) -> str:
    users = ", ".join(
        f"{{ user: {json.dumps(u)}, password: {json.dumps(p)} }}" for u, p in direct_users.items()
    )
    names = ", ".join(json.dumps(u) for u in direct_users)
    return (
        "authorization {\n"
        f"  timeout: {timeout_s:g}\n"
        f"  users: [ {users} ]\n"
        "  auth_callout {\n"
        f"    issuer: {json.dumps(issuer_public_key)}\n"
        f"    auth_users: [ {names} ]\n"
        "  }\n"
        "}\n"
    )

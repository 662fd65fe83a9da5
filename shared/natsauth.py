"""NATS credentials and TLS settings, from flags or the environment, for every service.

Every service connects with the settings of `process_auth()`: the `FLEETPULSE_NATS_*` environment
variables, overridden by the `--nats-*` flags when the CLI was given any (`set_process_auth`). One
process-wide setting, not a field threaded through each service's config, because every
connection a process opens (a service's own, a handle's, a tool's) acts for the same role.

Child processes never inherit it by accident: the node agent hands its replicas their own role's
settings (`FLEETPULSE_REPLICA_NATS_*`, see `to_env` and `services/agent`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path

from shared.errors import ConfigError, UsageError
from shared.passwords import checked_password, read_password

ENV_PREFIX = "FLEETPULSE_NATS_"
REPLICA_ENV_PREFIX = "FLEETPULSE_REPLICA_NATS_"
SECRET_FIELDS = frozenset({"password", "token"})
FILE_FIELDS = ("creds", "token_file", "password_file", "tls_ca", "tls_cert", "tls_key")


@dataclass(frozen=True, slots=True)
class NatsAuth:
    """How to authenticate to NATS: user/password, a token, or a creds file (JWT + nkey); and
    optionally a CA to verify the server, and a client certificate for mutual TLS."""

    user: str | None = None
    password: str | None = None
    token: str | None = None
    creds: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    token_file: str | None = None
    """A token read from this file at every (re)connect, so whoever writes the file can renew
    it: a replica's credential for the auth callout (shared.replicacred)."""
    inbox_prefix: str | None = None
    """Where this connection's inboxes live (default `_INBOX`): a replica under the auth
    callout may subscribe only to its own."""
    password_file: str | None = None
    """The password read from this file instead of `password`: compose hands each service the
    secret its first start made (docs/operations.md, "Secrets"), never a value in .env."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, prefix: str = ENV_PREFIX) -> NatsAuth:
        env = os.environ if env is None else env
        return cls(**{f.name: env.get(prefix + f.name.upper()) or None for f in fields(cls)})

    def overridden(self, **values: str | None) -> NatsAuth:
        """These settings with every given (not None) value replaced."""
        return replace(self, **{k: v for k, v in values.items() if v is not None})

    @property
    def empty(self) -> bool:
        return all(getattr(self, f.name) is None for f in fields(self))

    @property
    def has_identity(self) -> bool:
        return bool(self.user or self.token or self.creds or self.token_file)

    def validate(self) -> NatsAuth:
        """Raise a UsageError naming what is wrong; return self."""
        methods = [
            name
            for name, present in (
                ("user/password", self.user is not None),
                ("token", self.token is not None),
                ("token file", self.token_file is not None),
                ("creds file", self.creds is not None),
            )
            if present
        ]
        if len(methods) > 1:
            raise UsageError(f"NATS credentials: give one of {' or '.join(methods)}, not several")
        has_password = self.password is not None or self.password_file is not None
        if self.password is not None and self.password_file is not None:
            raise UsageError("NATS credentials: give a password or a password file, not both")
        if self.user is not None and not has_password:
            raise UsageError(f"NATS credentials: user {self.user!r} has no password")
        if has_password and self.user is None:
            raise UsageError("NATS credentials: a password needs a user")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise UsageError("NATS TLS: a client certificate and its key go together")
        for name in FILE_FIELDS:
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                what = name.replace("_", " ").removesuffix(" file")
                raise UsageError(f"NATS {what} file not found: {path}")
        if has_password:
            try:
                self.secret_password()
            except ConfigError as exc:
                raise UsageError(f"NATS credentials: {exc}") from exc
        return self

    def secret_password(self) -> str | None:
        """The password to send, from the file when one is given; a ConfigError naming its
        source when it is empty or a placeholder (shared.passwords)."""
        if self.password_file is not None:
            return read_password(Path(self.password_file), ENV_PREFIX + "PASSWORD_FILE")
        if self.password is None:
            return None
        return checked_password(self.password, ENV_PREFIX + "PASSWORD (or --nats-password)")

    def to_env(self, prefix: str = ENV_PREFIX) -> dict[str, str]:
        return {
            prefix + f.name.upper(): value
            for f in fields(self)
            if (value := getattr(self, f.name)) is not None
        }

    def describe(self) -> str:
        """For logs and errors: which identity and TLS, never a secret."""
        who = (
            f"user {self.user!r}"
            if self.user
            else "a token"
            if self.token
            else f"creds {self.creds}"
            if self.creds
            else f"the token in {self.token_file}"
            if self.token_file
            else "no credentials"
        )
        tls = ", TLS client certificate" if self.tls_cert else ", TLS" if self.tls_ca else ""
        return who + tls


def token_source(auth: NatsAuth) -> str | Callable[[], str] | None:
    """What nats-py sends as the token: the token, or a reader of the token file (called at
    each connect and reconnect; a file gone missing sends an empty token, which is refused)."""
    if auth.token_file is None:
        return auth.token
    path = Path(auth.token_file)

    def read() -> str:
        try:
            return path.read_text(encoding="ascii").strip()
        except OSError:
            return ""

    return read


def scrubbed_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` without any NATS identity of ours (theirs is added back explicitly)."""
    return {k: v for k, v in env.items() if not k.startswith((ENV_PREFIX, REPLICA_ENV_PREFIX))}


_process_auth: NatsAuth | None = None


def set_process_auth(auth: NatsAuth) -> None:
    """What `process_auth()` returns from now on (the CLI calls this after parsing flags)."""
    global _process_auth
    _process_auth = auth.validate()


def process_auth() -> NatsAuth:
    return _process_auth if _process_auth is not None else NatsAuth.from_env()

"""AuthConfig: one frozen config for the auth callout, built once from flags and env.

Each setting is declared once here (flag, environment variable, default); the role passwords
are the `FP_{ROLE}_PASSWORD` variables that compose/nats/accounts.conf reads too, or one file
per role in `--role-passwords-dir` (what `fleetpulse auth-init` makes on first start). Either is
refused at start when empty or a placeholder (shared.passwords).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from shared import settings
from shared.errors import ConfigError
from shared.metrics_catalog import add_metrics_port_argument, metrics_port
from shared.natsjwt import (
    PREFIX_ACCOUNT,
    PREFIX_USER,
    KeyPair,
    TokenError,
    decode_public,
    read_seed,
)
from shared.passwords import checked_password, read_password

from .callout import GLOBAL_ACCOUNT
from .core import PASSWORD_ROLES, AuthPolicy

ISSUER_SEED_ENV = settings.AUTH_ISSUER_SEED.env
TRUSTED_KEYS_ENV = "FLEETPULSE_AUTH_REPLICA_KEYS"


def role_password_env(role: str) -> str:
    return f"FP_{role.upper()}_PASSWORD"


@dataclass(frozen=True, slots=True)
class AuthConfig:
    nats_url: str
    issuer: KeyPair = field(repr=False)
    policy: AuthPolicy
    account: str = GLOBAL_ACCOUNT
    metrics_port: int = settings.METRICS_PORT.default

    def __post_init__(self) -> None:
        if self.issuer.prefix != PREFIX_ACCOUNT:
            raise ConfigError("the issuer must be an account key (seed SA...)", field="issuer")
        if not self.policy.trusted_replica_keys and not self.policy.role_passwords:
            raise ConfigError(
                "nobody could log in: give replica keys or role passwords", field="policy"
            )


def parse_keys(text: str, source: str) -> frozenset[str]:
    keys = frozenset(k.strip() for k in text.replace(",", " ").split() if k.strip())
    for key in keys:
        try:
            decode_public(key, PREFIX_USER)
        except TokenError as exc:
            raise ConfigError(
                f"{key[:12]}... is not a user public key (U...)", field=source
            ) from exc
    return keys


def role_passwords(env: Mapping[str, str], directory: str | None = None) -> dict[str, str]:
    """Role -> password: the file `directory/ROLE` where it exists, else `FP_{ROLE}_PASSWORD`
    where set; a ConfigError for an empty or placeholder one."""
    found: dict[str, str] = {}
    for role in PASSWORD_ROLES:
        path = Path(directory) / role if directory else None
        if path is not None and path.exists():
            found[role] = read_password(path, "--role-passwords-dir")
        elif (variable := role_password_env(role)) in env:
            found[role] = checked_password(env[variable], variable)
    return found


def add_auth_arguments(p: argparse.ArgumentParser) -> None:
    settings.AUTH_ISSUER_SEED.add_flag(p)
    p.add_argument(
        "--replica-key",
        action="append",
        default=[],
        metavar="PUBLIC_KEY",
        help=f"an agent replica key to trust (U...; repeatable, for rotation; also "
        f"${TRUSTED_KEYS_ENV}, comma-separated)",
    )
    settings.AUTH_REPLICA_KEYS_FILE.add_flag(p)
    settings.AUTH_ROLE_PASSWORDS_DIR.add_flag(p)
    settings.AUTH_ACCOUNT.add_flag(p)
    add_metrics_port_argument(p)


def config_from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> AuthConfig:
    env = os.environ if env is None else env
    issuer_seed = settings.AUTH_ISSUER_SEED.resolve(args.issuer_seed, env)
    keys_file = settings.AUTH_REPLICA_KEYS_FILE.resolve(args.replica_keys_file, env)
    passwords_dir = settings.AUTH_ROLE_PASSWORDS_DIR.resolve(args.role_passwords_dir, env)
    if not issuer_seed:
        raise ConfigError(f"give --issuer-seed FILE (or ${ISSUER_SEED_ENV})", field="issuer")
    listed = [env.get(TRUSTED_KEYS_ENV, ""), *args.replica_key]
    keys = parse_keys(" ".join(listed), "--replica-key")
    if keys_file:
        try:
            text = Path(keys_file).read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"cannot read {keys_file}: {exc}", field="--replica-keys-file"
            ) from exc
        keys |= parse_keys(text, "--replica-keys-file")
    return AuthConfig(
        nats_url=args.nats,
        issuer=read_seed(issuer_seed, "--issuer-seed"),
        policy=AuthPolicy(
            trusted_replica_keys=keys, role_passwords=role_passwords(env, passwords_dir)
        ),
        account=settings.AUTH_ACCOUNT.resolve(args.account, env) or GLOBAL_ACCOUNT,
        metrics_port=metrics_port(args, env),
    )

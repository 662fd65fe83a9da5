"""`fleetpulse auth-key issuer|replica FILE`: make an nkey seed file and print its public key.
`fleetpulse auth-init`: make whatever keys and passwords are missing, and the files the servers
and the auth services read (what compose runs before the NATS nodes start).
`fleetpulse auth-credentials ROLE`: print a role's login as shell exports (the operator's one step
to use the `fleetpulse` CLI against compose).

The issuer (an account key, `A...`) signs the user JWTs: the server config's `auth_callout
{ issuer }` names its public key, and only the auth service reads the seed. A replica key (a user
key, `U...`) is an agent's: it signs its replicas' credentials, and the auth service trusts its
public key (`--replica-key`). docs/operations.md says how to rotate and revoke them.

Passwords (docs/operations.md, "Secrets"): each role's is made at random on first start and kept
(`--role-passwords-dir`, read by the auth services only), unless `FP_{ROLE}_PASSWORD` gives one
of the operator's own, which is checked (no placeholder, not empty). A role's services get a copy
of their own password only (`--role-copy ROLE=FILE`). The auth service's own login is checked by
the NATS servers themselves: they get a bcrypt hash of it (`auth-user.conf` in the public
directory), never the password.
"""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Mapping
from pathlib import Path

from shared import settings
from shared.errors import ConfigError
from shared.natsjwt import PREFIX_ACCOUNT, PREFIX_USER, KeyPair, read_seed
from shared.passwords import checked_password, new_password, read_password, write_secret

from .config import role_password_env
from .core import PASSWORD_ROLES

KINDS = {"issuer": PREFIX_ACCOUNT, "replica": PREFIX_USER}
ISSUER_CONF = "issuer.conf"
"""In the public directory: `issuer: "A..."`, for an `include` inside the server's
`auth_callout` block (compose/nats/callout.conf)."""
REPLICA_KEYS = "replica-keys"
"""In the public directory: the trusted replica public keys, one per line
(`fleetpulse auth --replica-keys-file`)."""
AUTH_USER_CONF = "auth-user.conf"
"""In the public directory: `users: [...]` for the auth service's own login, its password as a
bcrypt hash (compose/nats/callout.conf includes it in the AUTH account)."""
AUTH_USER = "fleetpulse-auth"
AUTH_PASSWORD_ENV = "FP_AUTH_PASSWORD"
BCRYPT_COST = 11
"""nats-server checks the hash at each login of the auth service (a handful per restart)."""


def write_seed(path: Path, key: KeyPair) -> None:
    """A new file readable by its owner only; never overwrites a key."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as out:
        out.write(key.seed + "\n")


def add_keygen_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", choices=sorted(KINDS), help="issuer (account key) or replica (agent)")
    p.add_argument("file", help="where the seed goes (created 0600; an existing file is kept)")


def run_keygen(args: argparse.Namespace) -> int:
    key = KeyPair.generate(KINDS[args.kind])
    write_seed(Path(args.file), key)
    print(key.public_key)
    return 0


def add_init_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--issuer-seed", required=True, metavar="FILE", help="the issuer's seed")
    p.add_argument("--replica-seed", required=True, metavar="FILE", help="the agents' seed")
    p.add_argument(
        "--public-dir",
        required=True,
        metavar="DIR",
        help=f"where {ISSUER_CONF} (for the servers) and {REPLICA_KEYS} (for the auth "
        f"services) are written, and {AUTH_USER_CONF} with --auth-password",
    )
    p.add_argument(
        "--role-passwords-dir",
        metavar="DIR",
        help="one password file per role (DIR/operator, ...): made at random where missing, "
        "or FP_{ROLE}_PASSWORD when set (empty counts as unset); kept across restarts",
    )
    p.add_argument(
        "--role-copy",
        action="append",
        default=[],
        nargs=2,
        metavar=("ROLE", "FILE"),
        help="write ROLE's password (from --role-passwords-dir) to FILE too, for that role's "
        "services only (repeatable)",
    )
    p.add_argument(
        "--auth-password",
        metavar="FILE",
        help=f"the auth service's own password (made where missing, or ${AUTH_PASSWORD_ENV}); "
        f"its bcrypt hash goes to PUBLIC_DIR/{AUTH_USER_CONF} for the servers",
    )
    p.add_argument(
        "--shared-secret",
        action="append",
        default=[],
        metavar="FILE",
        help="a random secret made where missing, readable by any user of the container that "
        "mounts it (Grafana's admin password: Grafana runs under its own uid)",
    )


def ensure_seed(path: Path, kind: str) -> tuple[KeyPair, bool]:
    """The key in `path`, made first if the file does not exist (True: made now)."""
    if path.exists():
        key = read_seed(str(path), kind)
        if key.prefix != KINDS[kind]:
            raise ConfigError(f"{path} holds no {kind} key", field=kind)
        return key, False
    path.parent.mkdir(parents=True, exist_ok=True)
    key = KeyPair.generate(KINDS[kind])
    write_seed(path, key)
    return key, True


def _write_public(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="ascii")
    tmp.replace(path)  # a server starting meanwhile reads the old file or the new, never half


def ensure_password(path: Path, given: str | None, source: str) -> tuple[str, str]:
    """The password kept in `path`: `given` (checked) when set, else the file's, else a new
    random one. Returns it and what happened (made, kept, set)."""
    if given:
        password = checked_password(given, source)
        if not path.exists() or read_password(path, source) != password:
            write_secret(path, password + "\n")
            return password, "set from " + source
        return password, "kept"
    if path.exists():
        return read_password(path, str(path)), "kept"
    password = new_password()
    write_secret(path, password + "\n")
    return password, "made"


def auth_user_conf(password: str) -> str:
    """The server's `users` entry for the auth service, with a bcrypt hash of its password."""
    import bcrypt  # only here: the servers want the hash, nothing else hashes

    digest = bcrypt.hashpw(password.encode(), bcrypt.gensalt(BCRYPT_COST)).decode("ascii")
    return f'users: [ {{ user: {AUTH_USER}, password: "{digest}" }} ]\n'


def _given(env: Mapping[str, str], variable: str) -> str | None:
    return env.get(variable) or None  # compose passes an unset variable as ""


def init_passwords(args: argparse.Namespace, env: Mapping[str, str]) -> list[str]:
    """Every password auth-init was asked for; one line per password for the log (no secret)."""
    for variable in (*map(role_password_env, PASSWORD_ROLES), AUTH_PASSWORD_ENV):
        if given := _given(env, variable):
            checked_password(given, variable)  # all refused before any file is written
    lines: list[str] = []
    passwords: dict[str, str] = {}
    if args.role_passwords_dir:
        folder = Path(args.role_passwords_dir)
        for role in PASSWORD_ROLES:
            variable = role_password_env(role)
            passwords[role], how = ensure_password(folder / role, _given(env, variable), variable)
            lines.append(f"role {role}: password {how}")
    for role, file in args.role_copy:
        if role not in passwords:
            raise ConfigError(
                f"{role!r}: give ROLE FILE for a role of {sorted(passwords) or 'none'} "
                "(and --role-passwords-dir)",
                field="--role-copy",
            )
        write_secret(Path(file), passwords[role] + "\n")
        lines.append(f"role {role}: copied to {file}")
    if args.auth_password:
        own, how = ensure_password(
            Path(args.auth_password), _given(env, AUTH_PASSWORD_ENV), AUTH_PASSWORD_ENV
        )
        public = Path(args.public_dir)
        public.mkdir(parents=True, exist_ok=True)
        _write_public(public / AUTH_USER_CONF, auth_user_conf(own))
        lines.append(f"{AUTH_USER}: password {how}, its hash in {AUTH_USER_CONF}")
    for file in args.shared_secret:
        path = Path(file)
        made = not path.exists()
        if made:
            write_secret(path, new_password() + "\n", mode=0o644)
        lines.append(f"secret {file}: {'made' if made else 'kept'}")
    return lines


def run_init(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    """Idempotent: existing seeds and passwords are kept (never overwritten unless the operator
    gives a password of their own), the public files rewritten."""
    lines = init_passwords(args, os.environ if env is None else env)  # refuses before writing
    issuer, made_issuer = ensure_seed(Path(args.issuer_seed), "issuer")
    replica, made_replica = ensure_seed(Path(args.replica_seed), "replica")
    public = Path(args.public_dir)
    public.mkdir(parents=True, exist_ok=True)
    _write_public(public / ISSUER_CONF, f'issuer: "{issuer.public_key}"\n')
    keys = public / REPLICA_KEYS
    trusted = keys.read_text(encoding="ascii").split() if keys.exists() else []
    if replica.public_key not in trusted:  # keys added by hand (rotation) stay
        trusted.append(replica.public_key)
    _write_public(keys, "".join(f"{k}\n" for k in trusted))
    for what, key, made in (("issuer", issuer, made_issuer), ("replica", replica, made_replica)):
        print(f"{what} key {key.public_key} ({'made' if made else 'kept'})")
    print(f"wrote {public / ISSUER_CONF} and {keys} ({len(trusted)} trusted replica key(s))")
    for line in lines:
        print(line)
    return 0


def add_credentials_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("role", choices=PASSWORD_ROLES, help="whose login (operator to deploy)")
    p.add_argument(
        "--role-passwords-dir",
        required=True,
        metavar="DIR",
        help="where auth-init keeps the role passwords",
    )
    settings.AUTH_PUBLISHED_NATS_URL.add_flag(p)


def run_credentials(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    """Shell exports for `eval`: the role's user and password, and the URL when known
    (--nats-url, else $FP_PUBLISHED_NATS_URL, read now)."""
    url = settings.AUTH_PUBLISHED_NATS_URL.resolve(
        args.nats_url, os.environ if env is None else env
    )
    password = read_password(Path(args.role_passwords_dir) / args.role, "--role-passwords-dir")
    exports = {"FLEETPULSE_NATS_USER": args.role, "FLEETPULSE_NATS_PASSWORD": password}
    if url:
        exports["FLEETPULSE_NATS_URL"] = url
    for name, value in exports.items():
        print(f"export {name}={shlex.quote(value)}")
    return 0

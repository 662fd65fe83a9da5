"""`fleetpulse auth-key issuer|replica FILE`: make an nkey seed file and print its public key.
`fleetpulse auth-init`: make whatever keys are missing, and the public files the servers and the
auth services read (what compose runs before the NATS nodes start).

The issuer (an account key, `A...`) signs the user JWTs: the server config's `auth_callout
{ issuer }` names its public key, and only the auth service reads the seed. A replica key (a user
key, `U...`) is an agent's: it signs its replicas' credentials, and the auth service trusts its
public key (`--replica-key`). docs/operations.md says how to rotate and revoke them.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from shared.errors import ConfigError
from shared.natsjwt import PREFIX_ACCOUNT, PREFIX_USER, KeyPair, read_seed

KINDS = {"issuer": PREFIX_ACCOUNT, "replica": PREFIX_USER}
ISSUER_CONF = "issuer.conf"
"""In the public directory: `issuer: "A..."`, for an `include` inside the server's
`auth_callout` block (compose/nats/callout.conf)."""
REPLICA_KEYS = "replica-keys"
"""In the public directory: the trusted replica public keys, one per line
(`fleetpulse auth --replica-keys-file`)."""


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
        "services) are written",
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


def run_init(args: argparse.Namespace) -> int:
    """Idempotent: existing seeds are kept (never overwritten), the public files rewritten."""
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
    return 0

"""`fleetpulse auth-key issuer|replica FILE`: make an nkey seed file and print its public key.

The issuer (an account key, `A...`) signs the user JWTs: the server config's `auth_callout
{ issuer }` names its public key, and only the auth service reads the seed. A replica key (a user
key, `U...`) is an agent's: it signs its replicas' credentials, and the auth service trusts its
public key (`--replica-key`). docs/operations.md says how to rotate and revoke them.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from shared.natsjwt import PREFIX_ACCOUNT, PREFIX_USER, KeyPair

KINDS = {"issuer": PREFIX_ACCOUNT, "replica": PREFIX_USER}


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

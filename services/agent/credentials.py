"""The credentials an agent mints for its replicas, when the fleet runs the auth callout.

How it works: with a replica key (an nkey seed, `--replica-key-seed`), `issue` mints a
credential for one replica (shared.replicacred) and writes it to a file of its own in a private
directory (0700; files 0600); the replica gets the file's path and its inbox prefix in its
environment and reads the file at every (re)connect. `renew` (every agent tick) re-mints those
with a third of their window left, so a replica that reconnects late still gets in; `drop`
removes the file once the replica has exited, after which its id is worth nothing.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from pathlib import Path

from shared.kv.targets import ReplicaTarget
from shared.natsauth import NatsAuth
from shared.natsjwt import KeyPair
from shared.replicacred import inbox_prefix, mint, renew_at, write_credential

log = logging.getLogger(__name__)


class ReplicaCredentials:
    def __init__(self, key: KeyPair, ttl_s: float) -> None:
        self._key = key
        self._ttl_s = ttl_s
        self.dir = Path(tempfile.mkdtemp(prefix="fleetpulse-creds-"))  # mode 0700
        self._issued: dict[str, tuple[ReplicaTarget, float]] = {}
        self._next_due = float("inf")
        """The earliest renewal due: most ticks end at one comparison."""

    def _write(self, target: ReplicaTarget, now: float) -> Path:
        token = mint(
            self._key, target.app, target.deployment, target.replica_id, now=now, ttl_s=self._ttl_s
        )
        path = self.dir / f"{target.replica_id}.cred"
        write_credential(path, token)
        self._issued[target.replica_id] = (target, now)
        self._next_due = min(self._next_due, renew_at(now, self._ttl_s))
        return path

    def issue(self, target: ReplicaTarget, now: float) -> dict[str, str]:
        """The replica's environment additions: its credential file and its inbox prefix."""
        path = self._write(target, now)
        return NatsAuth(token_file=str(path), inbox_prefix=inbox_prefix(target.replica_id)).to_env()

    def renew(self, now: float) -> None:
        if now < self._next_due:
            return
        self._next_due = float("inf")
        for target, issued_at in list(self._issued.values()):
            if now < renew_at(issued_at, self._ttl_s):
                self._next_due = min(self._next_due, renew_at(issued_at, self._ttl_s))
                continue
            try:
                self._write(target, now)
            except OSError as exc:  # it keeps its current one; tried again next tick
                self._next_due = now
                log.warning("could not renew replica %s's credential: %s", target.replica_id, exc)

    def drop(self, replica_id: str) -> None:
        if self._issued.pop(replica_id, None) is not None:
            with contextlib.suppress(OSError):
                (self.dir / f"{replica_id}.cred").unlink()

    def close(self) -> None:
        self._issued.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

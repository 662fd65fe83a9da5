"""`fleetpulse deploy`'s memory of the packages it made: an unchanged directory is not zipped again.

How it works: zipping and hashing a working_dir to learn its content address costs seconds for
tens of MB (deflate and sha256 of every byte), on every deploy, even when nothing changed. So the
index keeps, per directory package, a fingerprint of what `stat` says of each file the package
would hold (relative path, size, mtime and ctime in ns, inode, mode: what git's index trusts)
with the package's prefix, and the (sha256, size) that zip had. A deploy walks the tree (honouring
`excludes`), stats each file and, when the fingerprint is known and the object store still has
that package, uses it without zipping. Any write to a file changes its ctime (which no tool can
set back), a rename its inode or path, so a changed tree misses and is zipped as before.
Racy writes (a file written within the timestamp granularity of the fingerprint) are handled as
git does: a fingerprint with a file modified less than RACY_S before it was taken is not kept.
The file is JSON, written atomically, bounded to MAX_ENTRIES (oldest dropped); an unreadable
one is an empty index (a miss costs only the zip).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

from shared import packages

log = logging.getLogger(__name__)

FORMAT = 1
MAX_ENTRIES = 256
RACY_S = 2.0


def default_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fleetpulse" / "deploy-packages.json"


def fingerprint(root: Path, excludes: Sequence[str], prefix: str) -> tuple[str, bool]:
    """(the fingerprint of the package `root` would make, whether it may be kept: no file was
    modified within RACY_S of now); ("", False) when `root` is not a directory (build_zip
    says why)."""
    if not root.is_dir():
        return "", False
    h = hashlib.sha256(json.dumps([FORMAT, str(root.resolve()), prefix, list(excludes)]).encode())
    newest = 0
    for rel, path in sorted(packages.walk(root, excludes)):
        st = path.stat()
        newest = max(newest, st.st_mtime_ns, st.st_ctime_ns)
        h.update(
            f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}\0"
            f"{st.st_mode}\n".encode()
        )
    return h.hexdigest(), time.time_ns() - newest >= RACY_S * 1e9


class PackageIndex:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries: dict[str, list[object]] = {}
        try:
            doc = json.loads(path.read_text())
            if isinstance(doc, dict) and doc.get("format") == FORMAT:
                self._entries = {k: v for k, v in doc.get("entries", {}).items() if _valid(v)}
        except (OSError, ValueError):
            pass  # no index yet, or a damaged one: every directory is zipped

    def get(self, fp: str) -> tuple[str, int] | None:
        v = self._entries.get(fp)
        return None if v is None else (str(v[0]), int(v[1]))  # type: ignore[call-overload]

    def put(self, fp: str, sha256: str, size: int) -> None:
        self._entries.pop(fp, None)
        self._entries[fp] = [sha256, size]
        while len(self._entries) > MAX_ENTRIES:
            del self._entries[next(iter(self._entries))]
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({"format": FORMAT, "entries": self._entries}))
            os.replace(tmp, self.path)
        except OSError as exc:  # an index is an optimisation: never a failed deploy
            log.warning("could not write the package index %s: %s", self.path, exc)
            tmp.unlink(missing_ok=True)


def _valid(v: object) -> bool:
    return (
        isinstance(v, list)
        and len(v) == 2
        and isinstance(v[0], str)
        and len(v[0]) == 64
        and isinstance(v[1], int)
    )

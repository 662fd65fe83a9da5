"""The agent's package cache: code packages fetched once, verified, unpacked by content address.

How it works: `root/<sha256>/` holds one unpacked package. `ensure(ref)` returns it at once when
it is there (and marks it used); otherwise one fetch per package runs however many replicas ask at
once (the others await the same task): the zip comes from the object store fp_packages (or, for a
URL package, from that URL with a timeout), is refused unless its size and sha256 are the ones the
app declared, and is unpacked (shared/packages.py: zip-slip and zip bombs refused, atomic rename
into place). So a directory named by a hash is always complete, whatever happened mid-way; what a
killed agent left half-done (`.partial-*`) is removed when the cache opens. An unchanged package
is never fetched again; a changed one has another name.

The cache is bounded: after each fetch, the least recently used packages no live replica uses are
removed until the total is under `max_bytes` (a package in use is never removed, so the bound can
be exceeded while the replicas using it run).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from shared import packages
from shared.packagestore import PackageStore

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 4 * 1024**3
"""The cache's bound (unpacked bytes) unless the agent is given another."""


class PackageCache:
    def __init__(
        self,
        root: Path,
        store: Callable[[], PackageStore] | None,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        url_timeout_s: float = packages.URL_TIMEOUT_S,
    ) -> None:
        self.root = root
        self._store = store
        self.max_bytes = max_bytes
        self.url_timeout_s = url_timeout_s
        self._inflight: dict[str, asyncio.Task[Path]] = {}
        self.sizes: dict[str, int] = {}
        self.fetches = 0
        self.fetched_bytes = 0
        if not root.is_dir():
            return  # made at the first fetch: an agent that ships no code writes nothing
        removed = packages.clean_partial(root)
        if removed:
            log.info("package cache %s: removed %d partial download(s) or unpack(s)", root, removed)
        for entry in root.iterdir():
            if entry.is_dir() and packages.SHA256_RE.fullmatch(entry.name):
                self.sizes[entry.name] = packages.dir_size(entry)

    def path(self, sha256: str) -> Path:
        return self.root / sha256

    async def ensure(self, ref: Mapping[str, Any], in_use: set[str] | None = None) -> Path:
        """The unpacked package of `ref` ({sha256, size[, url]}); PackageError (or the store's
        BusError) when it cannot be had."""
        sha = str(ref["sha256"])
        dest = self.path(sha)
        if sha in self.sizes and dest.is_dir():
            os.utime(dest)  # recently used: the last to be evicted
            return dest
        task = self._inflight.get(sha)
        if task is None:
            task = asyncio.create_task(self._fetch(ref, in_use or set()), name=f"fetch-{sha[:12]}")
            self._inflight[sha] = task
            task.add_done_callback(lambda _: self._inflight.pop(sha, None))
        return await asyncio.shield(task)

    async def _fetch(self, ref: Mapping[str, Any], in_use: set[str]) -> Path:
        sha, size = str(ref["sha256"]), int(ref["size"])
        await asyncio.to_thread(self.root.mkdir, parents=True, exist_ok=True)
        tmp = self.root / f"{packages.PARTIAL_PREFIX}{sha}-{os.getpid()}.zip"
        try:
            url = ref.get("url")
            if url:
                await asyncio.to_thread(
                    packages.download, str(url), tmp, timeout=self.url_timeout_s, limit=size + 1
                )
            else:
                if self._store is None:
                    raise packages.PackageError("this agent has no package store")
                await self._store().get_to_file(sha, tmp)
            await asyncio.to_thread(packages.verify, tmp, sha, size)
            dest = self.path(sha)
            if not dest.is_dir():
                await asyncio.to_thread(
                    packages.unpack, tmp, dest, max_bytes=packages.MAX_UNPACKED_BYTES
                )
        finally:
            tmp.unlink(missing_ok=True)
        self.fetches += 1
        self.fetched_bytes += size
        self.sizes[sha] = await asyncio.to_thread(packages.dir_size, dest)
        log.info("package %s fetched (%d bytes) into %s", sha[:12], size, dest)
        await asyncio.to_thread(self.evict, in_use | {sha})
        return dest

    async def close(self) -> None:
        """Cancel the fetches in progress (the agent is stopping): what they wrote is removed."""
        tasks = list(self._inflight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def evict(self, in_use: set[str]) -> list[str]:
        """Remove least recently used packages not in `in_use` until under the bound."""
        total = sum(self.sizes.values())
        if total <= self.max_bytes:
            return []
        candidates = sorted(
            (s for s in self.sizes if s not in in_use and s not in self._inflight),
            key=lambda s: _mtime(self.path(s)),
        )
        removed = []
        for sha in candidates:
            if total <= self.max_bytes:
                break
            shutil.rmtree(self.path(sha), ignore_errors=True)
            total -= self.sizes.pop(sha)
            removed.append(sha)
        if removed:
            log.info(
                "package cache over %d bytes: removed %d package(s)", self.max_bytes, len(removed)
            )
        return removed


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0

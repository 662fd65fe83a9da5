"""`fleetpulse deploy`'s packaging step: local code into the object store, URLs pinned by hash.

How it works: the checked apps carry local references in their deployments' `runtime_env`
(shared/runtimeenv.py): `{path, excludes}` for a directory, `{url}` for a zip over https.
`resolve_apps` turns each into a content address before anything is written to fp_apps:
- a directory is zipped (shared/packages.py: deterministic, `excludes` honoured, the size limit
  checked with the biggest files named), hashed, and uploaded to `fp_packages` under its sha256
  unless an object of that name is there already (an unchanged working_dir costs no upload);
- a URL is downloaded once here (with a timeout), so the app is pinned to the bytes deploy saw:
  the agents fetch the same URL and refuse anything with another hash or size.
One directory used by several deployments (the app-level working_dir) is packaged once. With a
PackageIndex (pkgindex.py; the CLI passes one), a directory unchanged since a deploy that the
store still has is not zipped again: its files' `stat` tells.
`collect_garbage` marks packages no app refers to and deletes those marked longer than the
grace period ago (deploy and delete run it; a rollback within the grace re-uses the package).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared import packages, runtimeenv
from shared.appconfig import AppConfig
from shared.errors import BusError, ConfigError
from shared.packagestore import NatsPackageStore, NoSuchPackage, PackageStore

from .pkgindex import PackageIndex, fingerprint

log = logging.getLogger(__name__)

MAX_PACKAGE_BYTES = packages.MAX_PACKAGE_BYTES
GC_GRACE_S = 3600.0
"""An unreferenced package stays this long (a rollback within it uploads nothing)."""


@dataclass(slots=True)
class Uploads:
    """What one deploy did to the object store (printed, and the benchmark's numbers)."""

    packaged: int = 0
    uploaded: int = 0
    uploaded_bytes: int = 0
    reused: int = 0
    unzipped: int = 0
    """Of those reused, how many were known unchanged by the index (not zipped again)."""
    fetched_urls: int = 0
    names: list[str] = field(default_factory=list)


class Packager:
    def __init__(
        self,
        store: PackageStore,
        *,
        limit: int = MAX_PACKAGE_BYTES,
        workdir: Path | None = None,
        index: PackageIndex | None = None,
    ) -> None:
        self.store = store
        self.index = index
        self.limit = limit
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="fleetpulse-pkg-"))
        self.done: dict[str, dict[str, Any]] = {}
        self.stats = Uploads()

    async def ref(self, where: str, local: Mapping[str, Any], prefix: str) -> dict[str, Any]:
        if "sha256" in local:
            return dict(local)
        key = repr(sorted((k, str(v)) for k, v in local.items())) + prefix
        if key in self.done:
            return self.done[key]
        if "url" in local:
            out = await self._url(where, str(local["url"]))
        else:
            out = await self._dir(where, Path(local["path"]), local.get("excludes", ()), prefix)
        self.done[key] = out
        return out

    async def _dir(
        self, where: str, root: Path, excludes: Iterable[str], prefix: str
    ) -> dict[str, Any]:
        fp, keep = "", False
        if self.index is not None:
            fp, keep = await asyncio.to_thread(fingerprint, root, list(excludes), prefix)
            known = self.index.get(fp) if fp else None
            if known is not None and known[1] <= self.limit and await self.store.has(known[0]):
                sha, size = known
                self.stats.packaged += 1
                self.stats.reused += 1
                self.stats.unzipped += 1
                await self.store.mark(sha, None)  # referenced again: not garbage
                self.stats.names.append(sha)
                return {"sha256": sha, "size": size}
        zip_path = self.workdir / f"{len(self.done)}.zip"
        try:
            sha, size = await asyncio.to_thread(
                packages.build_zip, root, zip_path, excludes=list(excludes), limit=self.limit,
                prefix=prefix,
            )  # fmt: skip
        except packages.PackageError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if self.index is not None and fp and keep:
            self.index.put(fp, sha, size)
        self.stats.packaged += 1
        if await self.store.has(sha):
            self.stats.reused += 1
        else:
            await self.store.put_file(sha, zip_path)
            self.stats.uploaded += 1
            self.stats.uploaded_bytes += size
        await self.store.mark(sha, None)  # referenced again: not garbage
        self.stats.names.append(sha)
        zip_path.unlink(missing_ok=True)
        return {"sha256": sha, "size": size}

    async def _url(self, where: str, url: str) -> dict[str, Any]:
        path = self.workdir / f"url-{len(self.done)}.zip"
        try:
            await asyncio.to_thread(packages.download, url, path, limit=self.limit)
            sha = await asyncio.to_thread(packages.sha256_file, path)
        except (OSError, packages.PackageError) as exc:
            raise ConfigError(f"{where}: cannot fetch {url}: {exc}") from None
        self.stats.fetched_urls += 1
        return {"url": url, "sha256": sha, "size": path.stat().st_size}


async def resolve_app(app: AppConfig, packager: Packager) -> AppConfig:
    """`app` with every local package reference replaced by its content address."""
    deployments = []
    for d in app.deployments:
        rt = d.runtime_env
        if not runtimeenv.refs(rt) or runtimeenv.resolved(rt):
            deployments.append(d)
            continue
        where = f"application {app.name!r}, deployment {d.name!r}, runtime_env"
        new: dict[str, Any] = dict(rt)
        if "working_dir" in rt:
            new["working_dir"] = await packager.ref(f"{where}.working_dir", rt["working_dir"], "")
        if "py_modules" in rt:
            new["py_modules"] = [
                await packager.ref(f"{where}.py_modules[{i}]", m, _module_prefix(m))
                for i, m in enumerate(rt["py_modules"])
            ]
        deployments.append(dataclasses.replace(d, runtime_env=new))
    return dataclasses.replace(app, deployments=tuple(deployments))


def _module_prefix(ref: Mapping[str, Any]) -> str:
    """A py_modules directory keeps its name inside the package (`import <name>` works with the
    package's root on sys.path), as in Ray."""
    return f"{Path(ref['path']).name}/" if "path" in ref else ""


def unresolved(apps: Iterable[AppConfig]) -> bool:
    return not all(runtimeenv.resolved(d.runtime_env) for a in apps for d in a.deployments)


def store_of(bus: object, *, create: bool) -> NatsPackageStore:
    """The package store on `bus`'s connection (a NatsBus)."""
    js = getattr(bus, "js", None)
    if js is None:
        raise ConfigError("code packages need a NATS connection with JetStream")
    return NatsPackageStore(js, create=create, replicas=getattr(bus, "kv_replicas", 1))


async def collect_after_change(bus: object, apps: Iterable[AppConfig], now: float) -> None:
    """Garbage collection after deploy or delete (`apps`: every app deployed now); a store
    that does not exist (no code was ever shipped) or cannot be read is left alone."""
    try:
        await collect_garbage(store_of(bus, create=False), referenced(apps), now)
    except (NoSuchPackage, BusError, ConfigError) as exc:
        log.debug("package garbage collection skipped: %s", exc)
    except Exception as exc:  # nats-py's own errors: GC must never fail a deploy
        log.warning("package garbage collection failed: %s", exc)


async def resolve_apps(apps: list[AppConfig], packager: Packager) -> list[AppConfig]:
    return [await resolve_app(a, packager) for a in apps]


def referenced(apps: Iterable[AppConfig]) -> set[str]:
    return {
        str(r["sha256"])
        for a in apps
        for d in a.deployments
        for r in runtimeenv.refs(d.runtime_env)
        if "sha256" in r and "url" not in r
    }


@dataclass(frozen=True, slots=True)
class Collected:
    marked: tuple[str, ...]
    deleted: tuple[str, ...]


async def collect_garbage(
    store: PackageStore, in_use: set[str], now: float, grace_s: float = GC_GRACE_S
) -> Collected:
    """Mark packages no app refers to; delete those marked more than `grace_s` ago."""
    marked, deleted = [], []
    for pkg in await store.list():
        if pkg.name in in_use:
            if pkg.unreferenced_since is not None:
                await store.mark(pkg.name, None)
            continue
        if pkg.unreferenced_since is None:
            await store.mark(pkg.name, now)
            marked.append(pkg.name)
        elif now - pkg.unreferenced_since >= grace_s:
            await store.delete(pkg.name)
            deleted.append(pkg.name)
    if deleted:
        log.info("removed %d package(s) no app used for %g s", len(deleted), grace_s)
    return Collected(tuple(marked), tuple(deleted))


def describe(stats: Uploads) -> str:
    """One line for deploy's output: what went to the object store."""
    parts = [f"{stats.packaged} package(s) built"]
    if stats.uploaded:
        parts.append(f"{stats.uploaded} uploaded ({stats.uploaded_bytes / 1e6:.2f} MB)")
    if stats.reused:
        known = f" ({stats.unzipped} known unchanged: not zipped)" if stats.unzipped else ""
        parts.append(f"{stats.reused} already in the store{known}")
    if stats.fetched_urls:
        parts.append(f"{stats.fetched_urls} URL(s) fetched and pinned by sha256")
    return "code: " + ", ".join(parts)

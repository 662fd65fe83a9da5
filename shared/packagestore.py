"""The packages' object store: JetStream object store `fp_packages`, one object per package.

An object's name is its sha256 (hex), so a name says what it holds and a put of a package that
is there already is skipped (`has`). The operator role writes (`fleetpulse deploy` uploads,
garbage collection deletes); agents only read; replicas and routers have no access at all
(shared/natsroles.py). An object's `description` holds a small JSON document of the store's own
bookkeeping: `unreferenced_since` (unix seconds) once garbage collection saw no app refer to it.
Objects are written from and read into files, never whole into memory.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import nats.js.errors
from nats.js import api

from shared.errors import BusError

BUCKET = "fp_packages"


class NoSuchPackage(BusError):
    """The store has no object of that name (or no store at all)."""


@dataclass(frozen=True, slots=True)
class StoredPackage:
    name: str
    size: int
    unreferenced_since: float | None


class PackageStore(Protocol):
    async def has(self, name: str) -> bool: ...
    async def put_file(self, name: str, path: Path) -> None: ...
    async def get_to_file(self, name: str, path: Path) -> None: ...
    async def list(self) -> list[StoredPackage]: ...
    async def mark(self, name: str, unreferenced_since: float | None) -> None: ...
    async def delete(self, name: str) -> None: ...


class NatsPackageStore:
    """`PackageStore` over a JetStream context (`NatsBus.js`)."""

    def __init__(self, js: Any, *, create: bool, replicas: int = 1) -> None:
        self._js = js
        self._create = create
        self._replicas = replicas
        self._store: Any = None

    async def _obs(self) -> Any:
        if self._store is not None:
            return self._store
        try:
            self._store = await self._js.object_store(BUCKET)
        except nats.js.errors.NotFoundError:
            if not self._create:
                raise NoSuchPackage(
                    f"no object store {BUCKET!r}: nothing was deployed with code"
                ) from None
            try:
                self._store = await self._js.create_object_store(
                    BUCKET, config=api.ObjectStoreConfig(replicas=self._replicas)
                )
            except nats.js.errors.BadRequestError:
                self._store = await self._js.object_store(BUCKET)
        return self._store

    async def has(self, name: str) -> bool:
        obs = await self._obs()
        try:
            await obs.get_info(name)
        except nats.js.errors.ObjectNotFoundError:
            return False
        return True

    async def put_file(self, name: str, path: Path) -> None:
        obs = await self._obs()
        with open(path, "rb") as f:  # noqa: ASYNC230 (nats-py reads it chunk by chunk)
            await obs.put(name, f)

    async def get_to_file(self, name: str, path: Path) -> None:
        obs = await self._obs()
        try:
            with open(path, "wb") as f:  # noqa: ASYNC230 (nats-py writes each chunk)
                await obs.get(name, writeinto=f)
        except nats.js.errors.ObjectNotFoundError:
            raise NoSuchPackage(f"package {name[:12]} is not in the object store") from None

    async def list(self) -> list[StoredPackage]:
        obs = await self._obs()
        try:
            infos = await obs.list()
        except nats.js.errors.NotFoundError:
            return []
        out = []
        for info in infos:
            if info.deleted:
                continue
            out.append(StoredPackage(info.name, info.size or 0, _since(info.description)))
        return out

    async def mark(self, name: str, unreferenced_since: float | None) -> None:
        obs = await self._obs()
        info = await obs.get_info(name)
        doc = {} if unreferenced_since is None else {"unreferenced_since": unreferenced_since}
        meta = api.ObjectMeta(name=name, description=json.dumps(doc), headers=info.headers)
        await obs.update_meta(name, meta)

    async def delete(self, name: str) -> None:
        obs = await self._obs()
        with contextlib.suppress(nats.js.errors.ObjectNotFoundError):
            await obs.delete(name)


def _since(description: str | None) -> float | None:
    try:
        value = json.loads(description or "{}").get("unreferenced_since")
    except (ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, int | float) else None


class MemoryPackageStore:
    """A `PackageStore` in memory (unit tests; what the agent's cache is tested against)."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.marks: dict[str, float] = {}
        self.gets = 0
        self.puts = 0

    async def has(self, name: str) -> bool:
        return name in self.objects

    async def put_file(self, name: str, path: Path) -> None:
        self.puts += 1
        self.objects[name] = path.read_bytes()  # noqa: ASYNC240 (a test fake)

    async def get_to_file(self, name: str, path: Path) -> None:
        self.gets += 1
        if name not in self.objects:
            raise NoSuchPackage(f"package {name[:12]} is not in the object store")
        path.write_bytes(self.objects[name])  # noqa: ASYNC240 (a test fake)

    async def list(self) -> list[StoredPackage]:
        return [StoredPackage(n, len(b), self.marks.get(n)) for n, b in self.objects.items()]

    async def mark(self, name: str, unreferenced_since: float | None) -> None:
        if unreferenced_since is None:
            self.marks.pop(name, None)
        else:
            self.marks[name] = unreferenced_since

    async def delete(self, name: str) -> None:
        self.objects.pop(name, None)
        self.marks.pop(name, None)

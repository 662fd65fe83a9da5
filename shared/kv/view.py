"""A typed view of one bucket: documents in and out instead of bytes, bad values counted.

`DocKV(kv, Member)` reads and writes `Member` documents: `get` returns the decoded document with
its revision (a value that does not decode raises WireError), `put` / `create` / `update`
encode, and `watch` yields `Change`s: decoded documents, deletes, and one `None` once the current
values are delivered. A value that does not decode is counted by reason in `bad` (rate-limited
log) and skipped; the watch goes on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from shared.badinput import BadInput
from shared.bus import KV, KVWatcher
from shared.errors import WireError
from shared.kv import envelope

D = TypeVar("D", bound=envelope.Document)


@dataclass(frozen=True, slots=True)
class Change(Generic[D]):
    key: str
    doc: D | None
    """None: the key was deleted."""
    revision: int


class DocKV(Generic[D]):
    __slots__ = ("bad", "cls", "kv")

    def __init__(self, kv: KV, cls: type[D], bad: BadInput | None = None) -> None:
        self.kv = kv
        self.cls = cls
        self.bad = bad

    async def get(self, key: str) -> tuple[D, int] | None:
        entry = await self.kv.get(key)
        if entry is None:
            return None
        return envelope.decode(entry.value, self.cls), entry.revision

    async def put(self, key: str, doc: D) -> int:
        return await self.kv.put(key, envelope.encode(doc))

    async def create(self, key: str, doc: D) -> int:
        return await self.kv.create(key, envelope.encode(doc))

    async def update(self, key: str, doc: D, last_revision: int) -> int:
        return await self.kv.update(key, envelope.encode(doc), last_revision)

    async def delete(self, key: str, last_revision: int | None = None) -> None:
        await self.kv.delete(key, last_revision)

    async def watch(self, keys: str = ">") -> DocWatch[D]:
        return DocWatch(await self.kv.watch(keys), self.cls, self.bad)

    async def snapshot(self, keys: str | Sequence[str] = ">") -> list[Change[D]]:
        """The current documents under `keys` (one pattern or several; bad values counted and
        left out), in revision order."""
        out: list[Change[D]] = []
        for entry in await self.kv.snapshot([keys] if isinstance(keys, str) else keys):
            try:
                doc = envelope.decode(entry.value, self.cls)
            except WireError as exc:
                if self.bad is not None:
                    self.bad.drop(exc.reason, f"{entry.bucket}/{entry.key}: {exc.detail}")
                continue
            out.append(Change(entry.key, doc, entry.revision))
        return out


class DocWatch(Generic[D]):
    __slots__ = ("_bad", "_cls", "_watcher")

    def __init__(self, watcher: KVWatcher, cls: type[D], bad: BadInput | None) -> None:
        self._watcher = watcher
        self._cls = cls
        self._bad = bad

    def __aiter__(self) -> AsyncIterator[Change[D] | None]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Change[D] | None]:
        async for entry in self._watcher:
            if entry is None:
                yield None
            elif entry.op == "DEL":
                yield Change(entry.key, None, entry.revision)
            else:
                try:
                    doc = envelope.decode(entry.value, self._cls)
                except WireError as exc:
                    if self._bad is not None:
                        self._bad.drop(exc.reason, f"{entry.bucket}/{entry.key}: {exc.detail}")
                    continue
                yield Change(entry.key, doc, entry.revision)

    async def stop(self) -> None:
        await self._watcher.stop()

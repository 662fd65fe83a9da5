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
from shared.bus import KV, KVEntry, KVWatcher
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
        entries = await self.kv.snapshot([keys] if isinstance(keys, str) else keys)
        changes = (_decoded(e, self.cls, self.bad) for e in entries)
        return [c for c in changes if c is not None]


def _decoded(entry: KVEntry, cls: type[D], bad: BadInput | None) -> Change[D] | None:
    """The entry's document, or None (counted in `bad`) when its value does not decode."""
    try:
        doc = envelope.decode(entry.value, cls)
    except WireError as exc:
        if bad is not None:
            bad.drop(exc.reason, f"{entry.bucket}/{entry.key}: {exc.detail}")
        return None
    return Change(entry.key, doc, entry.revision)


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
            elif (change := _decoded(entry, self._cls, self._bad)) is not None:
                yield change

    async def stop(self) -> None:
        await self._watcher.stop()

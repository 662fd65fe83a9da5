"""Revision-checked KV writes carrying the writer's owner epoch.

Every value the controller writes to fp_targets / fp_membership / fp_status carries its
`owner_epoch`. A write is an `update` against the last revision this writer saw; on a conflict the
writer re-reads: a value written by a higher epoch means ownership moved on, and the write is
dropped (and reported), never forced. A lower or equal epoch (our own earlier write, or a previous
incarnation's) is taken over at its revision.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from shared.bus import KV
from shared.errors import KVConflict

log = logging.getLogger(__name__)

EpochOf = Callable[[bytes], int]


def json_epoch(value: bytes) -> int:
    try:
        doc = json.loads(value)
        return int(doc.get("owner_epoch", 0))
    except (ValueError, TypeError, AttributeError):
        return 0


class FencedWriter:
    def __init__(self, kv: KV, owner_epoch: int, epoch_of: EpochOf = json_epoch) -> None:
        self.kv = kv
        self.owner_epoch = owner_epoch
        self.epoch_of = epoch_of
        self._revisions: dict[str, int] = {}
        self.fenced = 0

    async def put(self, key: str, value: bytes, epoch: int | None = None) -> bool:
        """Write unless a newer owner wrote the key. True when written, False when fenced;
        raises `KVConflict` when the revision race kept being lost, and whatever the KV raises.
        `epoch` overrides the writer's own (the group hands out one epoch per partition)."""
        mine = self.owner_epoch if epoch is None else epoch
        for _ in range(3):
            rev = self._revisions.get(key)
            try:
                if rev is None:
                    current = await self.kv.get(key)
                    if current is None:
                        self._revisions[key] = await self.kv.create(key, value)
                        return True
                    if self.epoch_of(current.value) > mine:
                        return self._fenced(key, mine)
                    rev = current.revision
                self._revisions[key] = await self.kv.update(key, value, rev)
                return True
            except KVConflict:
                self._revisions.pop(key, None)
                current = await self.kv.get(key)
                if current is not None and self.epoch_of(current.value) > mine:
                    return self._fenced(key, mine)
        # not fenced, just busy: the caller's retry (kv_writer.py) tries again later
        raise KVConflict(key, self._revisions.get(key), "lost the revision race 3 times")

    async def delete(self, key: str, epoch: int | None = None) -> bool:
        """Delete unless a newer owner wrote the key (False then): revision-checked like `put`,
        also for a key this writer never wrote (one a previous owner left)."""
        mine = self.owner_epoch if epoch is None else epoch
        rev = self._revisions.pop(key, None)
        for _ in range(3):
            if rev is None:
                current = await self.kv.get(key)
                if current is None:
                    return True
                if self.epoch_of(current.value) > mine:
                    return self._fenced(key, mine)
                rev = current.revision
            try:
                await self.kv.delete(key, last_revision=rev)
                return True
            except KVConflict:
                rev = None
        raise KVConflict(key, None, "lost the revision race 3 times")

    def _fenced(self, key: str, epoch: int) -> bool:
        self.fenced += 1
        log.warning("not writing %s: a newer owner (epoch > %d) holds it", key, epoch)
        return False

"""Slot numbers for one deployment's replicas, shared by the metrics store and the health registry.

How it works: every replica the controller knows for a deployment gets a small integer slot, so
per-replica facts live in numpy arrays indexed by slot and a columnar report merges with one fancy
index instead of a Python loop. A removed replica's slot is freed and may be reused; `version`
increments on every add/remove so that caches of "report dictionary -> slots" (kept per handle by
the metrics store) know when to rebuild. `capacity` only grows, so arrays sized to it stay valid.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

import numpy as np
import numpy.typing as npt

NO_SLOT = -1
_MIN_CAPACITY = 8


class ReplicaIndex:
    __slots__ = ("_free", "_ids", "_log", "_log_base", "_slot_of", "version")

    def __init__(self) -> None:
        self._ids: list[str | None] = []
        self._slot_of: dict[str, int] = {}
        self._free: list[int] = []
        self.version = 0
        self._log: list[int] = []
        """The slot of each change since version `_log_base` (what followers catch up from)."""
        self._log_base = 0

    def __len__(self) -> int:
        return len(self._slot_of)

    def __contains__(self, replica_id: object) -> bool:
        return replica_id in self._slot_of

    @property
    def capacity(self) -> int:
        return max(_MIN_CAPACITY, len(self._ids))

    def slot(self, replica_id: str) -> int:
        return self._slot_of.get(replica_id, NO_SLOT)

    def id_at(self, slot: int) -> str | None:
        return self._ids[slot] if 0 <= slot < len(self._ids) else None

    def ids(self) -> list[str]:
        return list(self._slot_of)

    def add(self, replica_id: str) -> int:
        slot = self._slot_of.get(replica_id)
        if slot is not None:
            return slot
        if self._free:
            slot = self._free.pop()
            self._ids[slot] = replica_id
        else:
            slot = len(self._ids)
            self._ids.append(replica_id)
        self._slot_of[replica_id] = slot
        self._changed(slot)
        return slot

    def remove(self, replica_id: str) -> int:
        slot = self._slot_of.pop(replica_id, NO_SLOT)
        if slot != NO_SLOT:
            self._ids[slot] = None
            self._free.append(slot)
            self._changed(slot)
        return slot

    def _changed(self, slot: int) -> None:
        self.version += 1
        if len(self._log) >= max(1024, 4 * len(self._ids)):
            # followers further behind than this rescan every slot once (changed_since: None)
            self._log.clear()
            self._log_base = self.version - 1
        self._log.append(slot)

    def changed_since(self, version: int) -> list[int] | None:
        """The slots added or removed since `version` (repeats possible), or None when the log no
        longer reaches back that far (then look at every slot)."""
        if version < self._log_base:
            return None
        return self._log[version - self._log_base :]

    def sync(self, replica_ids: Iterable[str]) -> None:
        """Make the index hold exactly `replica_ids` (keeping the slots of those it already has)."""
        wanted = set(replica_ids)
        for rid in [r for r in self._slot_of if r not in wanted]:
            self.remove(rid)
        for rid in sorted(wanted - self._slot_of.keys()):
            self.add(rid)

    def slots_for(self, replica_ids: Collection[str]) -> npt.NDArray[np.int64]:
        """Slots of `replica_ids` in order, NO_SLOT for unknown ones (one dict lookup each:
        callers cache the result per report dictionary and `version`)."""
        get = self._slot_of.get
        return np.fromiter(
            (get(r, NO_SLOT) for r in replica_ids), dtype=np.int64, count=len(replica_ids)
        )

    def live_mask(self) -> npt.NDArray[np.bool_]:
        mask = np.zeros(self.capacity, dtype=np.bool_)
        if self._slot_of:
            mask[np.fromiter(self._slot_of.values(), dtype=np.int64)] = True
        return mask

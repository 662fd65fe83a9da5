"""The router's carried-health map: the newest health of each replica it talks to.

How it works: every `HealthStatus` that reaches a router (on an admission, a health frame or a probe
reply) is offered to `observe`. The map keeps one entry per replica, the one with the newest
`checked_at` (the replica's own wall clock, so two statuses of one replica order correctly even when
they arrive out of order); an older or equal `checked_at` is ignored. Alongside each entry it keeps
the local monotonic time the entry was received, and every age decision uses that receipt time,
never the remote clock: a replica whose wall clock is hours off is neither dropped early nor kept
forever. Entries not refreshed for `MAX_AGE_S` are dropped by `expire` and never re-sent by
`snapshot`; entries of replicas that left the membership are dropped by `prune_to`.

A replica whose wall clock steps backwards sends statuses older than the stored one; they are
ignored until the stored entry ages out, after which the next one is accepted.

Pure: no clock, no bus; the caller passes `now_mono`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import Final

from shared.wire.messages import HealthStatus

MAX_AGE_S: Final = 30.0
"""Entries not refreshed (by local receipt time) for this long are dropped and not re-sent."""


class CarriedHealthMap:
    __slots__ = ("_entries", "max_age_s")

    def __init__(self, max_age_s: float = MAX_AGE_S) -> None:
        self.max_age_s = max_age_s
        # replica_id -> (status, local monotonic receipt time)
        self._entries: dict[str, tuple[HealthStatus, float]] = {}

    def observe(self, status: HealthStatus, now_mono: float) -> bool:
        """Offer a status; True if it became the replica's entry (newer than what was held)."""
        held = self._entries.get(status.replica_id)
        if held is not None and status.checked_at <= held[0].checked_at:
            return False
        self._entries[status.replica_id] = (status, now_mono)
        return True

    def prune_to(self, replica_ids: Collection[str]) -> int:
        """Keep only entries of `replica_ids` (the new membership); return how many were dropped."""
        gone = [rid for rid in self._entries if rid not in replica_ids]
        for rid in gone:
            del self._entries[rid]
        return len(gone)

    def expire(self, now_mono: float) -> int:
        """Drop entries received more than `max_age_s` ago; return how many were dropped."""
        stale = [rid for rid, (_, at) in self._entries.items() if now_mono - at > self.max_age_s]
        for rid in stale:
            del self._entries[rid]
        return len(stale)

    def snapshot(self, now_mono: float) -> tuple[HealthStatus, ...]:
        """The fresh entries, for a handle report. Expired entries are left out even before
        `expire` runs, so a late expiry can never re-send one."""
        limit = self.max_age_s
        return tuple(s for s, at in self._entries.values() if now_mono - at <= limit)

    def get(self, replica_id: str) -> HealthStatus | None:
        held = self._entries.get(replica_id)
        return held[0] if held is not None else None

    def received_at(self, replica_id: str) -> float | None:
        held = self._entries.get(replica_id)
        return held[1] if held is not None else None

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

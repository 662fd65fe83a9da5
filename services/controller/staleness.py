"""Staleness gate: which reports from one source may still change the controller's view.

How it works. Every source (a replica id for replica reports, a handle id for handle reports)
keeps the (sent_at, seq) of the last report accepted from it, compared lexicographically: a
report with an older key is stale, one with a newer key starts a new report. A report may be
split into columnar parts that share (sent_at, seq) and differ only in `part`; the gate keeps the
set of parts seen for the latest key, so each part is accepted once and a repeat is a duplicate
(as is a "part" that disagrees with the accepted one on the number of parts: a sender reused a
key for another report). An object-path report is part 0 of 1. The gate does not care which format a report came in:
both formats of one source share one entry, which is what lets a handle switch formats
mid-rollout without a stale report slipping through.

Ages are judged by local receipt time (`recv`, monotonic seconds), never by the sender's
`sent_at`. A source whose data was dropped for silence keeps its gate entry for a while longer
(`GATE_RETENTION_FACTOR` x the silence timeout), so a report delayed past expiry cannot
resurrect it with old data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

MIN_SOURCE_TIMEOUT_S: Final = 10.0
"""A handle source is dropped after max(SOURCE_TIMEOUT_INTERVALS x metrics_interval_s, this)."""
SOURCE_TIMEOUT_INTERVALS: Final = 2.0
GATE_RETENTION_FACTOR: Final = 6.0
"""Gate entries outlive the data they guard by this factor of the silence timeout."""


def source_timeout_s(metrics_interval_s: float) -> float:
    """Silence (by receipt time) after which a source's data is dropped."""
    return max(SOURCE_TIMEOUT_INTERVALS * metrics_interval_s, MIN_SOURCE_TIMEOUT_S)


class Verdict(Enum):
    """What the gate made of one report (or part)."""

    NEW_REPORT = "new_report"
    """First part seen of a report newer than anything before from this source."""
    NEW_PART = "new_part"
    """Another part of the latest report, not seen before."""
    STALE = "stale"
    DUPLICATE = "duplicate"

    @property
    def accepted(self) -> bool:
        return self is Verdict.NEW_REPORT or self is Verdict.NEW_PART


@dataclass(slots=True)
class _Entry:
    sent_at: float
    seq: int
    parts: int
    seen: set[int] = field(default_factory=set)
    last_recv: float = 0.0


class SourceGate:
    """Last accepted (sent_at, seq) and parts seen, per source id."""

    __slots__ = ("_entries", "_oldest")

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._oldest = math.inf
        """No entry's `last_recv` is below this (a lower bound): `prune` below it has no work."""

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, source: object) -> bool:
        return source in self._entries

    def check(
        self, source: str, sent_at: float, seq: int, part: int = 0, parts: int = 1
    ) -> Verdict:
        """The verdict `admit` would give, without recording anything."""
        e = self._entries.get(source)
        if e is None:
            return Verdict.NEW_REPORT
        if (sent_at, seq) < (e.sent_at, e.seq):
            return Verdict.STALE
        if (sent_at, seq) > (e.sent_at, e.seq):
            return Verdict.NEW_REPORT
        # Same key: another part of the same report, unless already seen. A part that disagrees
        # on the number of parts cannot belong to the report accepted under this key.
        return Verdict.DUPLICATE if part in e.seen or parts != e.parts else Verdict.NEW_PART

    def admit(
        self, source: str, sent_at: float, seq: int, recv: float, part: int = 0, parts: int = 1
    ) -> Verdict:
        """Judge one report (or part) and record it if accepted."""
        verdict = self.check(source, sent_at, seq, part, parts)
        if verdict.accepted:
            self._oldest = min(self._oldest, recv)
        if verdict is Verdict.NEW_REPORT:
            self._entries[source] = _Entry(sent_at, seq, parts, {part}, recv)
        elif verdict is Verdict.NEW_PART:
            e = self._entries[source]
            e.seen.add(part)
            e.last_recv = recv
        return verdict

    def complete(self, source: str) -> bool:
        """Whether every part of the source's latest report has been accepted."""
        e = self._entries.get(source)
        return e is not None and len(e.seen) >= e.parts

    def last(self, source: str) -> tuple[float, int] | None:
        """(sent_at, seq) of the latest accepted report, or None."""
        e = self._entries.get(source)
        return None if e is None else (e.sent_at, e.seq)

    def last_recv(self, source: str) -> float | None:
        e = self._entries.get(source)
        return None if e is None else e.last_recv

    def forget(self, source: str) -> None:
        self._entries.pop(source, None)

    def prune(self, older_than: float) -> list[str]:
        """Forget sources whose last acceptance was received before `older_than`."""
        if older_than <= self._oldest:
            return []  # runs every control tick: no pass over the sources until one can go
        gone = [s for s, e in self._entries.items() if e.last_recv < older_than]
        for s in gone:
            del self._entries[s]
        self._oldest = min((e.last_recv for e in self._entries.values()), default=math.inf)
        return gone

"""Which apps' status documents a tick writes, and when.

How it works: an app's status (KV fp_status) is rewritten

- at the next tick when an event changed it (`changed`: a replica came or went, the decision or
  a deployment's status moved);
- at its next *look* when its figures (counts, decision) differ from the status last written or
  its demand moved by more than `_demand_moved` allows; an app is looked at only if an input or a
  visit `touched` it since the last look;
- at its first look after the app came to this owner (created, or its partition taken over), so
  the status carries the owner's epoch.

An unchanged status is never rewritten: whether its owner is alive is read from the partition's
lease and the owner's member entry (`fleetpulse status`), not from the status's age. Rewriting
every status every few seconds for that was, at 10,000 apps, 500 KV writes a second and a tenth
of the controller's CPU.

Looks are on per-app phases (a hash of the name) of their period, so apps created or taken over
together are spread evenly over the period instead of coming due in one tick. The period grows
with the number of apps beyond `looks_per_s`: at 10,000 apps a look every 2 s was 5,000 looks a
second, a quarter of a core and most of a tick. The apps to look at come from a timer heap, never
from a pass over every app. No clock, no I/O: the core asks `due(now, ...)` at each tick.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Collection

from .machinery.schedule import Schedule

Figures = tuple[tuple[object, ...], tuple[float, ...]]
"""What a status shows, per deployment: the figures that must match exactly, and demands."""

DEMAND_MOVED_ABS = 0.5
DEMAND_MOVED_REL = 0.1
_LOOK_SALT = b"look"


class StatusBook:
    def __init__(self, refresh_s: float, looks_per_s: float) -> None:
        self.refresh_s = refresh_s
        self.looks_per_s = looks_per_s
        self._written: dict[str, Figures] = {}
        """Per app: what its status last written showed."""
        self._touched: set[str] = set()
        self._changed: set[str] = set()
        self._looks: Schedule[str] = Schedule()

    def changed(self, app: str) -> None:
        """An event changed what the app's status says: write it at the next tick."""
        self._changed.add(app)

    def touched(self, app: str) -> None:
        """An input or a visit touched the app: look at it at its next look."""
        self._touched.add(app)

    def forget(self, app: str) -> None:
        self._written.pop(app, None)
        self._touched.discard(app)
        self._changed.discard(app)
        self._looks.forget(app)

    def look_s(self, apps: int) -> float:
        """How often an app is looked at: `refresh_s`, or longer beyond `looks_per_s`."""
        return max(self.refresh_s, apps / self.looks_per_s)

    def due(
        self,
        now: float,
        apps: Collection[str],
        held: Collection[str],
        figures: Callable[[str], Figures],
    ) -> list[str]:
        """The apps whose status to write at `now`, in name order. `apps`: those that exist;
        `held` ones are not written (their history is being replayed) but keep their looks;
        `figures(app)` is called only for apps looked at."""
        out: list[str] = []
        look = self.look_s(len(apps))
        looked = self._looks.fired(now)
        for app in sorted((self._changed | looked).difference(held)):
            if app not in apps:
                self._looks.forget(app)
                continue
            if app in looked or app not in self._written:
                self._looks.place(app, on_phase(app, now, look))
            written = self._written.get(app)
            changed = app in self._changed or written is None
            if not (changed or app in self._touched):
                continue  # nothing arrived and nothing ran for it since the last look
            self._touched.discard(app)
            shown, now_demands = figures(app)
            seen, demands = written or ((), ())
            moved = len(now_demands) != len(demands) or any(
                demand_moved(a, b) for a, b in zip(demands, now_demands, strict=False)
            )
            if not (changed or moved or shown != seen):
                continue  # nothing to say that the last status did not
            self._changed.discard(app)
            self._written[app] = (shown, now_demands)
            out.append(app)
        for app in looked.intersection(held):
            self._looks.place(app, on_phase(app, now, look))
        return out


def on_phase(app: str, after: float, period: float) -> float:
    """The first time after `after` on the app's own phase of `period` (a hash of its name):
    per-app work on a period, spread evenly over it whatever the apps' history."""
    phase = _phase(app)
    return (math.floor(after / period - phase) + 1 + phase) * period


@functools.lru_cache(maxsize=1 << 16)
def _phase(app: str) -> float:
    # not crc32: it is affine, so phases of similar names would correlate
    digest = hashlib.blake2b(app.encode(), digest_size=8, salt=_LOOK_SALT).digest()
    return int.from_bytes(digest, "big") / 2**64


def demand_moved(shown: float, now: float) -> bool:
    """Whether a status showing `shown` must be rewritten for `now`: by more than 10% and more
    than half a request (the figure is for people and dashboards; a status per wiggle of a
    noisy demand was a KV write per report at 10,000 apps). Decisions never wait for it."""
    delta = abs(now - shown)
    return delta > DEMAND_MOVED_ABS and delta > DEMAND_MOVED_REL * shown

"""When the controller's garbage collector may do its expensive work: between ticks, on little.

How it works: CPython's full (generation 2) collection walks every tracked container object, and
a controller holding a large fleet has hundreds of thousands of them (replica records, their
dicts and sets, per-deployment state: docs/architecture.md "The collector"), so a full collection
takes 0.1-0.7 s, and it starts inside whatever allocation crosses the threshold: usually inside a
control tick. Almost all of those objects live as long as the fleet does. So:

- after a start or a takeover has been rebuilt (`settle`), one full collection, then
  `gc.freeze()`: what survives moves to the permanent generation, which no later collection walks;
- the interpreter's own collections are off (`manual`, the default): `between_ticks` runs the
  generation the interpreter's thresholds call for (young ones at most once per gap between
  ticks, a full one every `threshold[1] x threshold[2]` of those), so no collection of any
  generation starts inside a tick. Even with the freeze, one full collection of a few tens of ms
  fell inside a tick every 30 s at 10,000 apps;
- after every full collection, the next gap between ticks freezes what survived it, so the next
  one walks only what was created since, not the whole fleet again.

The price: an object frozen while alive that later becomes garbage *in a reference cycle* is never
reclaimed (objects freed by reference counting, nearly all of them, are freed as usual), and
cyclic garbage waits for the next gap between ticks. The controller's long-lived structures hold
no cycles; `unfreeze_every_s` bounds what could pile up by unfreezing and collecting in full again
(one long pause, default every 6 hours).
"""

from __future__ import annotations

import gc
from typing import Any

DEFAULT_UNFREEZE_EVERY_S = 6 * 3600.0


class Collector:
    def __init__(
        self, *, unfreeze_every_s: float = DEFAULT_UNFREEZE_EVERY_S, manual: bool = True
    ) -> None:
        self.unfreeze_every_s = unfreeze_every_s
        self.manual = manual
        self.full_collections = 0
        """Full collections (not `settle`'s): the interpreter's, or between ticks if manual."""
        self.collections = [0, 0, 0]
        """Collections `between_ticks` ran, by generation."""
        self.freezes = 0
        self._freeze_due = False
        self._settled_at: float | None = None
        self._was_enabled = gc.isenabled()
        gc.callbacks.append(self._on_gc)
        if manual:
            gc.disable()

    def close(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self.manual and self._was_enabled:
            gc.enable()

    @staticmethod
    def due_generation() -> int | None:
        """The generation the interpreter would collect now (its counts against its
        thresholds), or None. Unlike it, a full collection does not also wait for the
        long-lived objects to have grown by a quarter: after a freeze there are few."""
        counts, thresholds = gc.get_count(), gc.get_threshold()
        for gen in (2, 1, 0):
            if counts[gen] > thresholds[gen] > 0:
                return gen
        return None

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "stop" and info.get("generation") == 2:
            self.full_collections += 1
            self._freeze_due = True

    def settle(self, now: float) -> None:
        """A start or takeover is rebuilt: collect once, freeze the survivors."""
        gc.collect()
        gc.freeze()
        self.freezes += 1
        self._freeze_due = False
        self._settled_at = now

    def between_ticks(self, now: float) -> None:
        """Cheap unless a collection is due (manual), a full collection just ran (then one
        freeze) or the unfreeze is due."""
        if self._settled_at is not None and now - self._settled_at >= self.unfreeze_every_s:
            gc.unfreeze()
            self.settle(now)
            return
        if self.manual:
            gen = self.due_generation()
            if gen is not None:
                gc.collect(gen)
                self.collections[gen] += 1
        if self._freeze_due:
            gc.freeze()
            self.freezes += 1
            self._freeze_due = False

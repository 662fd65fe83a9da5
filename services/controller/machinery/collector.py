"""When the controller's garbage collector may do its expensive work: between ticks, on little.

How it works: CPython's full (generation 2) collection walks every tracked container object, and
a controller holding a large fleet has hundreds of thousands of them (replica records, their
dicts and sets, per-deployment state: docs/architecture.md "The collector"), so a full collection
takes 0.1-0.7 s, and it starts inside whatever allocation crosses the threshold: usually inside a
control tick. Almost all of those objects live as long as the fleet does. So:

- after a start or a takeover has been rebuilt (`settle`), one full collection, then
  `gc.freeze()`: what survives moves to the permanent generation, which no later collection walks;
- after every full collection the interpreter runs on its own (seen by a gc callback), the next
  gap between ticks (`between_ticks`) freezes what survived it, so the next one walks only what
  was created since, not the whole fleet again.

The price: an object frozen while alive that later becomes garbage *in a reference cycle* is never
reclaimed (objects freed by reference counting, nearly all of them, are freed as usual). The
controller's long-lived structures hold no cycles; `unfreeze_every_s` bounds what could pile up
by unfreezing and collecting in full again (one long pause, default every 6 hours).
"""

from __future__ import annotations

import gc
from typing import Any

DEFAULT_UNFREEZE_EVERY_S = 6 * 3600.0


class Collector:
    def __init__(self, *, unfreeze_every_s: float = DEFAULT_UNFREEZE_EVERY_S) -> None:
        self.unfreeze_every_s = unfreeze_every_s
        self.full_collections = 0
        """Full collections the interpreter ran on its own (not `settle`'s)."""
        self.freezes = 0
        self._freeze_due = False
        self._settled_at: float | None = None
        gc.callbacks.append(self._on_gc)

    def close(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

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
        """Cheap unless a full collection just ran (then one freeze) or the unfreeze is due."""
        if self._settled_at is not None and now - self._settled_at >= self.unfreeze_every_s:
            gc.unfreeze()
            self.settle(now)
            return
        if self._freeze_due:
            gc.freeze()
            self.freezes += 1
            self._freeze_due = False

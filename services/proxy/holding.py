"""Requests waiting for a replica: a bounded hold queue per app, and waking them when the app is
lost.

How it works: every request waits for a replica to admit it under a `Hold`. A request that
arrives while its app's ingress deployment has no replica at all is *held*: it waits in the
deployment's router queue (whose cold-start report wakes the deployment) until a replica admits
it. Held requests are bounded per app (`max_held_per_app`); one more is refused at once (503 +
Retry-After) instead of piling up. The server bounds every wait (`max_wait_s`).

A request must not wait out its bound for an app that can no longer serve it: when the registry
deregisters an app (a deployment crashed at zero) or forgets it (deleted), `release_app` resolves
the app's `gone` future with the reason, which every request waiting for that app watches next to
its call, so each gets its answer at once. Requests that arrive later wait on a fresh future.

No awaits here; `gone` is a plain future (not an Event) so that a waiter needs no extra task.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Final

from shared import settings

DEFAULT_MAX_HELD_PER_APP: Final[int] = settings.PROXY_MAX_HELD.default
DEFAULT_MAX_WAIT_S: Final[float] = settings.PROXY_MAX_WAIT.default


@dataclass(frozen=True, slots=True)
class Gone:
    """Why the waiting requests of an app were released."""

    reason: str
    known: bool
    """False when the app left the registry altogether (deleted), not just deregistered."""


@dataclass(slots=True)
class _AppWaits:
    waiting: int = 0
    held: int = 0
    gone: asyncio.Future[Gone] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


@dataclass(slots=True)
class Hold:
    """One waiting request; `release()` it when it was admitted or given up (idempotent)."""

    app: str
    held: bool
    """Counted against the app's hold bound (it arrived while the app had no replica)."""
    _state: _AppWaits
    _holds: Holds
    released: bool = False

    @property
    def gone(self) -> asyncio.Future[Gone]:
        """Resolves when the app can no longer serve waiting requests."""
        return self._state.gone

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._holds._release(self)


class Holds:
    def __init__(self, max_held_per_app: int = DEFAULT_MAX_HELD_PER_APP) -> None:
        if max_held_per_app < 0:
            raise ValueError("max_held_per_app must be >= 0")
        self.max_held_per_app = max_held_per_app
        self._apps: dict[str, _AppWaits] = {}

    def enter(self, app: str, *, held: bool) -> Hold | None:
        """A hold for one more waiting request; None when it is `held` and the app's hold queue
        is full. Call from within the event loop."""
        state = self._apps.get(app)
        if state is None:
            state = self._apps[app] = _AppWaits()
        if held:
            if state.held >= self.max_held_per_app:
                if not state.waiting:
                    del self._apps[app]
                return None
            state.held += 1
        state.waiting += 1
        return Hold(app, held, state, self)

    def _release(self, hold: Hold) -> None:
        state = hold._state
        state.waiting -= 1
        if hold.held:
            state.held -= 1
        if state.waiting == 0 and self._apps.get(hold.app) is state:
            del self._apps[hold.app]  # nothing kept for apps nobody waits for

    def release_app(self, app: str, reason: str, *, known: bool = True) -> int:
        """Wake every request waiting for `app`: it was deregistered (or, `known=False`,
        removed). Returns how many were waiting."""
        state = self._apps.pop(app, None)
        if state is None:
            return 0
        state.gone.set_result(Gone(reason, known))
        return state.waiting

    def held(self, app: str) -> int:
        state = self._apps.get(app)
        return state.held if state is not None else 0

    def waiting(self, app: str) -> int:
        state = self._apps.get(app)
        return state.waiting if state is not None else 0

    def counts(self) -> dict[str, int]:
        """Held requests per app (apps holding none are left out)."""
        return {app: s.held for app, s in self._apps.items() if s.held}

    @property
    def total(self) -> int:
        return sum(s.held for s in self._apps.values())

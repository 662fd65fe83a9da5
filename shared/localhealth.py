"""Local health providers: the health of replicas in this process, for its routers to carry.

A replica process that also owns handles (user code calling another deployment) registers
`fn() -> HealthStatus | None` for its app with `register_local_health_provider`; every report of
every router in the process *to a deployment of the same app* merges those statuses into its
carried health (`services/router/reports.py` says why only the same app). The replica runtime
registers; the router collects: this registry is the one thing both sides share.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from typing import Final

from shared.badinput import DEFAULT_LOG_INTERVAL_S
from shared.bus import RateLimiter
from shared.clock import SYSTEM_CLOCK, Clock
from shared.wire.messages import HealthStatus

logger = logging.getLogger(__name__)

HealthProvider = Callable[[], HealthStatus | None]

MAX_LOCAL_PROVIDERS: Final = 1024
"""A guard against a provider registered per request by mistake (each call costs every report)."""


class LocalHealthProviders:
    """A process-local registry of health providers (thread-safe registration)."""

    __slots__ = ("_keys", "_lock", "_log", "_providers", "errors")

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._providers: dict[int, tuple[str, HealthProvider]] = {}
        self._keys = itertools.count()
        self._lock = threading.Lock()
        self._log = RateLimiter(DEFAULT_LOG_INTERVAL_S, clock)
        self.errors = 0

    def register(self, fn: HealthProvider, *, app: str) -> Callable[[], None]:
        """Add a provider of a replica of `app`; returns a function that removes it (safe to
        call more than once)."""
        with self._lock:
            if len(self._providers) >= MAX_LOCAL_PROVIDERS:
                raise RuntimeError(f"more than {MAX_LOCAL_PROVIDERS} local health providers")
            key = next(self._keys)
            self._providers[key] = (app, fn)

        def unregister() -> None:
            with self._lock:
                self._providers.pop(key, None)

        return unregister

    def collect(self, app: str) -> list[HealthStatus]:
        """Call every provider of `app` (only: see the module doc); one that raises or returns
        junk is counted, logged and skipped."""
        with self._lock:
            providers = [fn for owner, fn in self._providers.values() if owner == app]
        out: list[HealthStatus] = []
        for fn in providers:
            try:
                status = fn()
            except Exception as exc:  # user-supplied code: isolate whatever it raises
                self._failed(fn, f"{type(exc).__name__}: {exc}")
                continue
            if status is None:
                continue
            if not isinstance(status, HealthStatus):
                self._failed(fn, f"returned {type(status).__name__}, not HealthStatus")
                continue
            out.append(status)
        return out

    def __len__(self) -> int:
        return len(self._providers)

    def _failed(self, fn: HealthProvider, detail: str) -> None:
        self.errors += 1
        if self._log.allow():
            logger.warning(
                "local health provider %r failed (%d failures so far): %s",
                getattr(fn, "__qualname__", fn),
                self.errors,
                detail,
            )


DEFAULT_PROVIDERS: Final = LocalHealthProviders()


def register_local_health_provider(fn: HealthProvider, *, app: str) -> Callable[[], None]:
    """Merge `fn()`'s status (a replica of `app`) into every handle report this process sends to
    a deployment of `app`; returns unregister."""
    return DEFAULT_PROVIDERS.register(fn, app=app)

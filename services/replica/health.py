"""The replica's own health checks: consecutive-failure counting and check scheduling.

How it works: the shell calls the user's `check_health()` every period (jittered +-10% so a fleet
started together does not check in lockstep) with a timeout. `HealthTracker.record(ok, now_wall)`
turns each outcome into a `HealthStatus`: a success resets `consecutive_failures`, a failure (raise
or timeout) increments it. `checked_at` is the replica's wall clock and strictly increases, so a
receiver's newest-wins rule never sees two different results with one timestamp.
"""

from __future__ import annotations

import random

from shared.wire.messages import HealthStatus

JITTER_FRACTION = 0.10
_MIN_STEP_S = 1e-6


class HealthTracker:
    __slots__ = ("_failures", "_latest", "replica_id")

    def __init__(self, replica_id: str) -> None:
        self.replica_id = replica_id
        self._failures = 0
        self._latest: HealthStatus | None = None

    @property
    def latest(self) -> HealthStatus | None:
        return self._latest

    def record(self, ok: bool, now_wall: float) -> HealthStatus:
        self._failures = 0 if ok else self._failures + 1
        checked_at = now_wall
        if self._latest is not None and checked_at <= self._latest.checked_at:
            checked_at = self._latest.checked_at + _MIN_STEP_S
        self._latest = HealthStatus(
            replica_id=self.replica_id,
            healthy=ok,
            checked_at=checked_at,
            consecutive_failures=self._failures,
        )
        return self._latest


def next_check_delay(period_s: float, rng: random.Random) -> float:
    """Delay until the next check: the period with +-10% jitter."""
    return period_s * rng.uniform(1.0 - JITTER_FRACTION, 1.0 + JITTER_FRACTION)

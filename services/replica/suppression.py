"""Which channel carries the replica's health, and when a frame or a heartbeat is needed.

How it works: every channel that takes the replica's latest `HealthStatus` off the box (an
admission message, a pushed ReplicaReport, an in-process router's handle report, a health frame,
a heartbeat) reports it here with `carried(status, now)`. The tracker remembers the newest
`checked_at` that went out and the local monotonic time it went out.

- Heartbeat: due when nothing carried health within the freshness window
  (`max(1.5 x period, 1 s)`), or when the latest check flipped healthy/unhealthy and that news has
  not gone out yet (a verdict change should not wait a whole window). So heartbeats stop on their
  own while traffic flows, and resume on their own when it stops.
- Frame, for one held request that declared frames: due at a tick when a self-check newer than
  anything carried anywhere exists, and newer than what this request already sent. The first held
  request to tick carries it; every other channel (and request) then sees it as carried, so a new
  check result costs one frame at most, and frames stop the moment health rides elsewhere.
- A replica that pushes its own reports has a permanent channel; frames are never needed then.

Fail-open both ways: unknown state (nothing carried yet) means "send".
"""

from __future__ import annotations

from shared.wire.messages import HealthStatus

MIN_FRESHNESS_S = 1.0
FRESHNESS_PERIODS = 1.5


def freshness_window(health_check_period_s: float) -> float:
    return max(FRESHNESS_PERIODS * health_check_period_s, MIN_FRESHNESS_S)


class HealthCarriage:
    __slots__ = (
        "_carried_checked_at",
        "_carried_healthy",
        "_last_carried_mono",
        "_latest",
        "freshness_s",
        "reports_carry_health",
    )

    def __init__(self, freshness_s: float, *, reports_carry_health: bool = False) -> None:
        self.freshness_s = freshness_s
        self.reports_carry_health = reports_carry_health
        self._latest: HealthStatus | None = None
        self._last_carried_mono: float | None = None
        self._carried_checked_at = float("-inf")
        self._carried_healthy: bool | None = None

    @property
    def latest(self) -> HealthStatus | None:
        return self._latest

    def on_check(self, status: HealthStatus) -> None:
        if self._latest is None or status.checked_at > self._latest.checked_at:
            self._latest = status

    def carried(self, status: HealthStatus, now_mono: float) -> None:
        """A channel took `status` off the box at `now_mono`."""
        self._last_carried_mono = now_mono
        if status.checked_at > self._carried_checked_at:
            self._carried_checked_at = status.checked_at
            self._carried_healthy = status.healthy

    def heartbeat_due(self, now_mono: float) -> bool:
        if self._latest is None:
            return False
        if self._last_carried_mono is None:
            return True
        if now_mono - self._last_carried_mono >= self.freshness_s:
            return True
        uncarried = self._latest.checked_at > self._carried_checked_at
        return uncarried and self._latest.healthy != self._carried_healthy

    def frame_due(self, request_sent_checked_at: float) -> HealthStatus | None:
        """The status to send as a frame on a held request, or None."""
        latest = self._latest
        if latest is None or self.reports_carry_health:
            return None
        if latest.checked_at <= request_sent_checked_at:
            return None
        if latest.checked_at <= self._carried_checked_at:
            return None
        return latest

"""Which channel carries the replica's health, and when a frame or a heartbeat is needed.

How it works: every channel that takes the replica's latest `HealthStatus` off the box reports it
here with `carried(status, now, via)`. Channels differ in two ways that matter:

- *riding* channels flow anyway (the replica's own reports, admissions, an in-process router's
  handle reports: `Via.REPORT`, `Via.ADMISSION`, `Via.HOST`); while one of them carried health
  within the freshness window, health "rides elsewhere" and no frame is needed;
- *direct* channels reach the controller now (`REPORT`, `HOST`, `HEARTBEAT`, `PROBE`); an
  admission or a frame reaches a router, which folds it into its next handle report, up to one
  metrics interval later.

Rules (the freshness window is `max(1.5 x period, 1 s)`):
- Heartbeat due when nothing at all carried health within the window (so heartbeats stop on
  their own while traffic flows and resume when it stops); or at once when the latest check
  failed and no direct channel sent it yet: bad news goes out by the fastest channel, whatever a
  router already holds; or when the latest check flipped back to healthy and nothing carried that.
  Suppression is for good news only.
- Frame, for one held request that declared frames: due when the latest check is newer than
  anything carried anywhere and than what this request already sent, and no riding channel
  carried health within the window. The first held request to tick carries it; every other
  channel (and request) then sees it as carried, so a new result costs one frame at most. The
  shell evaluates frames on every tick as well as after each check, so a frame (not a heartbeat)
  takes over the moment riding channels go quiet.
- `reports_carry_health`: the replica pushes its own reports at a cadence of at most one health
  period, so every check rides on a report and frames are never needed (nor declared).

Fail-open both ways: unknown state (nothing carried yet) means "send".
"""

from __future__ import annotations

import enum
import math

from shared.wire.messages import HealthStatus


class Via(enum.Enum):
    """The channel that took a status off the box."""

    REPORT = "report"
    HOST = "host"
    ADMISSION = "admission"
    FRAME = "frame"
    HEARTBEAT = "heartbeat"
    PROBE = "probe"

    @property
    def riding(self) -> bool:
        return self in _RIDING

    @property
    def direct(self) -> bool:
        return self in _DIRECT


_RIDING = frozenset({Via.REPORT, Via.HOST, Via.ADMISSION})
_DIRECT = frozenset({Via.REPORT, Via.HOST, Via.HEARTBEAT, Via.PROBE})


class HealthCarriage:
    __slots__ = (
        "_carried_checked_at",
        "_carried_healthy",
        "_direct_checked_at",
        "_last_carried_mono",
        "_last_riding_mono",
        "_latest",
        "freshness_s",
        "reports_carry_health",
    )

    def __init__(self, freshness_s: float, *, reports_carry_health: bool = False) -> None:
        self.freshness_s = freshness_s
        self.reports_carry_health = reports_carry_health
        self._latest: HealthStatus | None = None
        self._last_carried_mono: float | None = None
        self._last_riding_mono = -math.inf
        self._carried_checked_at = -math.inf
        self._carried_healthy: bool | None = None
        self._direct_checked_at = -math.inf

    @property
    def latest(self) -> HealthStatus | None:
        return self._latest

    def on_check(self, status: HealthStatus) -> None:
        if self._latest is None or status.checked_at > self._latest.checked_at:
            self._latest = status

    def carried(self, status: HealthStatus, now_mono: float, via: Via) -> None:
        """Channel `via` took `status` off the box at `now_mono`."""
        self._last_carried_mono = now_mono
        if via.riding:
            self._last_riding_mono = now_mono
        if via.direct:
            self._direct_checked_at = max(self._direct_checked_at, status.checked_at)
        if status.checked_at > self._carried_checked_at:
            self._carried_checked_at = status.checked_at
            self._carried_healthy = status.healthy

    def heartbeat_due(self, now_mono: float) -> bool:
        latest = self._latest
        if latest is None:
            return False
        if self._last_carried_mono is None:
            return True
        if now_mono - self._last_carried_mono >= self.freshness_s:
            return True
        if not latest.healthy and latest.checked_at > self._direct_checked_at:
            return True  # bad news: never wait for a router's next report
        uncarried = latest.checked_at > self._carried_checked_at
        return uncarried and latest.healthy != self._carried_healthy

    def frame_due(self, request_sent_checked_at: float, now_mono: float) -> HealthStatus | None:
        """The status to send as a frame on a held request, or None."""
        latest = self._latest
        if latest is None or self.reports_carry_health:
            return None
        if latest.checked_at <= request_sent_checked_at:
            return None
        if latest.checked_at <= self._carried_checked_at:
            return None
        if now_mono - self._last_riding_mono < self.freshness_s:
            return None  # health rides on a channel that flows anyway
        return latest

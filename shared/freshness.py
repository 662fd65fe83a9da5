"""The health freshness window: how long a replica's health, once carried, counts as fresh.

One protocol fact with two users: the replica stops sending heartbeats (and health frames) while
its health rode another channel within the window (`services/replica/suppression.py`), and the
controller judges an entry stale past the window plus a small slack
(`services/controller/health_registry.py`). Both read it from here, so they cannot drift apart.
"""

from __future__ import annotations

from typing import Final

FRESHNESS_PERIODS: Final = 1.5
MIN_FRESHNESS_S: Final = 1.0


def freshness_window(health_check_period_s: float) -> float:
    """`max(1.5 x period, 1 s)` (the design brief, "Health")."""
    return max(FRESHNESS_PERIODS * health_check_period_s, MIN_FRESHNESS_S)

"""What a closed-loop what-if run is asked for: `ModelOptions` (its own module so that the fluid
queue and the simulation, which both take it, do not import each other)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from services.router.config import RouterConfig
from shared.errors import UsageError
from shared.subjects import DEFAULT_NAMESPACE

DEFAULT_MAX_QUEUED: Final = RouterConfig().max_queued_requests


@dataclass(frozen=True, slots=True)
class ModelOptions:
    interval_s: float = 0.1
    seed: int = 0
    startup_s: float | None = None
    """Replica start time; None: as calibrated (0 when the recording has no lifecycle events)."""
    timeout_s: float | None = None
    """Request deadline; None: requests wait as long as it takes."""
    max_queued: int = DEFAULT_MAX_QUEUED
    report_interval_s: float | None = None
    """Routers' report cadence; None: as recorded, else the config's metrics_interval_s."""
    replications: int = 1
    """Runs with seeds seed, seed + 1, ...: the numbers are their means (percentiles of the
    pooled latencies), the series those of the first."""
    namespace: str = DEFAULT_NAMESPACE
    random_order: bool = False
    """Queued requests are admitted in random order, as routers did before they served their
    waiters oldest first (False: first come, first served, as routers do)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.interval_s) and self.interval_s > 0):
            raise UsageError(f"interval_s must be > 0, not {self.interval_s!r}")
        for name in ("startup_s", "timeout_s", "report_interval_s"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v >= 0):
                raise UsageError(f"{name} must be >= 0, not {v!r}")
        if self.max_queued < 0:
            raise UsageError("max_queued must be >= 0")
        if self.replications < 1:
            raise UsageError("replications must be >= 1")

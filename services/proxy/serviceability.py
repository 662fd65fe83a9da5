"""The serviceability rule: may the proxy send requests to a deployment, and to an app?

How it works: one pure function of a deployment's (running replicas, status) as the controller
reports them in KV fp_status, and one that folds an app's deployments together.

| running | status                               | serviceable | why                                 |
|---------|--------------------------------------|-------------|-------------------------------------|
| > 0     | any                                  | yes         | a replica can take the request now  |
| 0       | HEALTHY                              | yes         | idle at zero: a request wakes it    |
| 0       | UPSCALING                            | yes         | waking up: the request is held      |
| 0       | DOWNSCALING                          | yes         | settling at zero: a transient       |
| 0       | UPDATING                             | no          | starting, not able to serve yet     |
| 0       | UNHEALTHY, DEPLOY_FAILED             | no (down)   | crashed: holding requests is futile |
| 0       | anything else                        | no          | a status this proxy does not know   |

An app is registered when every one of its deployments is serviceable. Idle is not crashed:
scaling to zero never deregisters, because the wake-up needs the very requests a deregistered
app could no longer receive; and an app deployed at min_replicas 0 registers at once (HEALTHY at
zero) instead of waiting for a running replica that only a request would bring.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final


class Serviceability(enum.Enum):
    SERVING = "serving"
    """Replicas are running."""
    IDLE = "idle"
    """At zero, and a request wakes it (HEALTHY, UPSCALING or DOWNSCALING)."""
    STARTING = "starting"
    """At zero while UPDATING: it cannot serve yet."""
    DOWN = "down"
    """At zero and crashed (UNHEALTHY, DEPLOY_FAILED)."""
    UNKNOWN = "unknown"
    """At zero with a status this rule does not know, or no status at all."""

    @property
    def serviceable(self) -> bool:
        return self in (Serviceability.SERVING, Serviceability.IDLE)


SERVICEABLE_AT_ZERO: Final = frozenset({"HEALTHY", "UPSCALING", "DOWNSCALING"})
STARTING_AT_ZERO: Final = frozenset({"UPDATING"})
DOWN_AT_ZERO: Final = frozenset({"UNHEALTHY", "DEPLOY_FAILED"})


def deployment_serviceability(running: int, status: str) -> Serviceability:
    """The rule for one deployment (the table in the module docstring)."""
    if running > 0:
        return Serviceability.SERVING
    if status in SERVICEABLE_AT_ZERO:
        return Serviceability.IDLE
    if status in STARTING_AT_ZERO:
        return Serviceability.STARTING
    if status in DOWN_AT_ZERO:
        return Serviceability.DOWN
    return Serviceability.UNKNOWN


@dataclass(frozen=True, slots=True)
class AppServiceability:
    registered: bool
    down: bool
    """Not registered because a deployment crashed (rather than: not able to serve yet)."""
    blocking: tuple[str, ...]
    """The deployments that keep the app unregistered, down ones first, by name."""


def app_serviceability(deployments: Mapping[str, Serviceability]) -> AppServiceability:
    """Registered when every deployment is serviceable (an app with none is not)."""
    if not deployments:
        return AppServiceability(False, False, ())
    down = sorted(n for n, s in deployments.items() if s is Serviceability.DOWN)
    other = sorted(
        n for n, s in deployments.items() if not s.serviceable and s is not Serviceability.DOWN
    )
    return AppServiceability(not down and not other, bool(down), (*down, *other))

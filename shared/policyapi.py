"""What a custom autoscaling policy sees, and how its import path is loaded and checked.

A deployment's `autoscaling_config.policy.policy_function: "package.module:function"` names a
function of an `AutoscalingContext` (the names follow Ray Serve's). The controller runs it
(`services/controller/custom_policy.py`); `fleetpulse deploy` checks the path with the same
loader, so deploy refuses exactly what the controller would; user policies import the context
type from here (`services.controller.custom_policy` re-exports it for policies written against
that path).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from shared.appconfig import AutoscalingConfig

Policy = Callable[["AutoscalingContext"], Any]


class PolicyLoadError(Exception):
    """The import path names nothing callable that can be imported here."""


@dataclass(frozen=True, slots=True)
class CustomMetric:
    """One custom metric over the running replicas: each one's latest reported value."""

    total: float
    """Sum over the running replicas that reported a value."""
    mean: float
    """total / replicas."""
    replicas: int
    """Running replicas with a value (a replica that just started may have none yet)."""


@dataclass(frozen=True, slots=True)
class AutoscalingContext:
    """What a custom policy sees (the names follow Ray Serve's AutoscalingContext)."""

    app_name: str
    deployment_name: str
    current_num_replicas: int
    """Running replicas (Ray: len(running_replicas))."""
    target_num_replicas: int
    """The target the controller holds now (starting replicas included)."""
    total_num_requests: float
    """Ongoing + queued requests, time-weighted mean over look_back_period_s (0 without data)."""
    total_queued_requests: float
    """Requests queued at routers now, not yet sent to a replica."""
    custom_metrics: Mapping[str, CustomMetric]
    """By name: what the replicas' `record_autoscaling_stats()` returned last."""
    capacity_adjusted_min_replicas: int
    """min_replicas (fleetpulse has no target_capacity: Ray's name, the plain bound)."""
    capacity_adjusted_max_replicas: int
    policy_state: Mapping[str, Any]
    """What the previous call returned as the second item of its pair (empty at first)."""
    current_time: float
    """The controller's monotonic clock in seconds: for intervals, not the time of day."""
    config: AutoscalingConfig
    window_full: bool
    """The look-back window is covered by data (a scale-down is held until it is)."""


def load_policy(path: str) -> Policy:
    """Import `package.module:function`; PolicyLoadError saying why not."""
    module_name, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise PolicyLoadError(f"module {module_name!r} has no attribute {attr!r}") from None
    except (Exception, SystemExit) as exc:  # any import-time failure of user code
        raise PolicyLoadError(
            f"cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    if not callable(obj):
        raise PolicyLoadError(f"{path} is a {type(obj).__name__}, not a function")
    return obj  # type: ignore[no-any-return]


def policy_problem(path: str) -> str | None:
    """For `fleetpulse deploy`: why `path` cannot be used as a policy here, or None."""
    try:
        load_policy(path)
    except PolicyLoadError as exc:
        return f"{exc} (the controller imports it; run deploy where the code is importable)"
    return None

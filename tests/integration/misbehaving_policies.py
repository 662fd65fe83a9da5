"""Custom autoscaling policies that misbehave, for the policy worker's tests (and a good one)."""

from __future__ import annotations

import ctypes
import os
import re
import time
from typing import Any

from services.controller.custom_policy import AutoscalingContext


def counts(ctx: AutoscalingContext) -> tuple[int, dict[str, Any]]:
    """Three replicas; counts its calls in its policy state."""
    return 3, {"calls": int(ctx.policy_state.get("calls", 0)) + 1}


def spins(ctx: AutoscalingContext) -> int:
    while True:
        pass


def sleeps(ctx: AutoscalingContext) -> int:
    time.sleep(1e9)
    return 1


def holds_the_gil(ctx: AutoscalingContext) -> int:
    """Catastrophic backtracking: minutes inside the regex engine, a C loop that keeps the GIL."""
    re.fullmatch(r"(a+)+$", "a" * 64 + "b")
    return 1


def exits(ctx: AutoscalingContext) -> int:
    os._exit(3)


def segfaults(ctx: AutoscalingContext) -> int:
    ctypes.string_at(0)
    return 1

"""A custom autoscaling policy: keep the mean KV-cache use of the replicas near a target.

Referenced from an app file as
    autoscaling_config:
      policy: {policy_function: services.examples.kv_policy:scale_on_kv_cache}
It is a pure function of the context (shared/policyapi.py; services/controller/custom_policy.py
runs it): with the replicas' mean use `u` at `n` running replicas, `ceil(n * u / TARGET_USE)`
replicas would bring the mean to the target. Without a value yet (replicas starting) it holds the current target.
It returns Ray Serve's `(count, policy_state)` pair, so it carries over to Ray as it is.
"""

from __future__ import annotations

import math
from typing import Any

from shared.policyapi import AutoscalingContext

TARGET_USE = 0.6
"""Mean KV-cache use to aim for: room for bursts before requests queue for blocks."""


def scale_on_kv_cache(ctx: AutoscalingContext) -> tuple[int, dict[str, Any]]:
    kv = ctx.custom_metrics.get("kv_cache_use")
    if kv is None or ctx.current_num_replicas == 0:
        return ctx.target_num_replicas, dict(ctx.policy_state)
    desired = math.ceil(round(kv.mean * ctx.current_num_replicas / TARGET_USE, 9))
    return desired, {"last_mean_use": kv.mean}

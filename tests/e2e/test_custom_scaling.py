"""Scaling on a custom metric alone, through the CLI: `fleetpulse deploy` of an app whose
autoscaling_config names a policy, controller and agent as processes, no request at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.bus import Bus
from shared.kv.status import AppStatusView
from shared.natsserver import NatsServer
from shared.subjects import KV_APPS, KV_STATUS
from tests.e2e import test_closed_loop as closed_loop
from tests.e2e.test_closed_loop import Fleet, cli
from tests.waiting import eventually as until

pytestmark = pytest.mark.e2e

APP_YAML = """
applications:
  - name: llm
    route_prefix: /llm
    deployments:
      - name: Model
        import_path: services.examples.kv_model:KVModel
        init_kwargs: {{kv_use_file: "{kv_file}"}}
        health_check_period_s: 0.5
        health_check_timeout_s: 2
        graceful_shutdown_timeout_s: 2
        autoscaling_config:
          min_replicas: 1
          max_replicas: 3
          look_back_period_s: 1
          metrics_interval_s: 0.5
          policy:
            policy_function: {policy}
"""
KV_POLICY = "services.examples.kv_policy:scale_on_kv_cache"
server, bus, fleet = closed_loop.server, closed_loop.bus, closed_loop.fleet  # fixtures, shared


async def model(bus: Bus) -> tuple[int, int, float, str]:
    """(target, running, demand, last decision) of llm.Model."""
    entry = await (await bus.kv(KV_STATUS)).get("llm")
    d = AppStatusView.decode(entry.value).deployments.get("Model") if entry else None
    return (
        (d.target_replicas, d.running_replicas, d.demand, d.last_decision) if d else (-1, -1, 0, "")
    )


async def settled(bus: Bus, n: int) -> bool:
    target, running, demand, _ = await model(bus)
    assert demand == 0.0, "no request was sent: only the custom metric may move the target"
    return target == running == n


async def test_a_custom_metric_alone_scales_replicas_up_and_down(
    fleet: Fleet, server: NatsServer, bus: Bus, tmp_path: Path
) -> None:
    kv_file = tmp_path / "kv_use"
    kv_file.write_text("0.1")
    app = tmp_path / "llm.yaml"
    app.write_text(APP_YAML.format(kv_file=kv_file, policy=KV_POLICY))
    fleet.controller()
    fleet.agent("a1", capacity=4)
    res = cli("deploy", str(app), "--nats", server.url)
    assert res.returncode == 0, res.stderr
    await until(lambda: settled(bus, 1), 30, "one replica running")
    # the cache fills up (no request): 0.9 mean use over a target of 0.6 adds replicas
    kv_file.write_text("0.9")
    await until(lambda: settled(bus, 3), 30, "scaled to max 3 on kv_cache_use")
    *_, decision = await model(bus)
    assert f"policy {KV_POLICY} says" in decision
    # it empties: back to one
    kv_file.write_text("0.05")
    await until(lambda: settled(bus, 1), 30, "back to one replica")


async def test_a_policy_that_does_not_import_is_refused_at_deploy(
    server: NatsServer, bus: Bus, tmp_path: Path
) -> None:
    app = tmp_path / "llm.yaml"
    app.write_text(APP_YAML.format(kv_file=tmp_path / "x", policy="services.examples.nope:policy"))
    res = cli("deploy", str(app), "--nats", server.url)
    assert res.returncode == 2
    assert f"{app}:18:" in res.stderr and "policy.policy_function" in res.stderr
    assert "ModuleNotFoundError" in res.stderr
    assert await (await bus.kv(KV_APPS)).keys() == []

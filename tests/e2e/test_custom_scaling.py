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


STUCK = "tests.integration.misbehaving_policies:spins"


def policy_workers(controller_pid: int) -> set[int]:
    """The controller's children running the policy worker."""
    found = set()
    for task in Path(f"/proc/{controller_pid}/task").iterdir():
        children = (task / "children").read_text().split()
        for pid in map(int, children):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except FileNotFoundError:
                continue
            if b"services.controller.policy_worker" in cmdline:
                found.add(pid)
    return found


def running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def test_a_policy_that_never_returns_is_quarantined_and_others_keep_scaling(
    fleet: Fleet, server: NatsServer, bus: Bus, tmp_path: Path
) -> None:
    """One app's policy spins forever: the controller process keeps scaling the other app on
    its custom metric, quarantines the stuck one (the status says so), and leaves no policy
    worker behind when it stops."""
    kv_file = tmp_path / "kv_use"
    kv_file.write_text("0.1")
    llm, stuck = tmp_path / "llm.yaml", tmp_path / "stuck.yaml"
    llm.write_text(APP_YAML.format(kv_file=kv_file, policy=KV_POLICY))
    stuck.write_text(
        APP_YAML.format(kv_file=tmp_path / "unused", policy=STUCK)
        .replace("name: llm", "name: stuck")
        .replace("/llm", "/stuck")
    )
    controller = fleet.controller()
    fleet.agent("a1", capacity=6)
    for app in (stuck, llm):
        res = cli("deploy", str(app), "--nats", server.url)
        assert res.returncode == 0, res.stderr
    await until(lambda: settled(bus, 1), 60, "one llm replica running")
    kv_file.write_text("0.9")
    await until(lambda: settled(bus, 3), 60, "llm scaled to max 3 while the other policy spins")

    async def quarantined() -> bool:
        entry = await (await bus.kv(KV_STATUS)).get("stuck")
        d = AppStatusView.decode(entry.value).deployments.get("Model") if entry else None
        return d is not None and f"custom policy {STUCK} quarantined" in d.last_decision

    await until(quarantined, 60, "the stuck policy quarantined, said in the status")
    workers = policy_workers(controller.pid)
    assert len(workers) == 1  # the killed ones are gone, one runs
    fleet.stop()
    assert controller.returncode == 0
    assert not any(running(pid) for pid in workers), "a policy worker outlived the controller"


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

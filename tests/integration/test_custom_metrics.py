"""Custom metrics on a real nats-server: replica processes running a deployment with
`record_autoscaling_stats()` push reports, and their values land in the controller's store."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from services.controller.service import ControllerService
from shared.appconfig import AppConfig, DeploymentConfig
from shared.bus import Bus
from shared.subjects import KV_APPS
from tests.integration import test_controller_service as service_tests
from tests.integration.test_controller_service import (
    start_controller,
    stop_controller,
    target_docs,
    wait_for,
)
from tests.procs import ServiceProcesses, replica_args

KV_MODEL = "services.examples.kv_model:KVModel"
bus, procs = service_tests.bus, service_tests.procs  # fixtures, shared


def model_app(kv_file: Path, replicas: int) -> AppConfig:
    d = DeploymentConfig(
        name="Echo",  # target_docs() reads demo.*
        import_path=KV_MODEL,
        init_kwargs={"kv_use_file": str(kv_file)},
        health_check_period_s=0.5,
        health_check_timeout_s=1.0,
        graceful_shutdown_timeout_s=2.0,
        num_replicas=replicas,
    )
    return AppConfig("demo", (d,), route_prefix="/demo", ingress="Echo", version="v1")


async def start_replicas(bus: Bus, procs: ServiceProcesses, url: str, spec: list[str]) -> list[Any]:
    started = []
    for t in await target_docs(bus):
        args = replica_args(
            url, t.replica_id, app="demo", deployment="Echo", import_path=KV_MODEL, extra=spec
        )
        started.append(procs.start(args))
    return started


def summary(svc: ControllerService) -> tuple[float, int] | None:
    m = svc.core.deployments.get(("demo", "Echo"))
    return None if m is None else m.metrics.custom_summary("kv_cache_use")


async def test_custom_values_reach_the_store(
    procs: ServiceProcesses, bus: Bus, nats_url: str, tmp_path: Path
) -> None:
    kv_file = tmp_path / "kv_use"
    kv_file.write_text("0.25")
    await (await bus.kv(KV_APPS)).put("demo", model_app(kv_file, 2).to_json())
    svc, task = await start_controller(nats_url)
    replicas: list[Any] = []
    try:
        assert len(await wait_for(lambda: target_docs(bus))) == 2
        # no --push-metrics: the stats method turns the replicas' own reports on
        spec = [
            "--metrics-interval-s",
            "0.3",
            "--health-check-period-s",
            "0.5",
            "--init-kwargs",
            json.dumps({"kv_use_file": str(kv_file)}),
        ]  # fmt: skip
        replicas = await start_replicas(bus, procs, nats_url, spec)

        async def reached(total: float) -> bool:
            s = summary(svc)
            return s is not None and s[1] == 2 and abs(s[0] - total) < 1e-9

        await wait_for(lambda: reached(0.5), timeout=20)  # two replicas at 0.25 each
        kv_file.write_text("0.75")
        await wait_for(lambda: reached(1.5), timeout=10)  # the store follows the metric
        m = svc.core.deployments[("demo", "Echo")]
        assert m.metrics.custom_names() == ["kv_cache_use"]
        assert m.metrics.total_demand() == 0.0  # no request was sent
    finally:
        for p in replicas:
            p.send_signal(signal.SIGTERM)
        await stop_controller(svc, task)

"""GPU requests placed on real agents: two `fleetpulse agent` processes offering different
numbers of GPUs (`--resource gpus=N`), the controller on a real nats-server, and replica
processes that report the `CUDA_VISIBLE_DEVICES` their agent gave them.
"""

from __future__ import annotations

import asyncio
from typing import Any

from services.router.handle import connect_handle
from shared.appconfig import AppConfig, DeploymentConfig
from shared.bus import Bus
from shared.kv.status import AppStatusView
from shared.kv.targets import ReplicaTarget, app_pattern
from shared.kv.view import DocKV
from shared.subjects import KV_APPS, KV_STATUS, KV_TARGETS
from tests.integration.test_controller_service import bus, procs, start_controller, stop_controller
from tests.procs import ServiceProcesses
from tests.waiting import eventually

WAIT_S = 40.0
MODEL = "tests.integration.devices_app:Devices"
__all__ = ["bus", "procs"]  # fixtures, used by name


def gpu_app(name: str, replicas: int, gpus: float) -> AppConfig:
    d = DeploymentConfig(
        name="Model",
        import_path=MODEL,
        num_replicas=replicas,
        resources={"gpus": gpus},
        health_check_period_s=0.5,
        graceful_shutdown_timeout_s=1.0,
    )
    return AppConfig(name, (d,), route_prefix=f"/{name}", version="v1")


async def targets(bus: Bus, app: str) -> list[ReplicaTarget]:
    docs = DocKV(await bus.kv(KV_TARGETS), ReplicaTarget)
    return [c.doc for c in await docs.snapshot(app_pattern(app)) if c.doc]


async def status(bus: Bus, app: str) -> AppStatusView | None:
    entry = await (await bus.kv(KV_STATUS)).get(app)
    return None if entry is None else AppStatusView.decode(entry.value)


async def answers(bus: Bus, app: str, replicas: int) -> dict[int, dict[str, Any]]:
    """Call the deployment until `replicas` different processes answered: pid -> answer."""
    handle = await connect_handle(app, "Model", bus=bus, deadline_s=10.0)
    seen: dict[int, dict[str, Any]] = {}
    try:

        async def all_answered() -> bool:
            for _ in range(8):
                out = await handle.remote()
                seen[out["pid"]] = out
            return len(seen) >= replicas

        await eventually(all_answered, WAIT_S, f"{replicas} replicas of {app} answering")
    finally:
        await handle.close()
    return seen


async def test_gpu_replicas_are_placed_within_the_agents_offers_and_see_their_devices(
    nats_url: str, bus: Bus, procs: ServiceProcesses
) -> None:
    for agent_id, gpus in (("gpu-a", 1), ("gpu-b", 2)):
        procs.start(["-m", "services.agent", "--nats", nats_url, "--agent-id", agent_id,
                     "--resource", f"gpus={gpus}", "--max-replicas", "4"])  # fmt: skip
    svc, task = await start_controller(nats_url)
    try:
        apps = await bus.kv(KV_APPS)
        await apps.put("ml", gpu_app("ml", 4, 1).to_json())

        async def three_placed() -> list[ReplicaTarget]:
            placed = [t for t in await targets(bus, "ml") if t.agent_id]
            return placed if len(placed) == 3 else []

        placed = await eventually(three_placed, WAIT_S, "3 of 4 GPU replicas placed")
        assert sorted((t.agent_id, t.devices) for t in placed) == [
            ("gpu-a", (0,)), ("gpu-b", (0,)), ("gpu-b", (1,)),
        ]  # fmt: skip

        async def waiting_message() -> str:
            st = await status(bus, "ml")
            message = st.deployments["Model"].message if st else ""
            return message if "cannot be placed" in message else ""

        message = await eventually(waiting_message, WAIT_S, "a status naming the missing GPU")
        assert "gpus 1 free" in message
        seen = await answers(bus, "ml", 3)
        assert sorted((a["agent"], a["cuda"]) for a in seen.values()) == [
            ("gpu-a", "0"), ("gpu-b", "0"), ("gpu-b", "1"),
        ]  # fmt: skip

        # deleting the app frees the devices: a two-GPU replica then fits on gpu-b
        await apps.delete("ml")
        await apps.put("big", gpu_app("big", 1, 2).to_json())
        seen = await answers(bus, "big", 1)
        assert [(a["agent"], a["cuda"]) for a in seen.values()] == [("gpu-b", "0,1")]
    finally:
        await stop_controller(svc, task)
        await asyncio.sleep(0)

"""The wake from zero does not wait for the controller's next tick: on a real nats-server, a
controller ticking once a minute still decides a request queued at zero replicas at once (the
router's cold-start report asks for a tick: core.tick_now), and publishes the replica's member
value as soon as the replica says it is ready, so the held call is answered in seconds."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from services.controller.core import ControllerConfig
from services.controller.service import ControllerService, ServiceConfig
from services.router.handle import connect_handle
from shared.appconfig import AutoscalingConfig
from shared.bus import Bus
from shared.subjects import KV_APPS
from tests.integration.test_controller_service import (
    FakeAgent,
    bus,  # noqa: F401 - a fixture
    echo_app,
    members,
    procs,  # noqa: F401 - a fixture
    target_docs,
    wait_for,
)
from tests.procs import ServiceProcesses

SLOW_TICK_S = 60.0
"""Far longer than the test: only an early tick can decide within it."""


async def test_a_request_queued_at_zero_and_a_ready_replica_are_acted_on_at_once(
    procs: ServiceProcesses,  # noqa: F811
    bus: Bus,  # noqa: F811
    nats_url: str,
) -> None:
    policy = AutoscalingConfig(
        min_replicas=0, max_replicas=1, upscale_delay_s=0.5, downscale_delay_s=600,
        look_back_period_s=1.0, metrics_interval_s=0.5,
    )  # fmt: skip
    await (await bus.kv(KV_APPS)).put("demo", echo_app(autoscaling=policy).to_json())
    svc = ControllerService(
        ServiceConfig(
            nats_url=nats_url,
            core=ControllerConfig(control_interval_s=SLOW_TICK_S),
            rebuild_s=1.0,
        )
    )
    task = asyncio.create_task(svc.run())
    agent = FakeAgent(procs, bus, nats_url)
    try:

        async def ready() -> bool:
            return svc.live and ("demo", "Echo") in svc.core.deployments

        await wait_for(ready, timeout=20)
        ticks = svc.ticks
        handle = await connect_handle("demo", "Echo", bus=bus)
        asked = time.monotonic()
        call = asyncio.create_task(handle.options(method="echo", deadline_s=30).remote("wake"))
        await wait_for(lambda: target_docs(bus), timeout=5, every=0.02)
        decided = time.monotonic() - asked
        await agent.sync()  # starts the replica process

        async def answered() -> Any:
            return call.done()

        await wait_for(answered, timeout=20, every=0.02)
        assert await call == "wake"
        assert await members(bus)
        assert decided < 5 < SLOW_TICK_S
        assert svc.ticks - ticks >= 2  # the decision's tick and the member's tick came early
        await handle.close()
    finally:
        svc._stop.set()
        await asyncio.wait_for(task, 10)  # a stop ends the long wait between ticks at once
        await svc.stop()

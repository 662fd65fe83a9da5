"""A replica that owns handles: its in-process routers carry its health in their reports."""

from __future__ import annotations

import asyncio

from services.replica.config import ReplicaConfig
from services.replica.runtime import ReplicaRuntime
from services.replica.usercode import UserDeployment
from services.router.config import RouterConfig
from services.router.handle import DeploymentHandle
from shared.fakebus import FakeServer
from shared.localhealth import LocalHealthProviders


async def test_in_process_router_reports_carry_the_host_replica_health() -> None:
    server = FakeServer()
    bus = server.connect()
    providers = LocalHealthProviders()
    cfg = ReplicaConfig.of(
        app="front",
        deployment="api",
        import_path="services.examples.echo:Echo",
        replica_id="host-1",
        health_check_period_s=10.0,
    )
    user = await UserDeployment.create(cfg.spec.import_path, (), {})
    rt = ReplicaRuntime(cfg, bus, user, providers=providers)
    await rt.start()
    # the host's user code holds a handle to a downstream deployment of its app
    handle = DeploymentHandle("front", "model", bus=bus, config=RouterConfig(), providers=providers)
    try:
        assert rt.carriage.heartbeat_due(rt.clock.monotonic())  # nothing carried it yet
        report = handle.router.make_report()
        carried = {h.replica_id: h for h in report.health}
        assert carried["host-1"] == rt.carriage.latest
        # the router took it off the box: no heartbeat needed now
        assert not rt.carriage.heartbeat_due(rt.clock.monotonic())
        await rt.stop()
        assert "host-1" not in {h.replica_id for h in handle.router.make_report().health}
    finally:
        await handle.close()
        await bus.close()


async def test_a_broken_provider_does_not_stop_reports() -> None:
    providers = LocalHealthProviders()

    def broken() -> None:
        raise RuntimeError("boom")

    providers.register(broken, app="back")
    bus = FakeServer().connect()
    handle = DeploymentHandle("back", "model", bus=bus, providers=providers)
    try:
        report = handle.router.make_report()
        assert report.health == ()
        assert providers.errors == 1
    finally:
        await handle.close()
        await asyncio.sleep(0)
        await bus.close()

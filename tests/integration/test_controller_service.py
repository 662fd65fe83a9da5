"""The controller service on a real nats-server: deploy via KV, replicas started per fp_targets
(the test plays the node agent), membership for routers, probes, replacement, restart."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from services.controller.core import ControllerConfig
from services.controller.service import ControllerService, ServiceConfig
from services.router.handle import connect_handle
from shared.appconfig import AppConfig, AutoscalingConfig, DeploymentConfig
from shared.bus import Bus
from shared.kv.membership import Member, deployment_pattern
from shared.kv.status import AppStatusView
from shared.kv.targets import ReplicaTarget, app_pattern
from shared.kv.view import DocKV
from shared.natsbus import NatsBus
from shared.subjects import DEFAULT_SUBJECTS, KV_APPS, KV_MEMBERSHIP, KV_STATUS, KV_TARGETS
from tests.procs import ServiceProcesses, replica_args, service_processes

ECHO = "services.examples.echo:Echo"


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    b = await NatsBus.connect(nats_url, name="test")
    yield b
    await b.close()


@pytest.fixture
def procs() -> Any:
    with service_processes() as p:
        yield p


def echo_app(**dep: Any) -> AppConfig:
    d = DeploymentConfig(
        name="Echo",
        import_path=ECHO,
        health_check_period_s=0.5,
        health_check_timeout_s=1.0,
        graceful_shutdown_timeout_s=2.0,
        **dep,
    )
    return AppConfig("demo", (d,), route_prefix="/demo", ingress="Echo", version="v1")


async def start_controller(
    url: str, epoch: int = 1, decode_threads: int = 0
) -> tuple[ControllerService, asyncio.Task[None]]:
    svc = ControllerService(
        ServiceConfig(
            nats_url=url,
            core=ControllerConfig(owner_epoch=epoch),
            rebuild_s=10.0,
            decode_threads=decode_threads,
        )
    )
    task = asyncio.create_task(svc.run())
    return svc, task


async def stop_controller(svc: ControllerService, task: asyncio.Task[None]) -> None:
    svc._stop.set()
    await asyncio.wait_for(task, 10)
    await svc.stop()


async def read(bus: Bus, bucket: str, key: str) -> bytes | None:
    entry = await (await bus.kv(bucket)).get(key)
    return None if entry is None else entry.value


async def target_docs(bus: Bus) -> list[ReplicaTarget]:
    """demo's fp_targets values (one per replica, on any agent), in start order."""
    docs = DocKV(await bus.kv(KV_TARGETS), ReplicaTarget)
    found = [c.doc for c in await docs.snapshot(app_pattern("demo")) if c.doc]
    return sorted(found, key=lambda t: t.order)


async def member_docs(bus: Bus) -> list[Member]:
    """demo.Echo's fp_membership values (one per slot), in start order."""
    docs = DocKV(await bus.kv(KV_MEMBERSHIP), Member)
    found = [c.doc for c in await docs.snapshot(deployment_pattern("demo", "Echo")) if c.doc]
    return sorted(found, key=lambda m: m.order)


async def wait_for(cond: Any, timeout: float = 15.0, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await cond()
        if value:
            return value
        await asyncio.sleep(every)
    raise AssertionError(f"condition not met within {timeout} s")


class FakeAgent:
    """Starts a replica process for every target, stops the ones no longer wanted."""

    def __init__(self, procs: ServiceProcesses, bus: Bus, url: str) -> None:
        self.procs, self.bus, self.url = procs, bus, url
        self.running: dict[str, Any] = {}

    async def sync(self) -> list[str]:
        wanted = [t.replica_id for t in await target_docs(self.bus)]
        for rid in wanted:
            if rid not in self.running:
                extra = ["--health-check-period-s", "0.5", "--graceful-shutdown-timeout-s", "2"]
                self.running[rid] = self.procs.start(
                    replica_args(self.url, rid, app="demo", deployment="Echo", extra=extra)
                )
        for rid in [r for r in self.running if r not in wanted]:
            self.running.pop(rid).send_signal(signal.SIGTERM)
        return wanted


async def members(bus: Bus) -> list[str]:
    return [m.replica_id for m in await member_docs(bus)]


async def status(bus: Bus) -> AppStatusView | None:
    raw = await read(bus, KV_STATUS, "demo")
    return AppStatusView.decode(raw) if raw else None


async def test_deploy_serve_replace_and_restart(
    procs: ServiceProcesses, bus: Bus, nats_url: str
) -> None:
    await (await bus.kv(KV_APPS)).put("demo", echo_app(num_replicas=2).to_json())
    svc, task = await start_controller(nats_url)
    agent = FakeAgent(procs, bus, nats_url)
    try:
        first = await wait_for(agent.sync)
        assert len(first) == 2
        await wait_for(lambda: _eq(members(bus), sorted(first)))
        st = await wait_for(lambda: _status_is(bus, "HEALTHY"))
        assert st.status == "RUNNING" and st.deployments["Echo"].running_replicas == 2

        handle = await connect_handle("demo", "Echo", bus=bus)
        assert await handle.options(method="echo").remote("hi") == "hi"

        # SIGKILL one replica: the controller finds it gone (probe: no responders) and replaces it
        victim = first[0]
        agent.running[victim].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()

        async def replaced() -> list[str] | None:
            ids = await agent.sync()
            return ids if victim not in ids and len(ids) == 2 else None

        await wait_for(replaced, timeout=20)
        detect_s = time.monotonic() - killed_at
        assert detect_s < 10, f"took {detect_s:.1f} s to replace a killed replica"
        await wait_for(lambda: _status_is(bus, "HEALTHY"), timeout=20)
        assert await handle.options(method="echo").remote("still") == "still"
        before = await target_docs(bus)
        epoch_before = max(m.epoch for m in await member_docs(bus))
        assert len({t.slot for t in before}) == 2  # the replacement reused the freed slot
        assert {t.slot for t in before} == {0, 1}
        await handle.close()

        # restart the controller: it keeps the replicas (no restart, no scale-down)
        await stop_controller(svc, task)
        svc, task = await start_controller(nats_url, epoch=2)
        await asyncio.sleep(2.0)
        after = await target_docs(bus)
        assert [(t.replica_id, t.key) for t in after] == [(t.replica_id, t.key) for t in before]
        m = await member_docs(bus)
        assert max(x.epoch for x in m) >= epoch_before and len(m) == 2
        assert {x.replica_id for x in m} == {t.replica_id for t in after}
        st2 = await status(bus)
        assert st2 is not None and st2.deployments["Echo"].status == "HEALTHY"
        assert not any(e for e in svc.core.stats.dropped if e != "unknown_deployment")
    finally:
        await stop_controller(svc, task)


async def test_queued_request_wakes_a_deployment_at_zero(
    procs: ServiceProcesses, bus: Bus, nats_url: str
) -> None:
    policy = AutoscalingConfig(
        min_replicas=0, max_replicas=2, upscale_delay_s=0.5, downscale_delay_s=2.0,
        look_back_period_s=1.0, metrics_interval_s=0.5,
    )  # fmt: skip
    await (await bus.kv(KV_APPS)).put("demo", echo_app(autoscaling=policy).to_json())
    svc, task = await start_controller(nats_url)
    agent = FakeAgent(procs, bus, nats_url)
    try:
        st = await wait_for(lambda: _status_is(bus, "HEALTHY"))
        assert st.deployments["Echo"].target_replicas == 0
        handle = await connect_handle("demo", "Echo", bus=bus)
        call = asyncio.create_task(handle.options(method="echo", deadline_s=30).remote("wake"))
        for _ in range(200):
            await agent.sync()
            if call.done():
                break
            await asyncio.sleep(0.1)
        assert await call == "wake"
        await handle.close()
        # idle again: back to zero
        await wait_for(lambda: _eq(agent.sync(), []), timeout=20)
    finally:
        await stop_controller(svc, task)


async def _eq(coro: Any, want: Any) -> bool:
    got = await coro
    return bool(sorted(got) == sorted(want))


async def _status_is(bus: Bus, dep_status: str) -> AppStatusView | None:
    st = await status(bus)
    if (
        st is not None
        and st.deployments.get("Echo")
        and st.deployments["Echo"].status == dep_status
    ):
        return st
    return None


@pytest.mark.parametrize("decode_threads", [0, 1], ids=["decode-inline", "decode-thread"])
async def test_both_report_formats_aggregate_into_one_demand(
    procs: ServiceProcesses, bus: Bus, nats_url: str, decode_threads: int
) -> None:
    from shared.subjects import DEFAULT_SUBJECTS as S
    from shared.wire import encode
    from shared.wire.columnar import handle_report_to_columnar
    from shared.wire.messages import HandleReport

    await (await bus.kv(KV_APPS)).put("demo", echo_app(num_replicas=2).to_json())
    svc, task = await start_controller(nats_url, decode_threads=decode_threads)
    agent = FakeAgent(procs, bus, nats_url)
    try:
        ids = await wait_for(agent.sync)
        await wait_for(lambda: _status_is(bus, "HEALTHY"))
        subject = S.report("handle", "demo", "Echo")
        for seq in range(1, 30):
            wall = time.time()
            old = HandleReport("h-old", "demo", "Echo", wall, seq, 1.0, {ids[0]: 2.0}, (), 1, {})
            new = HandleReport("h-new", "demo", "Echo", wall, seq, 0.5, {ids[1]: 3.0}, (), 1, {})
            await bus.publish(subject, encode(old))  # msgpack sender
            for part in handle_report_to_columnar(new):  # Arrow sender, same deployment
                await bus.publish(subject, part)
            await bus.publish(subject, b"FPC1 garbage")  # dropped in its place, counted
            await asyncio.sleep(0.1)

        async def demand() -> float | None:
            st = await status(bus)
            d = st.deployments["Echo"].demand if st else None
            return d if d is not None and abs(d - 6.5) < 1e-9 else None

        assert await wait_for(demand, timeout=30) == 6.5  # 2 + 3 running + 1 + 0.5 queued
        ingested = svc.core.stats.ingested
        assert ingested["object_accepted"] > 0 and ingested["columnar_accepted"] > 0
        assert svc.core.stats.dropped["malformed"] > 0
    finally:
        await stop_controller(svc, task)


async def test_a_frozen_replica_is_probed_then_replaced(
    procs: ServiceProcesses, bus: Bus, nats_url: str
) -> None:
    await (await bus.kv(KV_APPS)).put("demo", echo_app(num_replicas=1).to_json())
    svc, task = await start_controller(nats_url)
    agent = FakeAgent(procs, bus, nats_url)
    try:
        (rid,) = await wait_for(agent.sync)
        await wait_for(lambda: _status_is(bus, "HEALTHY"))
        agent.running[rid].send_signal(signal.SIGSTOP)  # alive to TCP, silent to everyone
        try:

            async def replaced() -> list[str] | None:
                ids = await agent.sync()
                return ids if rid not in ids and ids else None

            await wait_for(replaced, timeout=30)
            assert svc.core.stats.probes >= 3  # health stopped: it was probed before the verdict
        finally:
            agent.running.get(rid, procs.procs[0]).send_signal(signal.SIGCONT)
    finally:
        await stop_controller(svc, task)


async def test_routers_report_at_the_deployments_interval_and_follow_a_change(
    procs: ServiceProcesses, bus: Bus, nats_url: str
) -> None:
    """The deployment's metrics_interval_s reaches routers through the member values: a handle
    whose own setting is the 10 s default reports every 0.25 s, and slows down when the
    deployment is redeployed at 4 s."""

    def app_at(interval: float) -> bytes:
        policy = AutoscalingConfig(min_replicas=1, max_replicas=1, metrics_interval_s=interval)
        return echo_app(autoscaling=policy).to_json()

    await (await bus.kv(KV_APPS)).put("demo", app_at(0.25))
    svc, task = await start_controller(nats_url)
    agent = FakeAgent(procs, bus, nats_url)
    sent: list[float] = []

    async def on_report(msg: Any) -> None:
        sent.append(time.monotonic())

    sub = await bus.subscribe(DEFAULT_SUBJECTS.report("handle", "demo", "Echo"), on_report)
    handle = await connect_handle("demo", "Echo", bus=bus)
    try:

        async def member_at(interval: float) -> bool:
            await agent.sync()
            return [m.report_interval_s for m in await member_docs(bus)] == [interval]

        await wait_for(lambda: member_at(0.25), timeout=30)
        router = handle.router
        await wait_for(lambda: _true(router.report_interval_s == 0.25))
        mark = len(sent)
        await wait_for(lambda: _true(len(sent) - mark >= 6), timeout=30)

        await (await bus.kv(KV_APPS)).put("demo", app_at(4.0))
        await wait_for(lambda: member_at(4.0), timeout=30)
        await wait_for(lambda: _true(router.report_interval_s == 4.0))
        mark, since = len(sent), time.monotonic()
        await wait_for(lambda: _true(time.monotonic() - since >= 2.0))
        assert len(sent) - mark <= 1  # at most the one already due when the change came
    finally:
        await handle.close()
        await sub.unsubscribe()
        await stop_controller(svc, task)


async def _true(value: bool) -> bool:
    return value

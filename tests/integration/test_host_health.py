"""A handle-owning replica's own health on a real nats-server with two controller members
(issue 14 item 1): it rides on its in-process router's reports to a deployment of its own app
(one owner per app), it is never both dropped and suppressed for a router to another app (owned by
the other member), and its failing check is acted on."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from services.controller.core import ControllerConfig
from services.controller.group import partition_of
from services.controller.group_shell import KV_LEASES
from services.controller.service import ControllerService, ServiceConfig
from services.replica.config import ReplicaConfig
from services.replica.runtime import ReplicaRuntime
from services.replica.usercode import UserDeployment
from services.router.config import RouterConfig
from services.router.handle import DeploymentHandle
from shared.appconfig import AppConfig, AutoscalingConfig, DeploymentConfig
from shared.bus import Bus, Msg
from shared.kv import envelope
from shared.kv.group import PartitionLease
from shared.kv.targets import ReplicaTarget, app_pattern
from shared.kv.view import DocKV
from shared.localhealth import LocalHealthProviders
from shared.natsbus import NatsBus
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.subjects import KV_APPS, KV_TARGETS
from tests.waiting import eventually

P = 4
ECHO = "services.examples.echo:Echo"
PERIOD = 0.2
REPORT_S = 0.3


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    b = await NatsBus.connect(nats_url, name="test")
    yield b
    await b.close()


def dep(name: str) -> DeploymentConfig:
    return DeploymentConfig(
        name=name,
        import_path=ECHO,
        health_check_period_s=PERIOD,
        health_check_timeout_s=1.0,
        graceful_shutdown_timeout_s=1.0,
        # the deployment's report cadence reaches its routers through the member values
        autoscaling=AutoscalingConfig(min_replicas=1, max_replicas=1, metrics_interval_s=REPORT_S),
    )


async def owners(bus: Bus) -> dict[int, str]:
    kv = await bus.kv(KV_LEASES)
    out: dict[int, str] = {}
    for key in await kv.keys():
        entry = await kv.get(key)
        if entry is not None:
            out[int(key[1:])] = envelope.decode(entry.value, PartitionLease).owner
    return out


async def target(bus: Bus, app: str, deployment: str) -> str | None:
    """The deployment's first replica in start order, as its targets in KV say."""
    docs = DocKV(await bus.kv(KV_TARGETS), ReplicaTarget)
    found = [c.doc for c in await docs.snapshot(app_pattern(app)) if c.doc]
    ids = [t.replica_id for t in sorted(found, key=lambda t: t.order) if t.deployment == deployment]
    return ids[0] if ids else None


class Replicas:
    """Plays the node agent, in process: one ReplicaRuntime per target."""

    def __init__(self, bus: Bus, tmp: Path) -> None:
        self.bus, self.tmp = bus, tmp
        self.providers = LocalHealthProviders()
        self.running: list[ReplicaRuntime] = []

    async def start(self, app: str, deployment: str, rid: str) -> ReplicaRuntime:
        cfg = ReplicaConfig.of(
            app=app,
            deployment=deployment,
            import_path=ECHO,
            replica_id=rid,
            health_check_period_s=PERIOD,
            health_check_timeout_s=1.0,
            init_kwargs={"fail_health_file": str(self.tmp / f"{rid}.fail")},
        )
        user = await UserDeployment.create(
            cfg.spec.import_path, cfg.spec.init_args, dict(cfg.spec.init_kwargs)
        )
        rt = ReplicaRuntime(cfg, self.bus, user, providers=self.providers)
        await rt.start()
        self.running.append(rt)
        return rt

    async def stop_all(self) -> None:
        for rt in self.running:
            with contextlib.suppress(Exception):
                await rt.stop()


async def test_host_health_rides_to_its_owner_and_is_never_both_lost_and_suppressed(
    bus: Bus, nats_url: str, tmp_path: Path
) -> None:
    members = [
        ControllerService(
            ServiceConfig(
                nats_url=nats_url,
                core=ControllerConfig(member_id=m),
                partitions=P,
                rebuild_s=2.0,
                probe_timeout_s=0.5,
            )
        )
        for m in ("m1", "m2")
    ]
    tasks = [asyncio.create_task(m.run()) for m in members]
    replicas = Replicas(bus, tmp_path)
    handles: list[DeploymentHandle] = []
    beats: dict[str, int] = {}

    async def on_beat(msg: Msg) -> None:
        beats[msg.subject] = beats.get(msg.subject, 0) + 1

    try:

        async def split() -> dict[int, str] | None:
            got = await owners(bus)
            return got if len(got) == P and set(got.values()) == {"m1", "m2"} else None

        owned = await eventually(split, 30, "two members sharing the partitions")
        home = next(f"home{k}" for k in range(1000) if owned[partition_of(f"home{k}", P)] == "m1")
        away = next(f"away{k}" for k in range(1000) if owned[partition_of(f"away{k}", P)] == "m2")
        apps = await bus.kv(KV_APPS)
        await apps.put(home, AppConfig(home, (dep("Front"), dep("Model")), version="v1").to_json())
        await apps.put(away, AppConfig(away, (dep("Other"),), version="v1").to_json())
        ids: dict[tuple[str, str], str] = {}
        for key in ((home, "Front"), (home, "Model"), (away, "Other")):
            ids[key] = await eventually(lambda k=key: target(bus, *k), 30, f"target {key}")  # type: ignore[misc]
            await replicas.start(*key, ids[key])
        front = replicas.running[0]
        await bus.subscribe(S.report("heartbeat", home, "Front") + ".*", on_beat)

        # the host's user code holds handles to a sibling deployment and to another app
        cfg = RouterConfig(metrics_interval_s=REPORT_S)
        for app, d in ((home, "Model"), (away, "Other")):
            handles.append(
                DeploymentHandle(app, d, bus=bus, config=cfg, providers=replicas.providers)
            )
            await handles[-1].router.start()
        hb_subject = S.report("heartbeat", home, "Front", front.cfg.replica_id)

        async def window(seconds: float) -> dict[str, Any]:
            r0 = [h.router.reports_sent for h in handles]
            b0, p0 = beats.get(hb_subject, 0), front.stats.probes
            await asyncio.sleep(seconds)  # a measurement window, not a wait for a condition
            return {
                "reports": [h.router.reports_sent - r for h, r in zip(handles, r0, strict=True)],
                "heartbeats": beats.get(hb_subject, 0) - b0,
                "probes": front.stats.probes - p0,
            }

        await eventually(lambda: all(h.router.reports_sent >= 3 for h in handles), 15)
        riding = await window(5.0)
        print("both handles", riding)
        assert min(riding["reports"]) >= 5  # both routers reported all along
        assert riding["heartbeats"] == 0 and riding["probes"] == 0, riding

        # only the router to the other app is left: it must not take the host's health
        await handles.pop(0).close()
        alone = await window(5.0)
        print("other app only", alone)
        assert alone["reports"][0] >= 5
        assert alone["heartbeats"] >= 3 and alone["probes"] == 0, alone

        # the host's check fails: the controller that owns it replaces it
        (tmp_path / f"{ids[(home, 'Front')]}.fail").touch()
        handles.insert(0, DeploymentHandle(home, "Model", bus=bus, config=cfg))
        started = time.monotonic()

        async def replaced() -> bool:
            return await target(bus, home, "Front") not in (None, ids[(home, "Front")])

        await eventually(replaced, 30, "the failing host replaced")
        print(f"replaced {time.monotonic() - started:.1f} s after the first failed check")
    finally:
        for h in handles:
            await h.close()
        await replicas.stop_all()
        for m in members:
            m._stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 15)
        for m in members:
            await m.stop()

"""A fleet under the auth callout: controller, agent and router log in as their roles, the agent
mints each replica its own credential, and two apps serve side by side. A report forged by A's
replica (with A's real credential) aimed at B changes nothing in B's demand; the same report
from a role allowed to send it does, so the check can see a change.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import shared.natsauth
from services.agent.config import AgentConfig
from services.agent.service import AgentService
from services.controller.core import ControllerConfig
from services.controller.service import ControllerService, ServiceConfig
from services.router.handle import connect_handle
from shared.appconfig import AppConfig, DeploymentConfig
from shared.natsauth import NatsAuth
from shared.subjects import KV_APPS, Subjects
from shared.wire import encode
from shared.wire.messages import ReplicaReport
from tests.integration.authcallout import Callout, callout_server
from tests.waiting import eventually

pytestmark = pytest.mark.integration
S = Subjects()
WAIT_S = 30.0


def echo_app(name: str) -> AppConfig:
    d = DeploymentConfig(
        name="Echo",
        import_path="services.examples.echo:Echo",
        health_check_period_s=0.5,
        graceful_shutdown_timeout_s=2.0,
    )
    return AppConfig(name, (d,), route_prefix=f"/{name}", ingress="Echo", version="v1")


@pytest.fixture
async def callout(tmp_path: Path) -> AsyncIterator[Callout]:
    async for c in callout_server(tmp_path):
        yield c


def demand(ctl: ControllerService, app: str) -> float:
    m = ctl.core.deployments.get((app, "Echo"))
    return -1.0 if m is None else float(m.metrics.total_demand())


async def test_fleet_serves_and_ignores_a_forged_report(
    callout: Callout, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    controller_auth = NatsAuth(user="controller", password=callout.passwords["controller"])
    monkeypatch.setattr(shared.natsauth, "_process_auth", controller_auth)
    ctl = ControllerService(
        ServiceConfig(nats_url=callout.server.url, core=ControllerConfig(), rebuild_s=2.0)
    )
    ctl_task = asyncio.create_task(ctl.run())
    operator = await callout.role("operator")
    for app in ("A", "B"):
        await (await operator.kv(KV_APPS)).put(app, echo_app(app).to_json())
    agent_bus = await callout.role("agent")
    agent = AgentService(
        AgentConfig(
            nats_url=callout.server.url,
            agent_id="ag",
            log_dir=str(tmp_path / "logs"),
            replica_key=callout.replica_key,
        ),
        bus=agent_bus,
    )
    agent_task = asyncio.create_task(agent.run())
    router = await callout.role("router")
    handles = []
    try:
        for app in ("A", "B"):
            h = await connect_handle(app, "Echo", bus=router, ready_timeout_s=WAIT_S)
            handles.append(h)
            reply = await asyncio.wait_for(h.options(method="echo").remote(f"hi {app}"), WAIT_S)
            assert reply == f"hi {app}"
        rid_a = next(r for r, c in agent.children.items() if c.target.app == "A")
        rid_b = next(r for r, c in agent.children.items() if c.target.app == "B")
        # each replica's log shows no refusal by the server
        for log in (tmp_path / "logs").glob("*.log"):
            assert "ermissions violation" not in log.read_text(), log.name

        await eventually(lambda: demand(ctl, "B") == 0.0, within_s=WAIT_S, what="B idle")
        # A's process, credential in hand, claims B's replica is swamped
        stolen = await callout.replica("A", "Echo", rid_a)
        forged = ReplicaReport(rid_b, time.time(), 10**6, 500.0, {})
        await stolen.publish(S.report("replica", "B", "Echo"), encode(forged))
        await stolen.flush()
        await eventually(lambda: stolen.permission_violations >= 1, what="the server refusing it")
        await asyncio.sleep(1.0)
        assert demand(ctl, "B") == 0.0

        # the same report from a role that may send it moves B's demand: the check can see it
        await operator.publish(S.report("replica", "B", "Echo"), encode(forged))
        await eventually(lambda: demand(ctl, "B") > 0, within_s=WAIT_S, what="B's demand moving")
    finally:
        for h in handles:
            await h.close()
        agent.stop()
        await asyncio.wait_for(agent_task, WAIT_S)
        ctl._stop.set()
        await asyncio.wait_for(ctl_task, WAIT_S)
        await ctl.stop()
    assert agent.creds is not None and not agent.creds.dir.exists()  # no credential left behind

"""The agent's replica gauges follow its children (a stand-in interpreter that just sleeps)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import REGISTRY

from services.agent.config import AgentConfig
from services.agent.service import AgentService
from shared.appconfig import DeploymentConfig
from shared.kv import envelope
from shared.kv.targets import ReplicaTarget

AGENT = "metered-agent"


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def targets(*replica_ids: str) -> list[ReplicaTarget]:
    config = DeploymentConfig(name="dep", import_path="m:X", graceful_shutdown_timeout_s=5.0)
    return [
        ReplicaTarget("app", "dep", rid, AGENT, slot, slot + 1, "v1", "", config.replica_spec())
        for slot, rid in enumerate(replica_ids)
    ]


async def test_replicas_running_per_agent(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nexec sleep 30\n")
    python.chmod(0o755)
    cfg = AgentConfig(
        nats_url="nats://unused",
        agent_id=AGENT,
        max_replicas=3,
        workdir=str(tmp_path),
        log_dir=str(tmp_path / "logs"),
        python=str(python),
    )
    starts = value("fleetpulse_agent_replica_starts_total")
    stops = value("fleetpulse_agent_replica_stops_total")
    agent = AgentService(cfg)
    assert value("fleetpulse_agent_replicas_running", agent=AGENT) == 0
    assert value("fleetpulse_agent_capacity", agent=AGENT) == 3
    for t in targets("r-1", "r-2"):
        agent._on_targets(t.key, envelope.encode(t))
    agent._synced = True
    try:
        await agent._reconcile()
        assert value("fleetpulse_agent_replicas_running", agent=AGENT) == 2
        assert value("fleetpulse_agent_replica_starts_total") - starts == 2
    finally:
        agent.stop()
        await agent._drain()  # SIGTERM: the stand-ins exit at once
    assert value("fleetpulse_agent_replicas_running", agent=AGENT) == 0
    assert value("fleetpulse_agent_replica_stops_total") - stops == 2

"""The controller reads what agents say of a deployment's runtime_env (fp_agents `environments`)
into its status message: preparing while it waits, the installer's error line once it failed."""

from __future__ import annotations

from typing import Any

from services.controller.core import PutStatus
from shared.kv.agents import AgentInfo, EnvNote
from tests.unit.test_controller_core import Sim, app_with

ERROR = "runtime_env: pip install failed: ERROR: Could not find a version that satisfies x==9"


def agent(notes: tuple[EnvNote, ...] = ()) -> AgentInfo:
    return AgentInfo("a", 4, 0, "host", 1, 0.0, environments=notes)


def message(sim: Sim) -> Any:
    statuses = [a.value for a in sim.actions if isinstance(a, PutStatus)]
    return statuses[-1].deployments["Model"]


def test_the_status_says_an_agent_prepares_then_names_the_installer_error() -> None:
    sim = Sim(app_with(num_replicas=1))
    sim.core.on_agent(agent(), sim.t)
    sim.tick()
    building = EnvNote("shop.Model", "preparing", 0.0, "building its Python environment (x==9)")
    sim.core.on_agent(agent((building,)), sim.t)
    sim.tick()
    d = message(sim)
    assert d.status == "UPDATING"
    assert d.message.endswith("; runtime_env on agent a: building its Python environment (x==9)")

    sim.core.on_agent(agent((EnvNote("shop.Model", "failed", 1.0, ERROR),)), sim.t)
    for _ in range(3):  # the agent fails each start at once (exit 126)
        (rid,) = sim.target_ids()
        sim.lifecycle(rid, "exited")
        sim.tick()
    d = message(sim)
    assert d.status == "DEPLOY_FAILED"
    assert (
        d.message == f"3 replicas in a row failed to start: runtime_env failed on agent a: {ERROR}"
    )

    sim.core.on_agent(agent(), sim.t)  # the note aged out: the message no longer claims it
    sim.core.agent_gone("a")
    sim.tick()
    assert "runtime_env" not in message(sim).message

"""The controller reads what agents say of a deployment's runtime_env (fp_agents `environments`)
into its status message: preparing while it waits, the installer's error line once it failed."""

from __future__ import annotations

from typing import Any

from services.controller.core import ControllerConfig, ControllerCore, PutStatus
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


PREPARING = EnvNote("shop.Model", "preparing", 0.0, "building its Python environment (x==1)")


def _after(sim: Sim, seconds: float) -> None:
    """The fake clock jumps `seconds` on, with one tick at the end (and one half-way)."""
    for _ in range(2):
        sim.t += seconds / 2 - 0.1
        sim.tick()


def _start_timeouts(sim: Sim) -> list[Any]:
    return [a for a in sim.actions if getattr(a, "kind", "") == "start_timeout"]


def test_the_start_timeout_runs_from_the_end_of_preparation_not_the_placement() -> None:
    sim = Sim(app_with(num_replicas=1))
    sim.core.on_agent(agent(), sim.t)
    sim.tick()
    (rid,) = sim.target_ids()
    sim.core.on_agent(agent((PREPARING,)), sim.t)
    _after(sim, 300.0)  # an install of five minutes: longer than the 120 s start timeout
    assert sim.target_ids() == [rid] and _start_timeouts(sim) == []
    assert sim.status["Model"] == "UPDATING"
    sim.core.on_agent(agent(), sim.t)  # prepared: the agent spawns the replica
    _after(sim, 100.0)  # the start clock runs from the end of the preparation
    assert sim.target_ids() == [rid] and _start_timeouts(sim) == []
    sim.lifecycle(rid, "starting")
    sim.lifecycle(rid, "ready")
    sim.tick()
    assert sim.status["Model"] == "HEALTHY" and _start_timeouts(sim) == []


def test_a_replica_that_never_starts_after_its_preparation_still_times_out() -> None:
    sim = Sim(app_with(num_replicas=1))
    sim.core.on_agent(agent(), sim.t)
    sim.tick()
    (rid,) = sim.target_ids()
    sim.core.on_agent(agent((PREPARING,)), sim.t)
    _after(sim, 300.0)
    sim.core.on_agent(agent(), sim.t)
    _after(sim, 121.0)
    assert [a.replica_id for a in _start_timeouts(sim)] == [rid]


def test_a_deployment_prepared_past_its_bound_is_deploy_failed_with_the_reason() -> None:
    sim = Sim(app_with(num_replicas=1), ControllerCore(ControllerConfig(prepare_timeout_s=600.0)))
    sim.core.on_agent(agent(), sim.t)
    sim.tick()
    sim.core.on_agent(agent((PREPARING,)), sim.t)
    _after(sim, 590.0)
    assert sim.status["Model"] == "UPDATING"
    _after(sim, 20.0)
    d = message(sim)
    assert d.status == "DEPLOY_FAILED"
    assert d.message.startswith("runtime_env still being prepared on agent a after 6")
    assert d.message.endswith("(--prepare-timeout-s 600)")
    assert sim.target_ids() == []  # no retry in a loop: a redeploy (new version) resets
    _after(sim, 200.0)
    assert sim.target_ids() == [] and message(sim).status == "DEPLOY_FAILED"

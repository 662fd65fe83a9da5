"""Spare replica processes (services/agent/spare.py, services/replica/spare.py) on a real
nats-server: a replica started in a spare is the spare's process and runs as a cold start would
(its own environment, working directory, PYTHONPATH, log file); where a spare cannot start it
the same way, the replica is a cold start; nothing is left running."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from services.agent.procs import ChildProcesses, child_env
from services.agent.spare import RETRY_AFTER_S, Spares
from shared.bus import Bus
from shared.natsbus import NatsBus
from tests.integration.spare_app import OUT_ENV
from tests.procs import ROOT, replica_args, wait_for_replica
from tests.waiting import eventually

APP = "tests.integration.spare_app:Where"
WAIT_S = 30.0


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    b = await NatsBus.connect(nats_url, name="test")
    yield b
    await b.close()


@pytest.fixture
def procs(tmp_path: Path) -> Any:
    base = child_env(
        {**os.environ, "FP_SPARE_TEST_AGENT_ONLY": "agent", "PYTHONPATH": str(ROOT)}, []
    )
    spares = Spares(
        python=sys.executable, cwd=str(ROOT), env=base, log_path=tmp_path / "logs" / "spare.log",
        refill_after_s=0.0,
    )  # fmt: skip
    p = ChildProcesses(cwd=str(ROOT), env=base, log_dir=tmp_path / "logs", spares=spares)
    try:
        yield p
    finally:
        p.kill_all()


def proc_state(pid: int) -> tuple[str, bool]:
    """(state letter, waiting on a pipe) of a process; ("gone", False) once reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except FileNotFoundError:
        return "gone", False
    return stat[0], "pipe" in wchan


def cmdline_of(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().rstrip("\0").split("\0")


def argv(nats_url: str, rid: str) -> list[str]:
    return [sys.executable, *replica_args(nats_url, rid, import_path=APP)]


async def spare_ready(procs: ChildProcesses) -> int:
    """The pid of a spare that has done its imports (it is blocked reading its order)."""
    assert procs.spares is not None
    procs.spares.refill(time.monotonic())
    (pid,) = procs.spares.pids()

    async def blocked_on_stdin() -> bool:
        return proc_state(pid) == ("S", True)

    await eventually(blocked_on_stdin, within_s=WAIT_S, every_s=0.05)
    return pid


async def test_a_replica_starts_in_the_spare_as_a_cold_start_would(
    procs: ChildProcesses, bus: Bus, nats_url: str, tmp_path: Path
) -> None:
    spare_pid = await spare_ready(procs)
    out = tmp_path / "where.json"
    env = {OUT_ENV: str(out), "FP_SPARE_TEST_MARKER": "mine"}
    pid = procs.start("r-spare-1", argv(nats_url, "r-spare-1"), "r-spare-1", env)
    assert pid == spare_pid  # the spare became the replica
    await wait_for_replica(bus, "r-spare-1", WAIT_S)
    seen = json.loads(out.read_text())
    assert seen["pid"] == spare_pid
    assert seen["marker"] == "mine"  # the replica's own environment...
    assert seen["agent_only"] == "agent"  # ...over the agent's child environment
    assert seen["cwd"] == str(ROOT)
    assert seen["path"][:2] == [str(ROOT), str(ROOT)]  # `python -m` here, then PYTHONPATH
    assert cmdline_of(pid) == argv(nats_url, "r-spare-1")  # as a cold start's: ps, tools
    log = (tmp_path / "logs" / "r-spare-1.log").read_text()
    assert "spare_app: constructed" in log and "ready" in log
    assert procs.spares is not None and procs.spares.taken == 1
    procs.spares.refill(time.monotonic())
    assert len(procs.spares.pids()) == 1 and spare_pid not in procs.spares.pids()


@pytest.mark.parametrize(
    "change",
    [{"PYTHONOPTIMIZE": "1"}, {"python": "python3"}, {"PYTHONPATH": "extra"}, {"cwd": "work"}],
    ids=["python-startup-variable", "other-interpreter", "import-roots", "working-dir"],
)
async def test_a_replica_the_spare_cannot_start_the_same_way_is_a_cold_start(
    procs: ChildProcesses, bus: Bus, nats_url: str, tmp_path: Path, change: dict[str, str]
) -> None:
    spare_pid = await spare_ready(procs)
    out = tmp_path / "where.json"
    cmd = argv(nats_url, "r-cold-1")
    env = {OUT_ENV: str(out)}
    cwd = None
    if "python" in change:  # another name (a runtime_env's own interpreter): not the spare's
        cmd[0] = str(Path(sys.executable).with_name(change["python"]))
        assert cmd[0] != sys.executable
    elif "PYTHONPATH" in change:  # a runtime_env's py_modules: they must shadow what is installed
        env["PYTHONPATH"] = procs.pythonpath([str(tmp_path / change["PYTHONPATH"])])
    elif "cwd" in change:  # a runtime_env's working_dir: first on sys.path, the same
        (tmp_path / change["cwd"]).mkdir()
        cwd = str(tmp_path / change["cwd"])
    else:
        env.update(change)
    pid = procs.start("r-cold-1", cmd, "r-cold-1", env, cwd=cwd)
    assert pid != spare_pid
    assert procs.spares is not None and procs.spares.pids() == [spare_pid]  # still spare
    await wait_for_replica(bus, "r-cold-1", WAIT_S)
    assert json.loads(out.read_text())["pid"] == pid


async def test_a_spare_that_died_is_passed_over_and_close_leaves_nothing(
    procs: ChildProcesses, bus: Bus, nats_url: str, tmp_path: Path
) -> None:
    spare_pid = await spare_ready(procs)
    os.kill(spare_pid, 9)
    await asyncio.sleep(0.1)
    env = {OUT_ENV: str(tmp_path / "where.json")}
    pid = procs.start("r-after", argv(nats_url, "r-after"), "r-after", env)
    assert pid != spare_pid
    await wait_for_replica(bus, "r-after", WAIT_S)
    assert procs.spares is not None
    procs.spares.refill(time.monotonic())
    (new_spare,) = procs.spares.pids()
    procs.kill_all()
    assert procs.spares.pids() == []
    for gone in (pid, new_spare):
        assert proc_state(gone)[0] in ("gone", "Z")


def test_a_spare_that_cannot_start_is_retried_after_a_pause_not_in_a_loop(tmp_path: Path) -> None:
    spares = Spares(
        python="/bin/false", cwd=str(ROOT), env={}, log_path=tmp_path / "spare.log",
        refill_after_s=0.0,
    )  # fmt: skip
    try:
        spares.refill(100.0)
        (first,) = spares.pids()
        eventually_sync(lambda: proc_state(first)[0] in ("Z", "gone"))
        spares.refill(100.1)  # died unused: dropped, and no new one yet
        assert spares.pids() == [] and spares.died == 1
        spares.refill(100.0 + RETRY_AFTER_S - 0.1)
        assert spares.pids() == []
        spares.refill(100.2 + RETRY_AFTER_S)
        assert len(spares.pids()) == 1
    finally:
        spares.close()


def eventually_sync(cond: Any, within_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + within_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.02)


async def test_the_agent_starts_a_wake_in_its_spare_and_counts_it(
    bus: Bus, nats_url: str, tmp_path: Path
) -> None:
    from prometheus_client import REGISTRY

    from services.agent.config import AgentConfig
    from services.agent.service import AgentService
    from shared.subjects import KV_TARGETS
    from tests.integration.test_agent import put_targets

    def spare_starts() -> float:
        return REGISTRY.get_sample_value("fleetpulse_agent_replica_spare_starts_total") or 0.0

    targets = await bus.kv(KV_TARGETS)  # the controller's bucket, which the agent watches
    agent = AgentService(
        AgentConfig(nats_url=nats_url, agent_id="ag-spare", log_dir=str(tmp_path), spare_replicas=1)
    )
    task = asyncio.create_task(agent.run())
    try:
        # no target yet: the agent has started its spare, which imports and waits
        await eventually(lambda: agent.procs.spares is not None and agent.procs.spares.pids())
        spare_pid = await spare_ready(agent.procs)
        before = spare_starts()
        await put_targets(targets, [("r-woken", "ag-spare")])
        await wait_for_replica(bus, "r-woken", WAIT_S)
        assert agent.pid("r-woken") == spare_pid
        assert spare_starts() == before + 1
    finally:
        agent.stop()
        await asyncio.wait_for(task, WAIT_S)
    assert agent.procs.spares is not None and agent.procs.spares.pids() == []  # retired
    assert proc_state(spare_pid)[0] in ("gone", "Z")

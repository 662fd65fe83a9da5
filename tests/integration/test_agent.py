"""The node agent against a real nats-server, running real replica processes.

Targets are written to KV by the test (the controller's job in production).
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from services.agent.config import AgentConfig, machine_resources
from services.agent.service import AgentService
from shared.appconfig import DeploymentConfig
from shared.bus import KV, Bus, Msg
from shared.errors import BusTimeout, NoResponders
from shared.kv.agents import AgentInfo
from shared.kv.targets import ReplicaTarget, app_pattern
from shared.kv.view import DocKV
from shared.natsbus import NatsBus
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.subjects import KV_AGENTS, KV_TARGETS
from shared.wire import decode_as
from shared.wire.messages import Lifecycle
from tests.procs import ServiceProcesses, service_processes, wait_for_replica
from tests.waiting import eventually as _eventually

ME = "agent-test"
CONFIG = DeploymentConfig(
    name="dep",
    import_path="services.examples.echo:Echo",
    health_check_period_s=0.5,
    graceful_shutdown_timeout_s=2.0,
)
WAIT_S = 20.0
eventually = functools.partial(_eventually, within_s=WAIT_S, every_s=0.05)


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    b = await NatsBus.connect(nats_url, name="test")
    yield b
    await b.close()


@pytest.fixture
def procs() -> Iterator[ServiceProcesses]:
    with service_processes() as p:
        yield p


class Events:
    """Every Lifecycle message of app.dep, in arrival order."""

    def __init__(self) -> None:
        self.items: list[Lifecycle] = []

    async def on_msg(self, msg: Msg) -> None:
        self.items.append(decode_as(msg.data, Lifecycle))

    def of(self, replica_id: str, state: str) -> list[Lifecycle]:
        return [e for e in self.items if e.replica_id == replica_id and e.state == state]


@pytest.fixture
async def events(bus: Bus) -> Events:
    ev = Events()
    # the agent's events name no replica in the subject; the replica's own name it
    await bus.subscribe(S.report("lifecycle", "app", "dep"), ev.on_msg)
    await bus.subscribe(S.report("lifecycle", "app", "dep") + ".*", ev.on_msg)
    await bus.flush()
    return ev


async def put_targets(
    kv: KV, replicas: list[tuple[str, str]], config: DeploymentConfig = CONFIG
) -> None:
    """Make `replicas` (id, agent; in start order) the targets of app.dep, as the controller's
    writes add up to: one key per replica, a replica keeps its slot, keys of replicas no longer
    listed (or moved to another agent) are deleted, new ones take the lowest free slot."""
    docs = DocKV(kv, ReplicaTarget)
    current = {c.doc.replica_id: c.doc for c in await docs.snapshot(app_pattern("app")) if c.doc}
    wanted = dict(replicas)
    for rid, t in current.items():
        if wanted.get(rid) != t.agent_id:
            await docs.delete(t.key)
    slots = {rid: t.slot for rid, t in current.items() if wanted.get(rid) == t.agent_id}
    spec = config.replica_spec()
    for order, (rid, agent) in enumerate(replicas, start=1):
        if rid not in slots:
            slots[rid] = min(set(range(len(replicas) + len(slots))) - set(slots.values()))
        t = ReplicaTarget("app", "dep", rid, agent, slots[rid], order, "v1", "", spec, 1)
        await docs.put(t.key, t)


async def gone(bus: Bus, replica_id: str) -> bool:
    """Nobody subscribes to the replica's probe subject (a timeout proves nothing)."""
    try:
        await bus.request(S.probe(replica_id), b"", timeout=0.5)
    except NoResponders:
        return True
    except BusTimeout:
        pass
    return False


async def agent_entry(bus: Bus, agent_id: str) -> AgentInfo | None:
    entry = await (await bus.kv(KV_AGENTS)).get(agent_id)
    return AgentInfo.decode(entry.value) if entry is not None else None


async def registered(bus: Bus, running: int, agent_id: str = ME) -> AgentInfo | None:
    info = await agent_entry(bus, agent_id)
    return info if info is not None and info.running == running else None


def alive(pid: int) -> bool:
    """Running (a zombie no parent reaped yet counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def children_of(ppid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[1]) == ppid and fields[0] != "Z":
                out.append(int(entry.name))
    return out


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_agent_runs_stops_and_reports_its_replicas(
    bus: Bus, events: Events, nats_url: str, tmp_path: Path
) -> None:
    targets = await bus.kv(KV_TARGETS)
    # capacity 2, three assigned: r-x waits; r-o belongs to another agent
    await put_targets(targets, [("r-a", ME), ("r-o", "other"), ("r-b", ME), ("r-x", ME)])
    starts0 = metric("fleetpulse_agent_replica_starts_total")
    crashes0 = metric("fleetpulse_agent_replica_exits_total", code="-9")
    cfg = AgentConfig(
        nats_url=nats_url, agent_id=ME, max_replicas=2, log_dir=str(tmp_path), kill_margin_s=1.0
    )
    agent = AgentService(cfg)
    task = asyncio.create_task(agent.run())
    pids: dict[str, int] = {}
    try:
        for rid in ("r-a", "r-b"):
            await wait_for_replica(bus, rid, timeout=WAIT_S)
            pid = agent.pid(rid)
            assert pid is not None
            pids[rid] = pid
        assert set(agent.children) == {"r-a", "r-b"}
        info = await eventually(lambda: registered(bus, running=2))
        assert (info.agent_id, info.capacity, info.pid) == (ME, 2, os.getpid())

        # r-b leaves the targets: SIGTERM, it drains and exits 0; its slot goes to r-x
        await put_targets(targets, [("r-a", ME), ("r-o", "other"), ("r-x", ME)])
        await eventually(lambda: any(e.exit_code == 0 for e in events.of("r-b", "exited")))
        await eventually(lambda: not alive(pids["r-b"]))
        await wait_for_replica(bus, "r-x", timeout=WAIT_S)
        pids["r-x"] = agent.pid("r-x") or 0
        await eventually(lambda: gone(bus, "r-b"))
        assert "r-b" not in agent.children  # forgotten once exited and unwanted
        assert "ready on" in (tmp_path / "app.dep.r-x.log").read_text()

        # a crash (SIGKILL) is reported with the signal, and the agent does not restart it
        os.kill(pids["r-a"], signal.SIGKILL)
        crash = await eventually(lambda: events.of("r-a", "exited"))
        assert crash[0].exit_code == -signal.SIGKILL and crash[0].agent_id == ME
        assert crash[0].rpc_subject == S.rpc("app", "dep", "r-a") and crash[0].version == "v1"
        ticks = agent.ticks
        await eventually(lambda: agent.ticks >= ticks + 5)
        assert agent.children["r-a"].exited and agent.pid("r-a") is None
        # started once: the agent's report of the spawn, then the replica's own (the first
        # to "ready" is the start time the what-if model reads)
        starts = events.of("r-a", "starting")
        assert len(starts) == 2 and starts[0].at <= starts[1].at
        assert starts[0].at <= events.of("r-a", "ready")[0].at
        await eventually(lambda: gone(bus, "r-a"))
        assert set(agent.procs.pids()) == {"r-x"}
        assert metric("fleetpulse_agent_replica_starts_total") - starts0 == 3
        assert metric("fleetpulse_agent_replica_exits_total", code="-9") - crashes0 == 1
    finally:
        agent.stop()
        await asyncio.wait_for(task, WAIT_S)

    # stopping the agent drains what it runs and unregisters it
    assert [p for p in pids.values() if alive(p)] == []
    await eventually(lambda: any(e.exit_code == 0 for e in events.of("r-x", "exited")))
    assert await agent_entry(bus, ME) is None


def agent_args(nats_url: str, agent_id: str, log_dir: Path) -> list[str]:
    return [
        "-m",
        "services.agent",
        "--nats",
        nats_url,
        "--agent-id",
        agent_id,
        "--max-replicas",
        "1",
        "--resource",
        "gpus=2",
        "--log-dir",
        str(log_dir),
        "--kill-margin-s",
        "1",
        "--spare-replicas",  # the process tree is the replica alone (test_spare_replicas.py)
        "0",
    ]


async def start_agent_process(
    procs: ServiceProcesses, bus: Bus, nats_url: str, tmp_path: Path, agent_id: str, rid: str
) -> tuple[Any, int]:
    await put_targets(await bus.kv(KV_TARGETS), [(rid, agent_id)])
    proc = procs.start(agent_args(nats_url, agent_id, tmp_path), log=tmp_path / "agent.log")
    await wait_for_replica(bus, rid, timeout=WAIT_S)
    kids = await eventually(lambda: children_of(proc.pid))
    assert len(kids) == 1
    return proc, kids[0]


async def test_agent_process_drains_and_unregisters_on_sigterm(
    procs: ServiceProcesses, bus: Bus, events: Events, nats_url: str, tmp_path: Path
) -> None:
    proc, child = await start_agent_process(procs, bus, nats_url, tmp_path, "ag-term", "r-t")
    info = await eventually(lambda: registered(bus, running=1, agent_id="ag-term"))
    assert info.capacity == 1 and info.pid == proc.pid
    assert info.resources == {**machine_resources(), "gpus": 2.0}  # the machine's cpus, memory
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(proc.wait, WAIT_S) == 0
    assert not alive(child)
    assert any(e.exit_code == 0 for e in events.of("r-t", "exited"))
    assert await agent_entry(bus, "ag-term") is None


async def test_replicas_die_with_a_killed_agent(
    procs: ServiceProcesses, bus: Bus, nats_url: str, tmp_path: Path
) -> None:
    proc, child = await start_agent_process(procs, bus, nats_url, tmp_path, "ag-kill", "r-k")
    proc.kill()
    await asyncio.to_thread(proc.wait, WAIT_S)
    await eventually(lambda: not alive(child))
    await eventually(lambda: gone(bus, "r-k"))


STUBBORN = """
import os, pathlib, signal, time

signal.signal(signal.SIGTERM, signal.SIG_IGN)  # at import, before the replica's own handler


class Stubborn:
    def __init__(self, marker):
        pathlib.Path(marker).write_text(str(os.getpid()))
        time.sleep(60)
"""


async def test_a_replica_ignoring_sigterm_is_killed_after_its_deadline(
    bus: Bus, events: Events, nats_url: str, tmp_path: Path
) -> None:
    code, work = tmp_path / "code", tmp_path / "work"
    code.mkdir()
    work.mkdir()
    (code / "stubborn.py").write_text(STUBBORN)
    marker = tmp_path / "marker"
    config = DeploymentConfig(
        name="dep",
        import_path="stubborn:Stubborn",  # importable only through --pythonpath
        init_kwargs={"marker": str(marker)},
        graceful_shutdown_timeout_s=0.5,
    )
    targets = await bus.kv(KV_TARGETS)
    await put_targets(targets, [("r-s", ME)], config)
    kills0 = metric("fleetpulse_agent_replica_kills_total")
    cfg = AgentConfig(
        nats_url=nats_url,
        agent_id=ME,
        max_replicas=1,
        workdir=str(work),
        pythonpath=(str(code),),
        log_dir=str(tmp_path / "logs"),
        kill_margin_s=0.5,
    )
    agent = AgentService(cfg)
    task = asyncio.create_task(agent.run())
    try:
        await eventually(marker.exists)
        pid = int(await eventually(marker.read_text))
        assert agent.pid("r-s") == pid
        await put_targets(targets, [])  # the deployment is gone: its keys are deleted
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        exited = await eventually(lambda: events.of("r-s", "exited"))
        assert exited[0].exit_code == -signal.SIGKILL
        assert loop.time() - t0 >= 0.5 + 0.5 - 0.2  # SIGKILL waited for grace + margin
        assert metric("fleetpulse_agent_replica_kills_total") - kills0 == 1
        assert not alive(pid)
        await eventually(lambda: "r-s" not in agent.children)
    finally:
        agent.stop()
        await asyncio.wait_for(task, WAIT_S)

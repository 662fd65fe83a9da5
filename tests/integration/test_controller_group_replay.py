"""SIGKILL the member that owns a deployment while the load falls: its successor, fed no report
after the kill, scales exactly as the history it replays from FP_REPORTS says.

BRIEF, "The controller as a consumer group": a new owner rebuilds each deployment's window from
the retained stream, then acts. Tests where reports keep arriving through a failover cannot tell
a replay from none (the live reports refill the window, and the rule against scaling down before
a full window holds the target meanwhile), so here the reports stop at the kill.

Two `fleetpulse controller` member processes on one nats-server; the test plays the replicas
(lifecycle "ready" for each replica the owner targets, answers to health probes) and one router
(handle reports, 5 a second). The load: 6 queued requests (target 3, all 3 running), then 4
(target 2). Once the owner's window is full of the lower load its downscale delay runs (8 s);
the test stops the reports and kills the owner inside that delay, so the owner dies at 3.
The successor takes the partition over with the owner's 3 running replicas (fp_targets,
fp_membership) and, from the replayed history, demand 4: its first decision is 3 -> 2, one
downscale delay later. Without the history it has no handle and so no demand: a window of
zero load, and 3 -> 1 (the unit test tests/unit/test_takeover_replay.py shows the same on a
fake clock).

The handle source's expiry is pushed past the test (metrics_interval_s 20: 40 s): the history's
last word must still count when the successor's delay runs out, however slow the machine.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from services.controller.group import partition_of
from shared.appconfig import AppConfig, AutoscalingConfig, DeploymentConfig
from shared.bus import Msg
from shared.errors import BusError
from shared.kv.status import AppStatusView
from shared.kv.targets import ReplicaTarget, app_pattern
from shared.kv.view import DocKV
from shared.natsbus import NatsBus
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.subjects import KV_APPS, KV_STATUS, KV_TARGETS
from shared.wire import encode
from shared.wire.messages import HandleReport, HealthStatus, Lifecycle
from tests.integration.test_controller_group import leases
from tests.procs import ServiceProcesses
from tests.waiting import eventually as until

P = 16
MEMBERS = ("c1", "c2")
APP, DEPLOYMENT = "falling", "Model"
HIGH, LOW = 6.0, 4.0
"""Queued requests before and after the fall: target 3, then 2 (target_ongoing_requests 2)."""
DOWNSCALE_DELAY_S = 8.0
"""Room between the owner's window filling with the lower load and its acting on it: the kill
lands inside, well before the owner would scale down."""
POLICY = AutoscalingConfig(
    min_replicas=1, max_replicas=6, target_ongoing_requests=2, upscale_delay_s=0.5,
    downscale_delay_s=DOWNSCALE_DELAY_S, look_back_period_s=2.0, metrics_interval_s=20.0,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Status:
    at: float
    owner_epoch: int
    target: int
    running: int
    demand: float
    decision: str


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[ServiceProcesses]:
    p = ServiceProcesses()
    try:
        yield p
    finally:
        p.stop_all(timeout=15)
        for log in sorted(tmp_path.glob("*.log")):  # shown by pytest only when the test fails
            print(f"--- {log.name} (tail)\n" + "\n".join(log.read_text().splitlines()[-40:]))


async def balanced(bus: NatsBus) -> bool:
    try:
        owners = [o for o, _ in (await leases(bus)).values()]
    except BusError:  # the bucket does not exist before the first member creates it
        return False
    counts = [owners.count(m) for m in MEMBERS]
    return len(owners) == P and min(counts) >= P // len(MEMBERS) - 1


class Fleet:
    """The replicas (ready as soon as targeted, healthy when probed) and one router's reports."""

    def __init__(self, bus: NatsBus) -> None:
        self.bus = bus
        self.queued = HIGH
        self.ready: set[str] = set()
        self.statuses: list[Status] = []
        self._stop_reports = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        await self.bus.subscribe(f"{S.prefix}.probe.*", self._answer_probe)
        self._tasks = [
            asyncio.create_task(self._follow_status()),
            asyncio.create_task(self._start_replicas()),
            asyncio.create_task(self._report()),
        ]

    async def _answer_probe(self, msg: Msg) -> None:
        rid = msg.subject.rsplit(".", 1)[-1]
        if msg.reply:
            await self.bus.publish(msg.reply, encode(HealthStatus(rid, True, time.time(), 0)))

    async def _follow_status(self) -> None:
        async for entry in await (await self.bus.kv(KV_STATUS)).watch(APP):
            if entry is None or entry.op != "PUT":
                continue
            st = AppStatusView.decode(entry.value)
            d = st.deployments[DEPLOYMENT]
            self.statuses.append(
                Status(time.monotonic(), st.owner_epoch, d.target_replicas, d.running_replicas,
                       d.demand, d.last_decision)
            )  # fmt: skip

    async def _start_replicas(self) -> None:
        """Every replica the owner targets reports "ready" (its own lifecycle event)."""
        targets = DocKV(await self.bus.kv(KV_TARGETS), ReplicaTarget)
        while not self._stop_reports.is_set():
            for c in await targets.snapshot(app_pattern(APP)):
                rid = c.doc.replica_id if c.doc is not None else ""
                if rid and rid not in self.ready:
                    rpc = S.rpc(APP, DEPLOYMENT, rid)
                    ready = Lifecycle(
                        rid, "", "ready", time.time(), rpc, "v1", None, APP, DEPLOYMENT
                    )
                    subject = S.report("lifecycle", APP, DEPLOYMENT, rid)
                    await self.bus.publish(subject, encode(ready))
                    self.ready.add(rid)
            await asyncio.sleep(0.1)

    async def _report(self) -> None:
        seq = 0
        while not self._stop_reports.is_set():
            seq += 1
            r = HandleReport("h1", APP, DEPLOYMENT, time.time(), seq, self.queued, {}, (), 1)
            await self.bus.publish(S.report("handle", APP, DEPLOYMENT), encode(r))
            await asyncio.sleep(0.2)

    async def stop_reports(self) -> None:
        """No report of any kind after this returns (the probes are still answered)."""
        self._stop_reports.set()
        await asyncio.gather(*self._tasks[1:], return_exceptions=True)
        await self.bus.flush()

    async def stop(self) -> None:
        self._stop_reports.set()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def latest(self) -> Status | None:
        return self.statuses[-1] if self.statuses else None


async def test_a_successor_fed_no_new_report_scales_as_the_replayed_history_says(
    nats_url: str, procs: ServiceProcesses, tmp_path: Path
) -> None:
    started = time.monotonic()
    members = {}
    for m in MEMBERS:
        args = ["-m", "services.cli", "controller", "--nats", nats_url, "--member-id", m]
        members[m] = procs.start([*args, "--rebuild-s", "20"], log=tmp_path / f"{m}.log")
    bus = await NatsBus.connect(nats_url, name="test", reconnect_wait=0.1)
    fleet = Fleet(bus)
    try:
        await until(lambda: balanced(bus), 90, f"the partitions shared by {MEMBERS}")
        await fleet.start()
        dep = DeploymentConfig(DEPLOYMENT, "m:Model", autoscaling=POLICY)
        await (await bus.kv(KV_APPS)).put(APP, AppConfig(APP, (dep,), version="v1").to_json())

        def at(target: int, running: int) -> bool:
            st = fleet.latest()
            return st is not None and (st.target, st.running) == (target, running)

        await until(lambda: at(3, 3), 60, f"3 replicas running for {HIGH:g} queued")
        at_3 = len(fleet.statuses) - 1
        fleet.queued = LOW

        def owner_waits() -> bool:
            st = fleet.latest()
            return st is not None and "downscale delay (3->2)" in st.decision

        await until(owner_waits, 30, f"the owner's window full of {LOW:g} queued")
        owner, old_epoch = (await leases(bus))[partition_of(APP, P)]
        await fleet.stop_reports()
        members[owner].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        before = [s for s in fleet.statuses[at_3:] if s.owner_epoch <= old_epoch]
        assert min(s.target for s in before) == 3, f"the owner acted before the kill: {before}"

        def successor_decided() -> Status | None:
            mine = [s for s in fleet.statuses if s.owner_epoch > old_epoch]
            return next((s for s in mine if s.target != 3), None)

        first = await until(successor_decided, 60, "the successor's first decision")
        after = [s for s in fleet.statuses if s.owner_epoch > old_epoch]
        shown = "; ".join(
            f"+{s.at - killed:.1f} s target {s.target} demand {s.demand:g} ({s.decision})"
            for s in after
        )
        assert first.target == 2, f"the successor decided 3 -> {first.target}, not 3 -> 2: {shown}"
        assert {s.demand for s in after} == {LOW}, f"demand other than the history's: {shown}"
        print(f"first decision +{first.at - killed:.1f} s after the kill; "
              f"{time.monotonic() - started:.1f} s in all: {shown}")  # fmt: skip
    finally:
        await fleet.stop()
        await bus.close()

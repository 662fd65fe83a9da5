"""The controller as a consumer group on a 3-node NATS cluster with 3 member processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from services.controller.group import partition_of
from services.controller.group_shell import KV_LEASES
from shared.appconfig import AppConfig, AutoscalingConfig, DeploymentConfig
from shared.bus import Bus
from shared.kv.status import AppStatusView
from shared.kv.targets import ReplicaTarget, app_pattern
from shared.kv.view import DocKV
from shared.natsbus import NatsBus
from shared.natsserver import NatsCluster
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.subjects import KV_APPS, KV_STATUS, KV_TARGETS
from shared.wire import encode
from shared.wire.messages import HandleReport
from tests.procs import ServiceProcesses
from tests.waiting import eventually as until

P = 16
APP = "busy"


@pytest.fixture
def cluster() -> Iterator[NatsCluster]:
    c = NatsCluster(3)
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
async def bus(cluster: NatsCluster) -> AsyncIterator[Bus]:
    os.environ["FLEETPULSE_KV_REPLICAS"] = "3"
    try:
        b = await NatsBus.connect(cluster.urls[0], name="test", reconnect_wait=0.1)
        yield b
        await b.close()
    finally:
        os.environ.pop("FLEETPULSE_KV_REPLICAS", None)


class Members:
    def __init__(self, cluster: NatsCluster, tmp: Path) -> None:
        self.cluster, self.tmp = cluster, tmp
        self.procs = ServiceProcesses()
        self.by_id: dict[str, Any] = {}

    def start(self, member: str, node: int) -> None:
        env_url = self.cluster.urls[node]
        os.environ["FLEETPULSE_KV_REPLICAS"] = "3"
        self.by_id[member] = self.procs.start(
            ["-m", "services.cli", "controller", "--nats", env_url, "--member-id", member,
             "--rebuild-s", "20", "--stream-replicas", "3"],
            log=self.tmp / f"{member}.log",
        )  # fmt: skip


@pytest.fixture
def members(cluster: NatsCluster, tmp_path: Path) -> Iterator[Members]:
    m = Members(cluster, tmp_path)
    try:
        yield m
    finally:
        for p in m.procs.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
        m.procs.stop_all(timeout=15)
        for log in sorted(tmp_path.glob("*.log")):  # shown by pytest only when the test fails
            print(f"--- {log.name} (tail)\n" + "\n".join(log.read_text().splitlines()[-40:]))


async def leases(bus: Bus) -> dict[int, tuple[str, int]]:
    kv = await bus.kv(KV_LEASES)
    out: dict[int, tuple[str, int]] = {}
    for key in await kv.keys():
        entry = await kv.get(key)
        if entry is not None:
            doc = json.loads(entry.value)
            out[int(key[1:])] = (doc["owner"], doc["epoch"])
    return out


def busy_app() -> AppConfig:
    # min 0: no replica ever runs here (no agent), and the policy holds a target whose replicas
    # are all still starting; from zero, the load alone sets the target at once
    policy = AutoscalingConfig(
        min_replicas=0, max_replicas=6, target_ongoing_requests=2, upscale_delay_s=0.5,
        downscale_delay_s=2.0, look_back_period_s=2.0, metrics_interval_s=0.5,
    )  # fmt: skip
    d = DeploymentConfig(name="Model", import_path="m:Model", autoscaling=policy)
    return AppConfig(APP, (d,), version="v1")


async def balanced(bus: Bus, ids: set[str]) -> dict[int, tuple[str, int]] | None:
    got = await leases(bus)
    owners = [o for o, _ in got.values()]
    if len(got) != P or set(owners) != ids:
        return None
    counts = sorted(owners.count(m) for m in ids)
    return got if counts[-1] - counts[0] <= 1 else None


async def test_balanced_failover_fencing_and_handover(
    cluster: NatsCluster, bus: Bus, members: Members
) -> None:
    await (await bus.kv(KV_APPS)).put(APP, busy_app().to_json())
    for i, m in enumerate(["c1", "c2", "c3"]):
        members.start(m, i)
    ownership = await until(lambda: balanced(bus, {"c1", "c2", "c3"}), 60, "balanced ownership")
    owner, _ = ownership[partition_of(APP, P)]

    # steady load on the busy deployment: demand 6 -> target 3
    stop = asyncio.Event()

    async def reports() -> None:
        seq = 0
        while not stop.is_set():
            seq += 1
            r = HandleReport("h1", APP, "Model", time.time(), seq, 6.0, {}, (), 1, {})
            await bus.publish(S.report("handle", APP, "Model"), encode(r))
            await asyncio.sleep(0.2)

    pump = asyncio.create_task(reports())
    # (time, replicas targeted, owner epoch of the write; -1 for a delete), per change
    targets: list[tuple[float, int, int]] = []

    async def follow_targets() -> None:
        live: dict[str, ReplicaTarget] = {}
        docs = DocKV(await bus.kv(KV_TARGETS), ReplicaTarget)
        async for change in await docs.watch(app_pattern(APP)):  # one key per replica
            if change is None:
                continue
            if change.doc is None:
                live.pop(change.key, None)
            else:
                live[change.key] = change.doc
            epoch = -1 if change.doc is None else change.doc.owner_epoch
            targets.append((time.monotonic(), len(live), epoch))

    follower = asyncio.create_task(follow_targets())
    try:
        await until(lambda: _target(targets, 3), 20, "scaled to 3 under load")

        # kill -9 the owner: a new owner within 3 s; the target never drops for lack of data
        members.by_id[owner].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        survivors = {"c1", "c2", "c3"} - {owner}
        part = partition_of(APP, P)
        new = await until(lambda: _owner_in(bus, part, survivors), 10, "new owner")
        failover_s = time.monotonic() - killed
        assert failover_s <= 3.0 + 1.0, f"failover took {failover_s:.1f} s"
        await asyncio.sleep(3.0)  # the new owner decides on rebuilt history
        after = [n for t, n, _ in targets if t > killed]
        assert all(n >= 3 for n in after), f"target dropped after failover: {after}"

        # SIGSTOP the new owner past its lease, SIGCONT it: none of its stale writes lands
        members.by_id[new].send_signal(signal.SIGSTOP)
        third = (survivors - {new}).pop()
        await until(lambda: _owner_in(bus, part, {third}), 10, "taken from the paused member")
        taken = time.monotonic()
        _, third_epoch = (await leases(bus))[part]
        await asyncio.sleep(1.0)
        members.by_id[new].send_signal(signal.SIGCONT)
        await asyncio.sleep(3.0)
        epochs = [e for _, _, e in targets if e >= 0]
        assert epochs == sorted(epochs), f"a stale owner's write landed: epochs {epochs}"
        # the per-replica keys are written only on change, so also: nothing written after the
        # takeover carries an older epoch than the new owner's
        late = [e for t, _, e in targets if t > taken and e >= 0]
        assert all(e >= third_epoch for e in late), f"a stale owner's write landed: {late}"
        # the status is the current owner's (the partition may have moved on once the paused
        # member came back; nobody rewrites unchanged targets, so compare with the lease)
        st = await (await bus.kv(KV_STATUS)).get(APP)
        _, current_epoch = (await leases(bus))[part]
        assert st is not None and current_epoch >= max([*epochs, third_epoch])
        assert AppStatusView.decode(st.value).owner_epoch == current_epoch

        # graceful SIGTERM of the current owner hands over in about a second
        members.start("c4", 0)
        await until(lambda: balanced(bus, {new, third, "c4"}), 20, "rebalanced with c4")
        holder, _ = (await leases(bus))[part]
        others = {new, third, "c4"} - {holder}
        members.by_id[holder].send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        await until(lambda: _owner_in(bus, part, others), 5, "handed over on SIGTERM")
        assert time.monotonic() - t0 < 2.0
    finally:
        stop.set()
        follower.cancel()
        await asyncio.gather(pump, follower, return_exceptions=True)


def _target(targets: list[tuple[float, int, int]], n: int) -> Any:
    async def check() -> bool:
        return bool(targets) and targets[-1][1] == n

    return check()


async def _owner_in(bus: Bus, partition: int, allowed: set[str]) -> str | None:
    owner, _ = (await leases(bus)).get(partition, ("", 0))
    return owner if owner in allowed else None

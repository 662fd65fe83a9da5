"""Kill one NATS node under a running controller group: the group carries on.

A 3-node cluster (KV buckets and FP_REPORTS at 3 replicas) and 3 `fleetpulse controller` member
processes, each given the URL of a different node only: nats-py learns the other nodes from the
server's INFO (`connect_urls`) and reconnects to one of them.

What a node takes with it, besides client connections: the R1 ordered consumers it hosted, which
nats-server places on any node of the stream. Those are the members' KV watches and partition
reads. So the node killed is the one (of those not leading the JetStream meta group) hosting
the most of the group's consumers, and the busy app is named so that it lands in a partition
owned by the member connected to that node: the owner's connection drops while reports keep
coming. Every stream the node led is asked to elect a leader elsewhere first: losing a stream
leader stalls writes to that stream for a NATS election (seconds), a different drill.

The test itself reads KV by polling `get` (served by any replica), so what it observes does not
depend on a consumer that may have lived on the killed node.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from services.controller.core import ControllerConfig
from services.controller.group import lease_key, partition_of
from services.controller.group_shell import KV_LEASES
from services.controller.service import ControllerService, ServiceConfig
from services.controller.stream import DEFAULT_RETENTION_S, ensure_stream
from services.ops.group_view import GroupView, unattended
from shared.appconfig import AppConfig, AutoscalingConfig, DeploymentConfig
from shared.errors import BusError
from shared.kv import envelope
from shared.kv.group import ControllerMember, PartitionLease
from shared.kv.status import AppStatusView
from shared.kv.targets import ReplicaTarget, app_pattern
from shared.kv.view import DocKV
from shared.natsbus import NatsBus
from shared.natsserver import NatsCluster
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.subjects import KV_APPS, KV_CONTROLLERS, KV_STATUS, KV_TARGETS, partition_subject
from shared.subjects import REPORT_STREAM as STREAM_NAME
from shared.wire import encode
from shared.wire.messages import HandleReport
from tests.procs import ServiceProcesses
from tests.waiting import eventually as until

P = 16
NODES = 3
MEMBERS = ("c1", "c2", "c3")
"""Member i connects to node i."""
DEPLOYMENT = "Model"
TARGET = 3
RECOVER_S = 10.0
"""By then every partition has a live owner again that looks after the app's fp_status."""
HOLD_S = 13.0
"""The invariants hold this long after the kill: longer than a handle source takes to expire
(10 s) plus a status refresh, so a partition that silently stopped being read would show."""
POLL_S = 0.1
MEMBER_FRESH_S = 1.5
"""A member is live while its fp_controllers entry was re-put this recently (3 heartbeats)."""
GROUP_STREAMS = (STREAM_NAME, f"KV_{KV_LEASES}", f"KV_{KV_CONTROLLERS}")


@pytest.fixture
def cluster() -> Iterator[NatsCluster]:
    c = NatsCluster(NODES)
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture
async def setup_bus(cluster: NatsCluster) -> AsyncIterator[NatsBus]:
    os.environ["FLEETPULSE_KV_REPLICAS"] = str(NODES)
    try:
        b = await NatsBus.connect(cluster.url, name="test-setup", reconnect_wait=0.1)
        try:
            yield b
        finally:
            await b.close()
    finally:
        os.environ.pop("FLEETPULSE_KV_REPLICAS", None)


@pytest.fixture
def procs() -> Iterator[ServiceProcesses]:
    p = ServiceProcesses()
    try:
        yield p
    finally:
        p.stop_all(timeout=15)


def busy_app(name: str) -> AppConfig:
    # min 0: no replica ever runs here (no agent), and the policy holds a target whose replicas
    # are all still starting; from zero, the load alone sets the target at once
    policy = AutoscalingConfig(
        min_replicas=0, max_replicas=6, target_ongoing_requests=2, upscale_delay_s=0.5,
        downscale_delay_s=2.0, look_back_period_s=2.0, metrics_interval_s=0.5,
    )  # fmt: skip
    return AppConfig(
        name, (DeploymentConfig(DEPLOYMENT, "m:Model", autoscaling=policy),), version="v1"
    )


def app_in(partition: int) -> str:
    return next(f"busy{k}" for k in range(100_000) if partition_of(f"busy{k}", P) == partition)


def meta_leader(cluster: NatsCluster) -> str | None:
    with urllib.request.urlopen(cluster.servers[0].monitor_url + "/jsz", timeout=1.0) as resp:
        leader = (json.load(resp).get("meta_cluster") or {}).get("leader")
    return str(leader) if leader else None


async def consumer_hosts(bus: NatsBus) -> list[tuple[str, str, str]]:
    """(stream, filter subject, node hosting it) for every consumer of the group's streams."""
    out = []
    for stream in GROUP_STREAMS:
        for c in await bus.js.consumers_info(stream):
            if c.cluster is not None and c.cluster.leader:
                out.append((stream, c.config.filter_subject or "", c.cluster.leader))
    return out


async def lead_elsewhere(bus: NatsBus, node: str) -> None:
    """Move every stream leader off `node` (an orderly step-down, not a failure)."""

    async def led_there() -> list[str]:
        infos = await bus.js.streams_info()
        return [i.config.name for i in infos if i.cluster and i.cluster.leader == node]  # type: ignore[misc]

    for name in await led_there():
        await bus.nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{name}", b"", timeout=5)

    async def none_there() -> bool:
        return not await led_there()

    await until(none_there, 10, f"no stream led by {node}")


@dataclass(frozen=True, slots=True)
class Seen:
    at: float
    bucket: str
    target: int
    demand: float = 0.0
    status: AppStatusView | None = None


class Observer:
    """Polls the busy app's fp_status / fp_targets and the members' fp_controllers entries."""

    def __init__(self, bus: NatsBus, app: str) -> None:
        self.bus, self.app = bus, app
        self.writes: list[Seen] = []
        self.beats: dict[str, float] = {}
        self._revisions: dict[tuple[str, str], int] = {}
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._poll())

    async def _poll(self) -> None:
        status = await self.bus.kv(KV_STATUS)
        targets = DocKV(await self.bus.kv(KV_TARGETS), ReplicaTarget)
        members = await self.bus.kv(KV_CONTROLLERS, create=False)
        reads = [(KV_STATUS, status, self.app)]
        reads += [(KV_CONTROLLERS, members, m) for m in MEMBERS]
        seen_targets: frozenset[tuple[str, int]] = frozenset()
        while not self._stopping:
            for bucket, kv, key in reads:
                try:
                    entry = await kv.get(key)
                except BusError:
                    continue  # a read that failed is no observation
                if entry is None or self._revisions.get((bucket, key)) == entry.revision:
                    continue
                self._revisions[(bucket, key)] = entry.revision
                self._record(bucket, key, entry.value)
            try:  # the app's targets: one key per replica
                now = frozenset(
                    (c.key, c.revision)
                    for c in await targets.snapshot(app_pattern(self.app))
                    if c.doc is not None and c.doc.deployment == DEPLOYMENT
                )
            except BusError:
                now = seen_targets
            if now != seen_targets:
                seen_targets = now
                self.writes.append(Seen(time.monotonic(), KV_TARGETS, len(now)))
            await asyncio.sleep(POLL_S)

    def _record(self, bucket: str, key: str, value: bytes) -> None:
        now = time.monotonic()
        if bucket == KV_CONTROLLERS:
            self.beats[key] = now
        elif bucket == KV_STATUS:
            st = AppStatusView.decode(value)
            dep = st.deployments[DEPLOYMENT]
            self.writes.append(Seen(now, bucket, dep.target_replicas, dep.demand, st))

    def live(self) -> set[str]:
        now = time.monotonic()
        return {m for m, at in self.beats.items() if now - at < MEMBER_FRESH_S}

    def statuses(self, since: float = 0.0) -> list[Seen]:
        return [w for w in self.writes if w.bucket == KV_STATUS and w.at >= since]

    async def unattended(self) -> str | None:
        """Why the app's latest status is not looked after by a live member (None: it is),
        judged as `fleetpulse status` judges it, from leases read by `get`."""
        latest = self.statuses()[-1].status
        assert latest is not None
        leases = await lease_docs(self.bus)
        live = {m: ControllerMember(m) for m in self.live()}
        return unattended(latest, GroupView(live, leases), time.time())

    async def stop(self) -> None:
        # a flag as well as the cancel: Python 3.11's wait_for (inside every nats-py request)
        # can swallow a cancellation that lands as its reply arrives
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


async def lease_docs(bus: NatsBus) -> dict[int, PartitionLease]:
    kv = await bus.kv(KV_LEASES, create=False)
    out: dict[int, PartitionLease] = {}
    for p in range(P):
        entry = await kv.get(lease_key(p))
        if entry is not None:
            out[p] = envelope.decode(entry.value, PartitionLease)
    return out


async def lease_owners(bus: NatsBus) -> dict[int, str]:
    return {p: lease.owner for p, lease in (await lease_docs(bus)).items()}


async def pump(bus: NatsBus, app: str, stop: asyncio.Event) -> None:
    """Steady load: 6 queued requests at a handle, 5 reports a second (target 3)."""
    seq = 0
    while not stop.is_set():
        seq += 1
        r = HandleReport("h1", app, DEPLOYMENT, time.time(), seq, 6.0, {}, (), 1)
        await bus.publish(S.report("handle", app, DEPLOYMENT), encode(r))
        await asyncio.sleep(0.2)


async def test_killing_one_nats_node_leaves_the_group_working(
    cluster: NatsCluster, setup_bus: NatsBus, procs: ServiceProcesses, tmp_path: Path
) -> None:
    await ensure_stream(setup_bus.js, S, P, DEFAULT_RETENTION_S, replicas=NODES)
    for m, url in zip(MEMBERS, cluster.urls, strict=True):
        procs.start(
            ["-m", "services.cli", "controller", "--nats", url, "--member-id", m,
             "--rebuild-s", "20", "--stream-replicas", str(NODES)],
            log=tmp_path / f"{m}.log",
        )  # fmt: skip
    before = await until(lambda: _balanced(setup_bus), 60, "balanced ownership over c1, c2, c3")

    # the node to kill: not the meta leader, hosting the most membership watches (a quiet one
    # makes the others look dead), then the most of the group's consumers
    names = [s.server_name or "" for s in cluster.servers]
    hosts = await consumer_hosts(setup_bus)
    watches = Counter(node for stream, _, node in hosts if stream == f"KV_{KV_CONTROLLERS}")
    consumers = Counter(node for _, _, node in hosts)
    victim = max((i for i, n in enumerate(names) if n != meta_leader(cluster)),
                 key=lambda i: (watches[names[i]], consumers[names[i]]))  # fmt: skip
    member = MEMBERS[victim]
    # the busy app goes to a partition of the member on that node, best one read there too
    read_there = {f for stream, f, node in hosts if stream == STREAM_NAME and node == names[victim]}
    mine = [p for p, owner in before.items() if owner == member]
    part = next((p for p in mine if partition_subject(S, p) in read_there), mine[0])
    app = app_in(part)
    there = sorted((st, f) for st, f, node in hosts if node == names[victim])
    killing = f"killing {names[victim]} (member {member}, app partition {part}, hosting {there})"

    survivors = [u for i, u in enumerate(cluster.urls) if i != victim]
    bus = await NatsBus.connect(",".join(survivors), name="test", reconnect_wait=0.1)
    stop = asyncio.Event()
    load_task = asyncio.create_task(pump(bus, app, stop))
    seen = Observer(bus, app)
    try:
        await (await bus.kv(KV_APPS)).put(app, busy_app(app).to_json())
        seen.start()
        await until(lambda: _target_reached(seen), 20, f"target {TARGET} under steady load")
        await lead_elsewhere(setup_bus, names[victim])
        owners_before = await lease_owners(bus)

        cluster.kill(victim)
        killed = time.monotonic()
        state: dict[str, Any] = {}

        async def recovered() -> bool:
            owners = await lease_owners(bus)
            why = await seen.unattended()
            state.update(owners=owners, live=seen.live(), status_unattended=why)
            return len(owners) == P and set(owners.values()) <= seen.live() and why is None

        try:
            await until(recovered, RECOVER_S, "every partition owned by a live member again")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last seen {state}; {killing}") from None
        await asyncio.sleep(max(0.0, killed + HOLD_S - time.monotonic()))

        after = [w for w in seen.writes if w.at >= killed]
        # nothing changed, so nothing need be written; whatever was written kept the target
        latest = {w.bucket: w.target for w in seen.writes}
        assert {w.target for w in after} <= {TARGET}, f"the target moved: {after}; {killing}"
        assert set(latest.values()) == {TARGET}, f"the target moved: {latest}; {killing}"
        assert all(w.demand > 0 for w in seen.statuses(killed)), (
            f"load vanished: {after}; {killing}"
        )
        why = await seen.unattended()
        assert why is None, f"fp_status is not looked after: {why}; {killing}"
        owners = await lease_owners(bus)
        await until(lambda: _all_live(seen), 3, f"all members live after the kill: {seen.live()}")
        # nobody took a partition from a member that stayed connected
        stolen = {
            p: o for p, o in owners.items() if owners_before[p] != member and o != owners_before[p]
        }
        assert not stolen, f"partitions moved off connected members: {stolen}; {killing}"
        counts = Counter(owners.values())
        assert len(owners) == P and max(counts.values()) - min(counts.values()) <= 1, owners
        # the member on the killed node moved to another node (it still owns partitions)
        assert _reconnected(tmp_path / f"{member}.log", survivors)
    finally:
        stop.set()
        await asyncio.gather(load_task, return_exceptions=True)
        await seen.stop()
        await bus.close()


def _reconnected(log: Path, survivors: list[str]) -> bool:
    """The member's log shows its connection moved to a surviving node."""
    lines = log.read_text(errors="replace").splitlines()
    return any("reconnected to" in ln and any(u in ln for u in survivors) for ln in lines)


async def _balanced(bus: NatsBus) -> dict[int, str] | None:
    try:
        owners = await lease_owners(bus)
    except BusError:  # the bucket does not exist before the first member creates it
        return None
    if len(owners) != P or set(owners.values()) != set(MEMBERS):
        return None
    counts = Counter(owners.values())
    return owners if max(counts.values()) - min(counts.values()) <= 1 else None


async def _target_reached(seen: Observer) -> bool:
    return any(w.target == TARGET for w in seen.statuses())


async def _all_live(seen: Observer) -> bool:
    return seen.live() == set(MEMBERS)


async def test_a_taken_partition_decides_nothing_until_its_history_is_replayed(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Taking a partition restores its apps from KV, then replays the stream; a control tick
    in between must not decide on the empty window (it once wrote a fresh target of 1 over the
    previous owner's 3: a lost window on every failover that hit the gap)."""
    app = app_in(0)
    restore = ControllerService._restore

    async def restore_slowly(svc: ControllerService, now: float, apps: set[str]) -> None:
        if apps:
            await asyncio.sleep(0.5)  # a KV read under load: several control ticks long
        await restore(svc, now, apps)

    monkeypatch.setattr(ControllerService, "_restore", restore_slowly)
    bus = await NatsBus.connect(nats_url, name="test")
    svc = ControllerService(
        ServiceConfig(nats_url=nats_url, core=ControllerConfig(member_id="solo"), rebuild_s=5.0)
    )
    stop = asyncio.Event()
    load: asyncio.Task[None] | None = None
    run: asyncio.Task[None] | None = None
    try:
        # the previous owner's state: the app at 3 replicas, and the load that explains them
        await (await bus.kv(KV_APPS)).put(app, busy_app(app).to_json())
        spec = busy_app(app).deployments[0].replica_spec()
        ids = {f"{DEPLOYMENT}-{i}" for i in (1, 2, 3)}
        targets = DocKV(await bus.kv(KV_TARGETS), ReplicaTarget)
        for slot, rid in enumerate(sorted(ids)):
            t = ReplicaTarget(app, DEPLOYMENT, rid, "a1", slot, slot + 1, "v1", "", spec)
            await targets.put(t.key, t)
        status_kv = await bus.kv(KV_STATUS)
        await ensure_stream(bus.js, S, P, DEFAULT_RETENTION_S)
        load = asyncio.create_task(pump(bus, app, stop))
        await asyncio.sleep(3.0)  # more history than the 2 s look-back

        run = asyncio.create_task(svc.run())
        # what the new owner decides shows in its status (target) and in fp_targets (one key
        # per replica: a fresh target of 1 would delete two, or write a replica of its own)
        decided: list[int] = []
        looks: list[set[str]] = []
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            looks.append(
                {c.doc.replica_id for c in await targets.snapshot(app_pattern(app)) if c.doc}
            )
            entry = await status_kv.get(app)
            st = envelope.decode(entry.value, AppStatusView) if entry is not None else None
            if st is not None and st.owner_epoch > 0:
                decided.append(st.deployments[DEPLOYMENT].target_replicas)
            await asyncio.sleep(0.02)
        assert decided, "the new owner never wrote the app's status"
        assert decided == [TARGET] * len(decided), decided
        assert all(ids_now == ids for ids_now in looks), looks
    finally:
        stop.set()
        if load is not None:
            await asyncio.gather(load, return_exceptions=True)
        if run is not None:
            svc._stop.set()
            await asyncio.wait_for(run, 10)
        await svc.stop()
        await bus.close()

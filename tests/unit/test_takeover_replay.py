"""A member that takes a partition over decides on the history it replays from the stream.

BRIEF, "The controller as a consumer group": a new owner rebuilds each deployment's window from
the retained stream, then acts. Here the owner died and its reports stopped with it: nothing
arrives after the takeover, so whatever the successor knows of the load it knows from the
replay. Each case is built so that a successor without that history decides something else:
with an empty window it reads no handle, so no demand, and either holds where the previous owner
left the target or, once its window is full of that nothing, scales down to the minimum.

The shell runs for real (`ControllerService._take_partition`, its ingest and catch-up, its
ticks) on a fake clock, with the previous owner's fp_targets / fp_membership in an in-memory KV
and FP_REPORTS as a fake stream that delivers from the start time the consumer asks for, with
the ack subjects JetStream gives (stored time, messages pending behind). The same property
against a real nats-server and real member processes, SIGKILL included:
tests/integration/test_controller_group_replay.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from nats.js.api import ConsumerConfig, DeliverPolicy

from services.controller.core import ControllerConfig
from services.controller.fenced import FencedWriter
from services.controller.group import partition_of
from services.controller.managed import ManagedDeployment
from services.controller.service import ControllerService, ServiceConfig
from shared.appconfig import AppConfig, AutoscalingConfig, DeploymentConfig
from shared.clock import FakeClock
from shared.fakebus import FakeServer
from shared.kv import buckets
from shared.kv.membership import Member
from shared.kv.targets import ReplicaTarget
from shared.kv.view import DocKV
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.subjects import partition_prefix
from shared.wire import encode
from shared.wire.messages import HandleReport

APP, DEPLOYMENT = "shop", "Model"
PARTITIONS = 16
PART = partition_of(APP, PARTITIONS)
TICK = 0.1
REPORT_EVERY_S = 0.2
TAKEOVER_AFTER_S = 2.0
"""From the kill (the last report) to the takeover: the member TTL."""
WATCH_S = 6.0
"""How long the successor is watched: less than the handle source's expiry after the last report
(10 s; then even the replayed demand is gone), more than the slowest answer the history gives."""
POLICY = AutoscalingConfig(
    min_replicas=1, max_replicas=6, target_ongoing_requests=2, upscale_delay_s=0.5,
    downscale_delay_s=2.0, look_back_period_s=2.0, metrics_interval_s=0.5,
)  # fmt: skip


def app() -> AppConfig:
    dep = DeploymentConfig(DEPLOYMENT, "m:Model", autoscaling=POLICY)
    return AppConfig(APP, (dep,), version="v1")


@dataclass(frozen=True, slots=True)
class Case:
    """What the previous owner left in KV, the load before it died, and what follows from it."""

    running: int
    """Replicas it ran (targets and members in KV)."""
    load: tuple[tuple[float, float], ...]
    """(seconds, queued requests) in order, ending at the kill."""
    decides: int
    """The successor's first new target: what this history warrants."""
    demand: float
    """The demand it shows from its first tick on (the last reported)."""
    without_history: str
    """What a successor without the history does instead (a comment)."""


CASES = {
    # the load rose just before the owner died, inside its upscale delay: 6 queued needs 3
    "rise": Case(1, ((6.0, 0.0), (0.4, 6.0)), 3, 6.0, "holds at 1: no demand"),
    # the load fell from 6 (3 replicas) to 4 for longer than the look-back, not yet for the
    # look-back plus the downscale delay: 4 queued needs 2, and not 1
    "fall": Case(3, ((6.0, 6.0), (3.0, 4.0)), 2, 4.0, "3 -> 1: a full window of zero demand"),
}


@dataclass
class FakeStream:
    """FP_REPORTS as a partition's ordered consumer reads it: stored messages, delivered in
    order from the consumer's start time (`DeliverPolicy.BY_START_TIME`), each with the ack
    subject JetStream gives it (its stored time, and how many are pending behind it)."""

    stored: list[tuple[str, bytes, float]] = field(default_factory=list)
    """(stored subject, payload, stored-at wall time)."""
    asked_from: list[float] = field(default_factory=list)

    def store(self, report: HandleReport) -> None:
        subject = f"{partition_prefix(S)}.{PART}.handle.{report.app}.{report.deployment}"
        self.stored.append((subject, encode(report), report.sent_at))

    async def subscribe(
        self, subject: str, *, stream: str, cb: Any, config: ConsumerConfig, **_: Any
    ) -> Any:
        assert config.deliver_policy is DeliverPolicy.BY_START_TIME
        assert config.opt_start_time is not None
        start = config.opt_start_time.timestamp()
        self.asked_from.append(start)
        head = subject.removesuffix(">")
        due = [m for m in self.stored if m[0].startswith(head) and m[2] >= start]
        for n, (stored_subject, data, at) in enumerate(due, 1):
            reply = f"$JS.ACK.{stream}.c.1.{n}.{n}.{round(at * 1e9)}.{len(due) - n}"
            await cb(SimpleNamespace(subject=stored_subject, data=data, reply=reply))
        return SimpleNamespace(unsubscribe=_nothing)


async def _nothing() -> None:
    return None


def record(clock: FakeClock, case: Case) -> FakeStream:
    """The history: handle reports every 0.2 s over the case's load, the last at the kill,
    `TAKEOVER_AFTER_S` before the clock's now."""
    stream = FakeStream()
    kill = clock.wall() - TAKEOVER_AFTER_S
    t = kill - sum(seconds for seconds, _ in case.load)
    seq = 0
    for seconds, queued in case.load:
        end = t + seconds
        while t < end - 1e-9:
            seq += 1
            stream.store(HandleReport("h1", APP, DEPLOYMENT, t, seq, queued, {}, (), 1))
            t += REPORT_EVERY_S
    return stream


async def previous_owner(svc: ControllerService, running: int) -> None:
    """The replicas the previous owner left in fp_targets and fp_membership, all running."""
    bus = FakeServer().connect("previous-owner")
    spec = app().deployments[0].replica_spec()
    for bucket, cls in ((buckets.TARGETS, ReplicaTarget), (buckets.MEMBERSHIP, Member)):
        kv = await bus.kv(bucket.name)
        svc._writers[bucket.name] = FencedWriter(kv, 0)
        docs: DocKV[Any] = DocKV(kv, cls)
        for slot in range(running):
            rid = f"{DEPLOYMENT}-{slot + 1}"
            rpc = S.rpc(APP, DEPLOYMENT, rid)
            doc: ReplicaTarget | Member = (
                ReplicaTarget(APP, DEPLOYMENT, rid, "a1", slot, slot + 1, "v1", rpc, spec)
                if cls is ReplicaTarget
                else Member(APP, DEPLOYMENT, slot, rid, rpc, slot + 1, 1)
            )
            await docs.put(doc.key, doc)


async def successor(clock: FakeClock, stream: FakeStream, case: Case) -> ControllerService:
    """A member that just won the partition's lease: restores, replays, until it acts."""
    cfg = ServiceConfig(nats_url="nats://unused:1", core=ControllerConfig(member_id="successor"))
    svc = ControllerService(cfg, clock=clock)
    svc.bus = SimpleNamespace(js=stream)  # type: ignore[assignment]
    svc.stream = "FP_REPORTS"
    await previous_owner(svc, case.running)
    svc._apply_app(APP, app().to_json())
    await svc._take_partition(PART, 2)
    for _ in range(10_000):  # an empty partition is caught up after a quiet moment
        if svc.live:
            return svc
        clock.advance(0.01)
        await asyncio.sleep(0.001)
    raise AssertionError("the partition never finished its catch-up")


def deployment(svc: ControllerService) -> ManagedDeployment:
    return svc.core.deployments[(APP, DEPLOYMENT)]


@pytest.mark.parametrize("name", sorted(CASES))
async def test_the_successor_decides_what_the_replayed_history_says(name: str) -> None:
    case = CASES[name]
    clock = FakeClock()
    stream = record(clock, case)
    taken_at = clock.wall()
    svc = await successor(clock, stream, case)
    m = deployment(svc)
    restored = m.state.target
    assert restored == case.running, "the previous owner's replicas were not restored"
    assert stream.asked_from, "the partition was never read"
    # no report arrives from here on: the successor only has what it replayed
    first: tuple[int, str] | None = None
    demand_seen: list[float] = []
    end = clock.monotonic() + WATCH_S
    while clock.monotonic() < end and first is None:
        clock.advance(TICK)
        await svc._tick()
        demand_seen.append(m.status_demand())
        if m.state.target != restored:
            first = (m.state.target, m.decision.reason)
    replayed_s = taken_at - min(stream.asked_from)
    assert first is not None and first[0] == case.decides, (
        f"the successor's first decision after the takeover: {first or 'none'} "
        f"(from {restored}, last decision {m.decision.reason!r}); the history says "
        f"{restored} -> {case.decides} (without it: {case.without_history}); "
        f"the partition was read from {replayed_s:.1f} s before the takeover"
    )
    assert set(demand_seen) == {case.demand}, f"demand from the history: {demand_seen}"

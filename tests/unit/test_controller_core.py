"""The controller core end to end on a simulated clock: reports in, KV writes and probes out."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from services.controller.core import (
    ControllerConfig,
    ControllerCore,
    DeleteKey,
    Event,
    Probe,
    PutStatus,
)
from services.controller.health_registry import ProbeOutcome
from services.controller.kv_delta import DeleteDoc, PutDoc
from services.controller.source_check import SOURCE_MISMATCH
from shared.appconfig import AppConfig, AutoscalingConfig, DeploymentConfig
from shared.kv import buckets, envelope
from shared.kv.membership import Member
from shared.kv.targets import ReplicaTarget
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.wire import encode
from shared.wire.columnar import handle_report_to_columnar
from shared.wire.messages import HandleReport, HealthStatus, Heartbeat, Lifecycle, ReplicaReport

TICK = 0.1
TARGETS, MEMBERS = buckets.TARGETS.name, buckets.MEMBERSHIP.name


def app_with(policy: AutoscalingConfig | None = None, num_replicas: int | None = None) -> AppConfig:
    dep = DeploymentConfig(
        name="Model",
        import_path="m:Model",
        health_check_period_s=1.0,
        health_check_timeout_s=1.0,
        num_replicas=num_replicas,
        autoscaling=policy,
    )
    return AppConfig("shop", (dep,), route_prefix="/shop", ingress="Model", version="v1")


FAST = AutoscalingConfig(
    min_replicas=0,
    max_replicas=4,
    target_ongoing_requests=2,
    upscale_delay_s=1.0,
    downscale_delay_s=2.0,
    downscale_to_zero_delay_s=2.0,
    look_back_period_s=1.0,
    metrics_interval_s=0.5,
)


class Sim:
    """The core on a simulated clock, with the fp_targets / fp_membership keys its writes build."""

    def __init__(
        self, app: AppConfig, core: ControllerCore | None = None, t: float = 100.0
    ) -> None:
        self.core = core or ControllerCore(ControllerConfig())
        self.t = t
        self.seq = 0
        self.kv: dict[tuple[str, str], ReplicaTarget | Member] = {}
        self.epochs: list[int] = []
        """The membership epoch after each tick that changed a member."""
        self.status: dict[str, Any] = {}
        self.actions: list[Any] = []
        self.writes: list[list[PutDoc | DeleteDoc]] = []
        """Each tick's fp_targets / fp_membership writes."""
        self.core.set_apps({app.name: app}, self.t)

    def wall(self) -> float:
        return 1_700_000_000.0 + self.t

    def run(self, seconds: float, **report: Any) -> None:
        end = self.t + seconds
        while self.t < end - 1e-9:
            if report:
                self.handle_report(**report)
            self.tick()

    def tick(self) -> list[Any]:
        self.t = round(self.t + TICK, 6)
        acts = self.core.tick(self.t, self.wall())
        self.actions += acts
        self.writes.append([a for a in acts if isinstance(a, PutDoc | DeleteDoc)])
        members_before = self.membership
        for a in acts:
            if isinstance(a, PutDoc):
                # what lands is what the document encodes to
                self.kv[(a.bucket, a.key)] = envelope.decode(envelope.encode(a.doc), type(a.doc))
            elif isinstance(a, DeleteDoc):
                assert (a.bucket, a.key) in self.kv, f"delete of a key never written: {a}"
                del self.kv[(a.bucket, a.key)]
            elif isinstance(a, PutStatus):
                self.status = {
                    "app": a.value.status,
                    **{k: v.status for k, v in a.value.deployments.items()},
                }
        if any(isinstance(a, PutDoc | DeleteDoc) and a.bucket == MEMBERS for a in acts):
            self.epochs.append(
                max(
                    m.state.membership_epoch
                    for m in (*self.core.deployments.values(), *self.core.deleting.values())
                ),
            )
        if self.membership != members_before:
            assert self.epochs, "the member set changed without a membership write"
        self.check_keys()
        return acts

    def check_keys(self) -> None:
        """Every value sits under its own key, and no two replicas share a slot."""
        for (_, key), doc in self.kv.items():
            doc.check_key(key)
        for bucket in (TARGETS, MEMBERS):
            slots = [(d.app, d.deployment, d.slot) for (b, _), d in self.kv.items() if b == bucket]
            assert len(slots) == len(set(slots))

    @property
    def targets(self) -> list[ReplicaTarget]:
        """fp_targets in start order."""
        docs = [d for (b, _), d in self.kv.items() if b == TARGETS]
        return sorted(docs, key=lambda d: d.order)  # type: ignore[return-value]

    @property
    def members(self) -> list[Member]:
        docs = [d for (b, _), d in self.kv.items() if b == MEMBERS]
        return sorted(docs, key=lambda d: d.order)  # type: ignore[return-value]

    @property
    def membership(self) -> list[str]:
        return [m.replica_id for m in self.members]

    def target_ids(self) -> list[str]:
        return [t.replica_id for t in self.targets]

    def handle_report(
        self,
        queued: float = 0.0,
        running: dict[str, float] | None = None,
        health: tuple[HealthStatus, ...] = (),
        handle: str = "h1",
        columnar: bool = False,
    ) -> None:
        self.seq += 1
        r = HandleReport(
            handle, "shop", "Model", self.wall(), self.seq, queued, running or {}, health, 1, {}
        )
        subject = S.report("handle", "shop", "Model")
        if columnar:
            for part in handle_report_to_columnar(r):
                self.core.ingest(subject, part, self.t)
        else:
            self.core.ingest(subject, encode(r), self.t)

    def lifecycle(self, rid: str, state: str) -> None:
        placed = {t.replica_id: t.agent_id for t in self.targets}
        ev = Lifecycle(
            rid,
            placed.get(rid, ""),
            state,
            self.wall(),
            S.rpc("shop", "Model", rid),
            "v1",
            None,
            "shop",
            "Model",
        )
        self.core.ingest(S.report("lifecycle", "shop", "Model"), encode(ev), self.t)

    def start_all(self) -> None:
        for rid in self.target_ids():
            if rid not in self.membership:
                self.lifecycle(rid, "starting")
                self.lifecycle(rid, "ready")
        self.tick()

    def healthy(self, rid: str, failures: int = 0) -> HealthStatus:
        return HealthStatus(rid, failures == 0, self.wall(), failures)


def test_created_at_zero_is_healthy_and_a_queued_request_wakes_it_at_once() -> None:
    sim = Sim(app_with(FAST))
    sim.tick()
    assert sim.target_ids() == [] and sim.status == {"app": "RUNNING", "Model": "HEALTHY"}
    sim.handle_report(queued=1.0)
    sim.tick()
    assert len(sim.target_ids()) == 1  # cold start: no upscale delay
    assert sim.status["Model"] == "UPSCALING"  # serviceable at zero while waking
    sim.start_all()
    assert sim.membership == sim.target_ids() and sim.epochs == [1]
    assert sim.status["Model"] == "HEALTHY"


def test_a_fixed_size_keeps_no_demand_window_and_autoscaling_starts_one_afresh() -> None:
    """No decision of a fixed size reads demand, so its window is neither sampled nor caught up
    at each input (a tenth of a member's CPU at 10,000 apps); switched to autoscaling, the
    deployment starts from an empty window, as a new one does, and scales on its load."""
    sim = Sim(app_with(num_replicas=2))
    sim.run(1.0)
    sim.start_all()
    sim.run(3.0, queued=3.0)
    m = sim.core.deployments[("shop", "Model")]
    assert m.window.last_time is None  # reports came and ticks passed: nothing sampled
    assert len(sim.target_ids()) == 2
    sim.core.update_app("shop", app_with(dataclasses.replace(FAST, min_replicas=1)), sim.t)
    sim.run(0.2, queued=3.0)
    assert m.window.last_time is not None  # sampled from the switch on
    sim.run(3.0, queued=30.0)
    assert len(sim.target_ids()) == FAST.max_replicas  # it scaled on the load it sees now


def test_load_scales_up_after_the_delay_and_idle_scales_to_zero() -> None:
    sim = Sim(app_with(FAST))
    sim.handle_report(queued=1.0)
    sim.tick()
    sim.start_all()
    (rid,) = sim.target_ids()
    sim.run(0.5, running={rid: 2.0}, queued=6.0)  # demand 8 / target 2 -> 4, but delay 1 s
    assert len(sim.target_ids()) == 1
    sim.run(1.0, running={rid: 2.0}, queued=6.0)
    assert len(sim.target_ids()) == 4
    decisions = [a for a in sim.actions if isinstance(a, Event) and a.kind == "decision"]
    assert any("upscale 1->4" in d.detail for d in decisions)
    sim.start_all()
    sim.run(1.5, running={r: 0.0 for r in sim.target_ids()})  # idle: not yet (downscale delay 2 s)
    assert len(sim.target_ids()) == 4
    sizes: list[tuple[float, int]] = []
    idle_from = sim.t - 1.5
    for _ in range(60):
        sim.run(0.1, running={r: 0.0 for r in sim.membership})
        if not sizes or sizes[-1][1] != len(sim.target_ids()):
            sizes.append((sim.t - idle_from, len(sim.target_ids())))
    # down to one after the downscale delay, then to zero after the to-zero delay
    assert [n for _, n in sizes] == [4, 1, 0]
    assert sizes[1][0] >= 2.0 and sizes[2][0] - sizes[1][0] >= 2.0 - 1e-6
    assert sim.membership == []


def test_columnar_and_object_reports_drive_the_same_decisions() -> None:
    runs = []
    for columnar in (False, True):
        sim = Sim(app_with(FAST))
        sim.handle_report(queued=1.0, columnar=columnar)
        sim.tick()
        sim.start_all()
        (rid,) = sim.target_ids()
        for _ in range(20):
            sim.handle_report(running={rid: 2.0}, queued=6.0, columnar=columnar)
            sim.tick()
        runs.append((sim.target_ids(), sim.epochs))
    assert runs[0] == runs[1]


def test_replica_reporting_three_failures_is_replaced() -> None:
    sim = Sim(app_with(num_replicas=2))
    sim.tick()
    sim.start_all()
    bad, good = sim.target_ids()
    sim.handle_report(health=(sim.healthy(good), sim.healthy(bad, failures=2)))
    sim.tick()
    assert bad in sim.target_ids()  # 2 failures: not yet
    sim.handle_report(health=(sim.healthy(good), sim.healthy(bad, failures=3)))
    sim.tick()
    assert bad not in sim.target_ids() and len(sim.target_ids()) == 2
    assert bad not in sim.membership
    assert any(isinstance(a, Event) and a.kind == "replica_unhealthy" for a in sim.actions)
    assert sim.status["Model"] == "UNHEALTHY"
    sim.start_all()
    assert sim.status["Model"] == "HEALTHY"


def test_silent_replica_is_probed_and_replaced_when_gone() -> None:
    sim = Sim(app_with(num_replicas=1))
    sim.tick()
    sim.start_all()
    (rid,) = sim.target_ids()
    probes: list[Probe] = []
    for _ in range(60):  # health carried at first, then silence
        if sim.t < 101.0:
            hb = Heartbeat(sim.healthy(rid), sim.wall())
            sim.core.ingest(S.report("heartbeat", "shop", "Model"), encode(hb), sim.t)
        probes += [a for a in sim.tick() if isinstance(a, Probe)]
    assert probes and probes[0].replica_id == rid
    assert len(probes) <= 3  # no probe storm for one replica
    sim.core.on_probe("shop", "Model", rid, ProbeOutcome.NO_RESPONDERS, None, sim.t)
    sim.tick()
    assert rid not in sim.target_ids() and len(sim.target_ids()) == 1


def test_a_probe_answer_keeps_a_quiet_replica() -> None:
    sim = Sim(app_with(num_replicas=1))
    sim.tick()
    sim.start_all()
    (rid,) = sim.target_ids()
    for _ in range(80):
        for a in sim.tick():
            if isinstance(a, Probe):
                sim.core.on_probe(
                    "shop", "Model", rid, ProbeOutcome.ANSWERED, sim.healthy(rid), sim.t
                )
    assert sim.target_ids() == [rid]


def test_restart_from_kv_keeps_replicas_and_does_not_scale_down_without_a_window() -> None:
    sim = Sim(app_with(FAST))
    sim.handle_report(queued=8.0)
    sim.tick()
    sim.run(1.5, queued=8.0)
    sim.start_all()
    assert len(sim.target_ids()) == 4
    old_epoch = max(m.epoch for m in sim.members)
    # a new controller process: only KV survives
    fresh = ControllerCore(ControllerConfig(owner_epoch=2))
    sim2 = Sim(app_with(FAST), core=fresh, t=sim.t)
    sim2.kv = dict(sim.kv)
    fresh.restore(sim.targets, sim.members, sim.t)
    sim2.tick()
    assert sim2.target_ids() == sim.target_ids()  # nothing lost, nothing restarted
    assert sim2.membership == sim.membership
    assert sim2.writes[-1] == []  # what was taken over is not written again
    statuses = [a.value for a in sim2.actions if isinstance(a, PutStatus)]
    assert statuses and all(v.owner_epoch == 2 for v in statuses)
    sim2.run(0.5)  # no reports yet: missing data is not zero load
    assert len(sim2.target_ids()) == 4
    # the next member change (one replica exits) carries a newer epoch than any the old owner wrote
    sim2.lifecycle(sim2.target_ids()[0], "exited")
    sim2.tick()
    assert sim2.epochs and sim2.epochs[-1] > old_epoch
    next_members = [
        a.doc for a in sim2.actions if isinstance(a, PutDoc) and isinstance(a.doc, Member)
    ]
    assert all(m.epoch > old_epoch for m in next_members)
    sim2.start_all()
    assert len(sim2.membership) == 4 and sim2.epochs[-1] > old_epoch


def test_garbage_is_counted_and_dropped() -> None:
    sim = Sim(app_with(num_replicas=1))
    subject = S.report("handle", "shop", "Model")
    sim.core.ingest(subject, b"FPC1 not arrow", sim.t)
    sim.core.ingest(subject, b"\xff\xff", sim.t)
    sim.core.ingest("fp.v1.report.bogus.shop.Model", b"", sim.t)
    sim.core.ingest(S.report("handle", "nope", "Model"), b"", sim.t)
    d = sim.core.stats.dropped
    assert sum(d.values()) == 4 and d["bad_subject"] == 1 and d["unknown_deployment"] == 1
    sim.tick()  # still works


def test_deleted_app_drains_to_zero_then_its_keys_go() -> None:
    sim = Sim(app_with(num_replicas=2))
    sim.tick()
    sim.start_all()
    running = sim.target_ids()
    sim.core.set_apps({}, sim.t)
    sim.tick()
    assert sim.target_ids() == [] and sim.status["app"] == "DELETING"
    for rid in running:
        sim.lifecycle(rid, "exited")
    acts = sim.tick()
    deleted = {(a.bucket, a.key) for a in acts if isinstance(a, DeleteKey)}
    assert ("fp_status", "shop") in deleted
    assert sim.kv == {}  # every target and member key of the app went with its replicas


@pytest.mark.parametrize("n", [1, 3])
def test_fixed_size_deployment_keeps_its_size(n: int) -> None:
    sim = Sim(app_with(num_replicas=n))
    sim.tick()
    sim.start_all()
    sim.run(5.0)
    assert len(sim.target_ids()) == n and sim.status["Model"] == "HEALTHY"


def agent(agent_id: str, capacity: int) -> Any:
    from shared.kv.agents import AgentInfo

    return AgentInfo(agent_id, capacity, 0, "host", 1, 0.0)


def test_replicas_spread_over_agents_within_capacity() -> None:
    sim = Sim(app_with(num_replicas=5))
    sim.core.on_agent(agent("a", 2), sim.t)
    sim.core.on_agent(agent("b", 2), sim.t)
    sim.tick()
    assigned = [t.agent_id for t in sim.targets]
    assert sorted(assigned) == ["", "a", "a", "b", "b"]  # the fifth waits for capacity
    sim.core.on_agent(agent("c", 4), sim.t)
    sim.tick()
    assert sorted(t.agent_id for t in sim.targets) == ["a", "a", "b", "b", "c"]
    # placing the fifth moves one key (unplaced -> c), the other four are not rewritten
    assert len(sim.writes[-1]) <= 2


def test_replicas_of_a_lost_agent_are_replaced_elsewhere() -> None:
    from shared.kv.agents import AGENT_TTL_S

    sim = Sim(app_with(num_replicas=2))
    sim.core.on_agent(agent("a", 4), sim.t)
    sim.core.on_agent(agent("b", 4), sim.t)
    sim.tick()
    sim.start_all()
    on_b = [t.replica_id for t in sim.targets if t.agent_id == "b"]
    assert len(on_b) == 1
    for _ in range(int(AGENT_TTL_S / TICK) + 2):  # only "a" keeps announcing itself
        sim.core.on_agent(agent("a", 4), sim.t)
        sim.tick()
    now = {t.replica_id: t.agent_id for t in sim.targets}
    assert on_b[0] not in now and sorted(now.values()) == ["a", "a"]


def test_all_agents_silent_at_once_is_not_a_mass_loss() -> None:
    from shared.kv.agents import AGENT_TTL_S

    sim = Sim(app_with(num_replicas=2))
    sim.core.on_agent(agent("a", 4), sim.t)
    sim.core.on_agent(agent("b", 4), sim.t)
    sim.tick()
    before = sim.target_ids()
    sim.run(AGENT_TTL_S + 1.0)  # nobody heard: our connection is the likelier culprit
    assert sim.target_ids() == before


def test_replica_ids_are_unique_across_apps_with_the_same_deployment_name() -> None:
    core = ControllerCore(ControllerConfig())
    a = app_with(num_replicas=2)
    b = AppConfig("blog", a.deployments, version="v1")
    core.set_apps({"shop": a, "blog": b}, 0.0)
    acts = core.tick(0.1, 1.0)
    ids = [
        x.doc.replica_id for x in acts if isinstance(x, PutDoc) and isinstance(x.doc, ReplicaTarget)
    ]
    assert len(ids) == 4 and len(set(ids)) == 4
    assert all(i.startswith(("shop-Model-", "blog-Model-")) for i in ids)


def test_replacing_one_replica_of_a_large_deployment_is_a_few_writes() -> None:
    sim = Sim(app_with(num_replicas=40))
    sim.core.on_agent(agent("a", 64), sim.t)
    sim.tick()
    sim.start_all()
    assert len(sim.membership) == 40
    bad = sim.target_ids()[17]
    sim.handle_report(health=(sim.healthy(bad, failures=3),))
    sim.tick()
    writes = sim.writes[-1]
    assert bad not in sim.target_ids() and len(sim.target_ids()) == 40
    # the bad replica's target and member go, its replacement's target comes: not 40 of each
    assert 1 <= len(writes) <= 4
    (new,) = set(sim.target_ids()) - set(sim.membership)
    touched = {a.doc.replica_id for a in writes if isinstance(a, PutDoc)}
    assert touched <= {new}
    assert sum(isinstance(a, DeleteDoc) for a in writes) <= 2
    sim.start_all()
    assert [type(a) for a in sim.writes[-1]] == [PutDoc]  # one member put when it is ready
    assert len(sim.membership) == 40
    # slots stay bounded by the deployment's size
    assert {t.slot for t in sim.targets} == set(range(40))


def test_a_replica_speaking_for_a_sibling_is_dropped() -> None:
    """Its subject names it (`...Model.{its id}`: the auth callout lets it publish no other);
    reports, heartbeats and lifecycle events whose payload names its sibling change nothing."""
    sim = Sim(app_with(num_replicas=2))
    sim.tick()
    me, sibling = sim.target_ids()
    for rid in (me, sibling):
        ready = Lifecycle(rid, "", "ready", sim.wall(), S.rpc("shop", "Model", rid), "v1", None,
                          "shop", "Model")  # fmt: skip
        sim.core.ingest(S.report("lifecycle", "shop", "Model", rid), encode(ready), sim.t)
    sim.tick()
    assert sorted(sim.membership) == sorted([me, sibling])
    mine = {k: S.report(k, "shop", "Model", me) for k in ("replica", "heartbeat", "lifecycle")}
    unhealthy = HealthStatus(sibling, False, sim.wall(), 5)
    sim.core.ingest(mine["heartbeat"], encode(Heartbeat(unhealthy, sim.wall())), sim.t)
    forged = ReplicaReport(sibling, sim.wall(), 1, 500.0, {}, unhealthy)
    sim.core.ingest(mine["replica"], encode(forged), sim.t)
    exited = Lifecycle(sibling, "", "exited", sim.wall(), "", "v1", 1, "shop", "Model")
    sim.core.ingest(mine["lifecycle"], encode(exited), sim.t)
    sim.tick()
    assert sim.core.stats.dropped[SOURCE_MISMATCH] == 3
    assert sibling in sim.membership and sibling in sim.target_ids()  # still there, unharmed
    # speaking for itself on its own subject is fine
    own = ReplicaReport(me, sim.wall(), 1, 1.0, {}, sim.healthy(me))
    sim.core.ingest(mine["replica"], encode(own), sim.t)
    assert sim.core.stats.dropped[SOURCE_MISMATCH] == 3


def test_lifecycle_speaking_for_another_deployment_is_dropped() -> None:
    """The subject names the sender's deployment (the auth callout binds it to the sender); a
    payload naming another deployment, or announcing another rpc subject, changes nothing."""
    sim = Sim(app_with(num_replicas=1))
    sim.tick()
    (rid,) = sim.target_ids()
    subject = S.report("lifecycle", "shop", "Model")

    def ready(rpc: str, app: str = "shop", dep: str = "Model") -> bytes:
        return encode(Lifecycle(rid, "", "ready", sim.wall(), rpc, "v1", None, app, dep))

    sim.core.ingest(subject, ready(S.rpc("other", "Model", rid)), sim.t)
    sim.core.ingest(subject, ready(S.rpc("shop", "Model", "someone-else")), sim.t)
    sim.core.ingest(subject, ready(S.rpc("shop", "Model", rid), app="other"), sim.t)
    sim.tick()
    assert sim.core.stats.dropped[SOURCE_MISMATCH] == 3
    assert sim.membership == []  # none of them made it a member
    sim.core.ingest(subject, ready(S.rpc("shop", "Model", rid)), sim.t)
    sim.tick()
    assert sim.membership == [rid]

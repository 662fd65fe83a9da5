"""Placement within what agents offer: resources, fractional GPUs, devices, max_replicas_per_node.

The controller core on a fake clock, with agents announcing different offers; what its writes
build in fp_targets is what an agent would read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.agent.core import replica_env
from services.controller.capacity import Ledger, Request
from services.controller.core import ControllerConfig, ControllerCore, PutStatus
from services.controller.deployment_state import STARTUP_TIMEOUT_S
from services.controller.kv_delta import DeleteDoc, PutDoc
from shared import resources as res
from shared.appconfig import AppConfig, AutoscalingConfig, DeploymentConfig
from shared.kv import buckets, envelope
from shared.kv.agents import AGENT_TTL_S, AgentInfo
from shared.kv.targets import ReplicaTarget
from shared.subjects import Subjects
from shared.wire.codec import encode
from shared.wire.messages import HandleReport, Lifecycle

TICK = 0.1
S = Subjects("fp")
TARGETS = buckets.TARGETS.name


def dep(name: str, n: int, asked: Mapping[str, float], per_node: int | None = None) -> Any:
    return DeploymentConfig(
        name, "m:Model", num_replicas=n, resources=dict(asked), max_replicas_per_node=per_node
    )


def app(*deployments: DeploymentConfig) -> AppConfig:
    return AppConfig("ml", tuple(deployments), version="v1")


def agent(agent_id: str, slots: int = 8, **offer: float) -> AgentInfo:
    return AgentInfo(agent_id, slots, 0, "host", 1, 0.0, offer)


class Fleet:
    def __init__(self, config: AppConfig, agents: list[AgentInfo]) -> None:
        self.core = ControllerCore(ControllerConfig())
        self.t = 100.0
        self.agents = list(agents)
        self.kv: dict[str, ReplicaTarget] = {}
        self.status: dict[str, tuple[str, str]] = {}
        self.writes: list[int] = []
        self.core.set_apps({config.name: config}, self.t)
        self.announce()

    def announce(self) -> None:
        for a in self.agents:
            self.core.on_agent(a, self.t)

    def tick(self, n: int = 1) -> None:
        for _ in range(n):
            self.t = round(self.t + TICK, 6)
            if round(self.t * 10) % 20 == 0:
                self.announce()  # every 2 s, as agents do (TTL/3 or sooner)
            writes = 0
            for a in self.core.tick(self.t, 1.7e9 + self.t):
                if isinstance(a, PutDoc) and a.bucket == TARGETS:
                    self.kv[a.key] = envelope.decode(envelope.encode(a.doc), ReplicaTarget)
                    writes += 1
                elif isinstance(a, DeleteDoc) and a.bucket == TARGETS:
                    del self.kv[a.key]
                    writes += 1
                elif isinstance(a, PutStatus):
                    for d, v in a.value.deployments.items():
                        self.status[d] = (v.status, v.message)
            self.writes.append(writes)

    def placed(self, deployment: str) -> list[ReplicaTarget]:
        return sorted(
            (t for t in self.kv.values() if t.deployment == deployment and t.agent_id),
            key=lambda t: t.order,
        )

    def unplaced(self, deployment: str) -> list[ReplicaTarget]:
        return [t for t in self.kv.values() if t.deployment == deployment and not t.agent_id]

    def lifecycle(self, t: ReplicaTarget, state: str) -> None:
        ev = Lifecycle(t.replica_id, t.agent_id, state, 1.7e9 + self.t,
                       S.rpc("ml", t.deployment, t.replica_id), t.version, None,
                       "ml", t.deployment)  # fmt: skip
        self.core.ingest(S.report("lifecycle", "ml", t.deployment), encode(ev), self.t)

    def start_all(self) -> None:
        for t in list(self.kv.values()):
            if t.agent_id:
                self.lifecycle(t, "starting")
                self.lifecycle(t, "ready")
        self.tick()


def devices_by_agent(targets: list[ReplicaTarget]) -> list[tuple[str, tuple[int, ...]]]:
    return [(t.agent_id, t.devices) for t in targets]


def test_what_fits_is_placed_and_what_does_not_waits_with_a_message_naming_the_resource() -> None:
    f = Fleet(app(dep("Model", 3, {"gpus": 1})), [agent("a", cpus=4), agent("b", cpus=4, gpus=2)])
    f.tick()
    assert devices_by_agent(f.placed("Model")) == [("b", (0,)), ("b", (1,))]
    assert len(f.unplaced("Model")) == 1
    status, message = f.status["Model"]
    assert status == "UPDATING"
    assert "cannot be placed" in message and "gpus 1 free" in message and "most: 0 on" in message


def test_a_resource_no_agent_offers_is_named_with_what_to_do() -> None:
    f = Fleet(app(dep("Model", 1, {"tpu": 1})), [agent("a", cpus=4)])
    f.tick()
    assert f.unplaced("Model") and not f.placed("Model")
    message = f.status["Model"][1]
    assert "no live agent offers 'tpu'" in message and "--resource tpu=AMOUNT" in message


def test_a_waiting_replica_never_times_out_fails_or_costs_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    f = Fleet(app(dep("Model", 2, {"gpus": 1})), [agent("b", gpus=1)])
    f.tick()
    f.start_all()
    f.writes.clear()
    tries: list[object] = []
    choose = Ledger.choose
    monkeypatch.setattr(Ledger, "choose", lambda *a: tries.append(a) or choose(*a))
    f.tick(int((STARTUP_TIMEOUT_S * 3) / TICK))  # longer than three start timeouts
    assert f.status["Model"][0] == "UPDATING"  # not DEPLOY_FAILED: waiting is no crash loop
    assert len(f.placed("Model")) == 1 and len(f.unplaced("Model")) == 1
    assert sum(f.writes) == 0  # the same unplaced key, never rewritten
    assert tries == []  # nothing changed on the agents: not tried again, tick after tick


def test_fractional_gpus_pack_onto_one_device_until_it_is_full() -> None:
    f = Fleet(app(dep("Model", 6, {"gpus": 0.25})), [agent("b", gpus=2)])
    f.tick()
    assert [t.devices for t in f.placed("Model")] == [(0,)] * 4 + [(1,)] * 2
    env = [replica_env(t, None)[res.GPU_ENV] for t in f.placed("Model")]
    assert env == ["0"] * 4 + ["1"] * 2


def test_ten_tenths_fill_a_device_exactly() -> None:
    f = Fleet(app(dep("Model", 11, {"gpus": 0.1})), [agent("b", slots=16, gpus=1)])
    f.tick()
    assert len(f.placed("Model")) == 10 and len(f.unplaced("Model")) == 1


def test_whole_gpus_get_devices_of_their_own_distinct_per_replica() -> None:
    f = Fleet(
        app(dep("Big", 2, {"gpus": 2}), dep("Small", 1, {"gpus": 0.5})),
        [agent("b", gpus=5)],
    )
    f.tick()
    big = f.placed("Big")
    small = f.placed("Small")
    assert [t.devices for t in big] == [(0, 1), (2, 3)]
    assert [t.devices for t in small] == [(4,)]
    values = [replica_env(t, None)[res.GPU_ENV] for t in big]
    assert values == ["0,1", "2,3"]
    # an agent started with CUDA_VISIBLE_DEVICES=4,5,6,7,9 offers those: indices name them
    assert replica_env(big[1], "4,5,6,7,9")[res.GPU_ENV] == "6,7"
    assert res.GPU_ENV not in replica_env(ReplicaTarget(
        "ml", "X", "r", "b", 0, 0, "v", "s", big[0].spec), None)  # fmt: skip


def test_a_shared_device_is_not_given_to_a_whole_gpu_request() -> None:
    f = Fleet(
        app(dep("Frac", 1, {"gpus": 0.5}), dep("Whole", 2, {"gpus": 1})), [agent("b", gpus=2)]
    )
    f.tick()
    assert [t.devices for t in f.placed("Frac")] == [(0,)]
    assert [t.devices for t in f.placed("Whole")] == [(1,)]
    assert len(f.unplaced("Whole")) == 1
    assert "gpus" in f.status["Whole"][1]


def test_scale_to_zero_frees_the_capacity_for_another_deployment() -> None:
    idle_to_zero = AutoscalingConfig(
        min_replicas=0, max_replicas=2, initial_replicas=2, downscale_delay_s=1.0,
        downscale_to_zero_delay_s=1.0, look_back_period_s=1.0, metrics_interval_s=0.5,
    )  # fmt: skip
    a = DeploymentConfig("A", "m:Model", resources={"gpus": 1}, autoscaling=idle_to_zero)
    f = Fleet(app(a, dep("B", 1, {"gpus": 1})), [agent("b", gpus=2)])
    f.tick()
    f.start_all()
    assert len(f.placed("A")) == 2 and f.unplaced("B")
    assert "gpus 1 free" in f.status["B"][1]
    for seq in range(1, 61):  # no load at all: A goes to zero
        running = {rid: 0.0 for rid in f.core.deployments[("ml", "A")].state.replicas}
        report = HandleReport("h", "ml", "A", 1.7e9 + f.t, seq, 0.0, running, (), 1, {})
        f.core.ingest(S.report("handle", "ml", "A"), encode(report), f.t)
        f.tick()
    assert not f.placed("A") and f.core.deployments[("ml", "A")].state.target == 0
    assert f.unplaced("B")  # draining: the devices are held until the processes exit
    for rid in list(f.core.deployments[("ml", "A")].state.replicas):
        ev = Lifecycle(rid, "b", "exited", 1.7e9 + f.t, S.rpc("ml", "A", rid), "v", 0, "ml", "A")
        f.core.ingest(S.report("lifecycle", "ml", "A"), encode(ev), f.t)
    f.tick()
    assert [t.devices for t in f.placed("B")] == [(0,)]
    assert f.core.placement.ledger.used[0, 0] == res.UNIT  # one replica slot in use


def test_max_replicas_per_node_is_honoured() -> None:
    f = Fleet(app(dep("Model", 3, {}, per_node=1)), [agent("a"), agent("b")])
    f.tick()
    assert sorted(t.agent_id for t in f.placed("Model")) == ["a", "b"]
    assert len(f.unplaced("Model")) == 1
    assert "max_replicas_per_node 1" in f.status["Model"][1]
    f.agents.append(agent("c"))
    f.announce()  # a new agent makes room: the waiting replica goes there
    f.tick()
    assert sorted(t.agent_id for t in f.placed("Model")) == ["a", "b", "c"]


def test_cpus_and_memory_are_placement_requests_and_spread_over_agents() -> None:
    gib = 2.0**30
    f = Fleet(
        app(dep("Model", 4, {"cpus": 2, "memory": 3 * gib})),
        [agent("a", cpus=4, memory=8 * gib), agent("b", cpus=8, memory=4 * gib)],
    )
    f.tick()
    assert sorted(t.agent_id for t in f.placed("Model")) == ["a", "a", "b"]
    message = f.status["Model"][1]
    assert "memory" in message or "cpus" in message


def test_the_replicas_of_a_lost_agent_free_what_they_held() -> None:
    f = Fleet(app(dep("Model", 2, {"gpus": 1})), [agent("a", gpus=1), agent("b", gpus=1)])
    f.tick()
    f.start_all()
    f.agents = [agent("a", gpus=1), agent("c", gpus=1)]  # b stops announcing, c comes
    f.tick(int(AGENT_TTL_S / TICK) + 5)
    assert sorted(t.agent_id for t in f.placed("Model")) == ["a", "c"]
    ledger = f.core.placement.ledger
    assert ledger.used[ledger.rows["b"], ledger.cols["gpus"]] == 0


def test_a_new_owner_accounts_for_what_the_old_one_placed() -> None:
    config = app(dep("Model", 2, {"gpus": 1}))
    f = Fleet(config, [agent("b", gpus=2)])
    f.tick()
    successor = ControllerCore(ControllerConfig())
    successor.set_apps({"ml": config}, f.t)
    successor.restore(f.kv.values(), [], f.t)
    successor.on_agent(agent("b", gpus=2), f.t)
    ledger = successor.placement.ledger
    assert ledger.used[ledger.rows["b"], ledger.cols["gpus"]] == 2 * res.UNIT
    fits = ledger.fits(Request.of({"gpus": 1}), ("ml", "Other"), None, f.t)
    assert not fits.any()


def test_no_agent_at_all_after_placement_turned_on_waits_for_one() -> None:
    f = Fleet(app(dep("Model", 1, {})), [agent("a", slots=0)])
    f.tick()
    assert f.unplaced("Model")
    assert "--max-replicas" in f.status["Model"][1]


@pytest.mark.parametrize(
    ("free", "units", "want"),
    [
        ([10_000, 10_000], 2_500, (0,)),
        ([7_500, 10_000], 2_500, (0,)),  # best fit: the fuller device
        ([2_000, 10_000], 2_500, (1,)),
        ([10_000, 5_000, 10_000], 20_000, (0, 2)),
        ([5_000, 5_000], 10_000, None),  # half of two devices is no whole device
        ([10_000], 0, ()),
    ],
)
def test_fit_devices(free: list[int], units: int, want: tuple[int, ...] | None) -> None:
    assert res.fit_devices(free, units) == want


def test_ledger_releases_exactly_what_it_assigned() -> None:
    ledger = Ledger()
    ledger.offer_from("a", 4, {"gpus": 1.0, "cpus": 8.0}, 0.0)
    req = Request.of({"gpus": 0.3, "cpus": 1.5})
    spots = []
    for i in range(3):
        spot = ledger.choose(req, ("x", "y"), None, 1.0)
        assert spot is not None
        ledger.assign(f"r{i}", ("x", "y"), req, spot)
        spots.append(spot)
    assert ledger.choose(req, ("x", "y"), None, 1.0) is None  # 0.9 GPU used, 0.3 more won't fit
    epoch = ledger.epoch
    for i in range(3):
        ledger.release(f"r{i}")
    assert ledger.epoch > epoch and not ledger.used.any()
    assert ledger.choose(req, ("x", "y"), None, 1.0) is not None


def test_a_waiting_replica_that_is_no_longer_wanted_goes_at_once() -> None:
    f = Fleet(app(dep("Model", 2, {"gpus": 1})), [agent("b", gpus=1)])
    f.tick()
    f.start_all()
    f.core.set_apps({}, f.t)  # deleted: the running one drains, the waiting one has no process
    f.tick()
    (m,) = f.core.deleting.values()
    assert [r.agent_id for r in m.state.replicas.values()] == ["b"]
    assert not f.unplaced("Model")
    (running,) = m.state.replicas
    ev = Lifecycle(running, "b", "exited", 1.7e9 + f.t, S.rpc("ml", "Model", running), "v1", 0,
                   "ml", "Model")  # fmt: skip
    f.core.ingest(S.report("lifecycle", "ml", "Model"), encode(ev), f.t)
    f.tick()
    assert not f.core.deleting  # the delete finished
    assert not f.core.placement.ledger.used.any()


_REQUESTS = st.sampled_from(
    [{}, {"gpus": 0.25}, {"gpus": 0.5}, {"gpus": 1.0}, {"gpus": 2.0}, {"cpus": 1.5}, {"nvme": 1.0}]
)


@settings(max_examples=150, deadline=None)
@given(
    offers=st.lists(
        st.tuples(st.integers(0, 6), st.integers(0, 4), st.sampled_from([0.0, 2.0, 8.0])),
        min_size=1, max_size=4,
    ),
    steps=st.lists(st.tuples(st.booleans(), _REQUESTS, st.integers(0, 30)), max_size=60),
)  # fmt: skip
def test_the_ledger_never_overcommits_and_devices_stay_distinct(
    offers: list[tuple[int, int, float]], steps: list[tuple[bool, dict[str, float], int]]
) -> None:
    ledger = Ledger()
    for i, (slots, gpus, cpus) in enumerate(offers):
        ledger.offer_from(f"a{i}", slots, {"gpus": float(gpus), "cpus": cpus}, 0.0)
    live: dict[str, tuple[str, Request, tuple[int, ...]]] = {}
    for n, (add, asked, pick) in enumerate(steps):
        if add:
            req = Request.of(asked)
            spot = ledger.choose(req, ("x", "y"), 2, 1.0)
            if spot is not None:
                ledger.assign(f"r{n}", ("x", "y"), req, spot)
                live[f"r{n}"] = (spot.agent_id, req, spot.devices)
        elif live:
            rid = sorted(live)[pick % len(live)]
            ledger.release(rid)
            del live[rid]
        assert (ledger.used <= ledger.offer).all() and (ledger.used >= 0).all()
        for agent_id, row in ledger.rows.items():
            mine = [v for v in live.values() if v[0] == agent_id]
            assert ledger.used[row, 0] == len(mine) * res.UNIT
            assert len(mine) <= 2  # max_replicas_per_node
            whole = [d for _, r, devs in mine if r.gpu_units >= res.UNIT for d in devs]
            shared = {d for _, r, devs in mine if 0 < r.gpu_units < res.UNIT for d in devs}
            assert len(whole) == len(set(whole)) and not set(whole) & shared
            free = ledger._devices[row]
            assert ((free >= 0) & (free <= res.UNIT)).all()
    for rid in list(live):
        ledger.release(rid)
    assert not ledger.used.any()


def test_a_replica_placed_after_waiting_times_out_a_start_timeout_after_its_placement() -> None:
    """Its start clock runs from placement, and a timer does: the deployment is not visited at
    every tick while its replicas start."""
    f = Fleet(app(dep("Model", 2, {"gpus": 1})), [agent("b", gpus=1)])
    f.tick()
    f.start_all()  # one runs, one waits for room
    f.tick(int(STARTUP_TIMEOUT_S * 1.5 / TICK))  # waits longer than a start timeout
    (waiting,) = f.unplaced("Model")
    f.agents.append(agent("c", gpus=1))  # room arrives: the waiting one is placed there
    f.announce()
    f.tick(2)
    assert [t.agent_id for t in f.placed("Model") if t.replica_id == waiting.replica_id] == ["c"]
    f.tick(int(STARTUP_TIMEOUT_S / TICK) - 20)  # it never says starting or ready
    assert waiting.replica_id in {t.replica_id for t in f.placed("Model")}
    f.tick(40)
    assert waiting.replica_id not in {t.replica_id for t in f.placed("Model")}  # timed out

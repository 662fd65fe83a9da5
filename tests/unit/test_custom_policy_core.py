"""A custom policy inside the controller core: replica reports' custom values drive the target."""

from __future__ import annotations

from services.controller.core import Event
from shared.appconfig import AutoscalingConfig
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.wire import encode
from shared.wire.messages import ReplicaReport
from tests.unit.test_controller_core import Sim, app_with

KV_POLICY = "services.examples.kv_policy:scale_on_kv_cache"


def scaling(policy: str) -> AutoscalingConfig:
    return AutoscalingConfig(
        min_replicas=1, max_replicas=4, look_back_period_s=1.0, metrics_interval_s=0.5,
        policy=policy,
    )  # fmt: skip


def report_all(sim: Sim, **custom: float) -> None:
    for rid in sim.membership:
        sim.seq += 1
        r = ReplicaReport(rid, sim.wall(), sim.seq, 0.0, dict(custom), sim.healthy(rid))
        sim.core.ingest(S.report("replica", "shop", "Model"), encode(r), sim.t)


def run(sim: Sim, seconds: float, **custom: float) -> None:
    end = sim.t + seconds
    while sim.t < end - 1e-9:
        report_all(sim, **custom)
        sim.start_all()


def target(sim: Sim) -> int:
    return sim.core.deployments[("shop", "Model")].state.target


def test_custom_metric_alone_scales_up_and_down_with_no_request_demand() -> None:
    sim = Sim(app_with(scaling(KV_POLICY)))
    sim.start_all()
    assert target(sim) == 1
    run(sim, 3.0, kv_cache_use=0.9)  # mean 0.9 over a target of 0.6: one more each round
    assert target(sim) == 4 and len(sim.membership) == 4
    m = sim.core.deployments[("shop", "Model")]
    assert m.metrics.total_demand() == 0.0  # no request: the custom metric alone
    assert m.decision.rule == "custom" and KV_POLICY in m.decision.reason
    run(sim, 2.0, kv_cache_use=0.1)
    assert target(sim) == 1
    decisions = [a for a in sim.actions if isinstance(a, Event) and a.kind == "decision"]
    assert {a.rule for a in decisions} == {"custom"}
    assert {a.direction for a in decisions} == {"up", "down"}


def test_a_policy_that_cannot_be_imported_falls_back_and_says_so() -> None:
    sim = Sim(app_with(scaling("nowhere.at_all:policy")))
    sim.start_all()
    run(sim, 1.0, kv_cache_use=0.9)
    m = sim.core.deployments[("shop", "Model")]
    assert target(sim) == 1 and m.decision.rule == "custom_fallback"
    assert "nowhere.at_all:policy not_loaded" in m.status_view().last_decision
    events = [a for a in sim.actions if isinstance(a, Event) and a.kind.startswith("custom")]
    assert [e.kind for e in events] == ["custom_policy_fallback"]  # rate-limited: one per 10 s
    assert events[0].app == "shop" and "ModuleNotFoundError" in events[0].detail

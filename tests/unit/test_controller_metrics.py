"""The controller's Prometheus metrics move when the things they count happen."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from prometheus_client import REGISTRY

from services.controller.core import ControllerConfig, Event
from services.controller.metrics import Exporter
from services.controller.service import ControllerService, ServiceConfig
from shared.kv.status import AppStatusView, DeploymentStatusView
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.wire import encode
from shared.wire.columnar import handle_report_to_columnar
from shared.wire.messages import HandleReport, HealthStatus, Heartbeat
from tests.unit.test_controller_core import FAST, Sim, app_with


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Delta:
    """Sample values now, to compare with later (the default registry is process-wide)."""

    def __init__(self, *samples: tuple[str, dict[str, str]]) -> None:
        self.samples = samples
        self.before = [value(n, **lb) for n, lb in samples]

    def __call__(self) -> list[float]:
        return [value(n, **lb) - b for (n, lb), b in zip(self.samples, self.before, strict=True)]


def rejected(reason: str) -> tuple[str, dict[str, str]]:
    return "fleetpulse_controller_rejected_total", {"reason": reason}


def test_rejected_counts_invalid_stale_and_duplicate_reports_by_reason() -> None:
    sim = Sim(app_with(num_replicas=1))
    sim.tick()
    sim.start_all()
    delta = Delta(
        rejected("bad_subject"),
        rejected("unknown_deployment"),
        rejected("stale"),
        rejected("duplicate"),
        ("fleetpulse_controller_bad_input_total", {"reason": "bad_subject"}),
        ("fleetpulse_controller_bad_input_total", {"reason": "stale"}),
    )
    sim.core.ingest("fp.v1.report.bogus.shop.Model", b"", sim.t)
    sim.core.ingest(S.report("handle", "nope", "Model"), b"", sim.t)
    sim.handle_report()  # seq 1, accepted
    sim.handle_report()  # seq 2, accepted
    sim.seq = 1
    sim.handle_report()  # seq 2 again at the same sent_at: a duplicate
    sim.seq = 0
    sim.handle_report()  # seq 1 after seq 2: stale
    exporter = Exporter()
    exporter.tick(sim.core.stats, sim.core.stall_state, {})
    assert delta() == [1, 1, 1, 1, 1, 0]  # stale is no invalid input
    exporter.tick(sim.core.stats, sim.core.stall_state, {})
    assert delta() == [1, 1, 1, 1, 1, 0]  # exported once, not once per tick


def nats_msg(subject: str, data: bytes, pending: int = 0) -> Any:
    """A delivered JetStream message: its ack subject carries the stored time and what is
    pending behind it."""
    stored_ns = int(datetime.now(UTC).timestamp() * 1e9)
    reply = f"$JS.ACK.FP_REPORTS.c1.1.7.7.{stored_ns}.{pending}"
    return SimpleNamespace(subject=subject, data=data, reply=reply)


def test_the_service_counts_messages_and_bytes_by_kind_and_format() -> None:
    svc = ControllerService(ServiceConfig(nats_url="nats://unused", core=ControllerConfig()))
    report = HandleReport("h", "shop", "Model", 1.0, 1, 0.0, {"r1": 1.0}, (), 1, {})
    columnar = handle_report_to_columnar(report)
    msgpack = encode(report)
    beat = encode(Heartbeat(HealthStatus("r1", True, 1.0, 0), 1.0))
    ingest = "fleetpulse_controller_ingest_messages_total"
    size = "fleetpulse_controller_ingest_bytes_total"
    delta = Delta(
        (ingest, {"kind": "handle", "format": "columnar"}),
        (ingest, {"kind": "handle", "format": "msgpack"}),
        (ingest, {"kind": "heartbeat", "format": "msgpack"}),
        (ingest, {"kind": "other", "format": "msgpack"}),
        (size, {"kind": "handle", "format": "columnar"}),
        (size, {"kind": "handle", "format": "msgpack"}),
        ("fleetpulse_controller_heartbeats_received_total", {}),
        rejected("unknown_deployment"),
        ("fleetpulse_controller_ingest_pending", {"partition": "3"}),
    )
    handle = S.report("handle", "shop", "Model")
    for part in columnar:
        svc._on_msg(3, nats_msg(handle, part))
    svc._on_msg(3, nats_msg(handle, msgpack))
    svc._on_msg(3, nats_msg(S.report("heartbeat", "shop", "Model"), beat))
    svc._on_msg(3, nats_msg("fp.v1.report." + "x" * 40 + ".shop.Model", b"junk", pending=7))
    assert delta() == [0] * 9  # nothing reaches Prometheus before the tick
    svc.exporter.tick(svc.core.stats, svc.core.stall_state, svc._pending)
    n = len(columnar)
    assert delta() == [
        n, 1, 1, 1, sum(map(len, columnar)), len(msgpack), 1, n + 2, 7,
    ]  # fmt: skip


def test_decisions_carry_direction_and_rule() -> None:
    sim = Sim(app_with(FAST))
    labels = {"app": "shop", "deployment": "Model", "rule": "upscale", "direction": "up"}
    delta = Delta(
        ("fleetpulse_controller_decisions_total", labels),
        ("fleetpulse_controller_decisions_total", {**labels, "rule": "cold_start"}),
    )
    sim.handle_report(queued=1.0)
    sim.tick()  # cold start: 0 -> 1
    sim.start_all()
    (rid,) = sim.target_ids()
    sim.run(1.5, running={rid: 2.0}, queued=6.0)  # upscale 1 -> 4 after the delay
    exporter = Exporter()
    decisions = [a for a in sim.actions if isinstance(a, Event) and a.kind == "decision"]
    for a in sim.actions:
        if isinstance(a, Event):
            exporter.event(a)
    assert [(d.direction, d.rule) for d in decisions] == [("up", "cold_start"), ("up", "upscale")]
    assert delta() == [1, 1]


def test_verdicts_count_by_reason_and_health_gauges_follow_the_tick() -> None:
    sim = Sim(app_with(num_replicas=2))
    sim.tick()
    sim.start_all()
    bad, good = sim.target_ids()
    verdicts = "fleetpulse_controller_health_verdicts_total"
    delta = Delta((verdicts, {"reason": "failures"}), (verdicts, {"reason": "agent_lost"}))
    sim.handle_report(health=(sim.healthy(good), sim.healthy(bad, failures=3)))
    sim.tick()
    exporter = Exporter()
    for a in sim.actions:
        if isinstance(a, Event):
            exporter.event(a)
    exporter.event(Event("replica_unhealthy", "shop", "Model", "r9", "agent a-1 lost"))
    assert delta() == [1, 1]
    exporter.tick(sim.core.stats, sim.core.stall_state, {0: 0})
    stats = sim.core.stats
    assert value("fleetpulse_controller_health_replicas", state="stale") == stats.stale
    assert value("fleetpulse_controller_health_replicas", state="fresh") == (
        stats.known - stats.stale
    )
    assert stats.known >= 1
    assert value("fleetpulse_controller_partitions_owned") == 1


def status(app: str, **deployments: tuple[int, int, int, int]) -> AppStatusView:
    views = {
        name: DeploymentStatusView("HEALTHY", "", t, r, 1.5, h, u, "")
        for name, (t, r, h, u) in deployments.items()
    }
    return AppStatusView(app, "RUNNING", None, None, 0.0, 1, views)


def test_replica_gauges_follow_statuses_and_go_with_the_app() -> None:
    exporter = Exporter()

    def replicas(deployment: str, state: str) -> float | None:
        return REGISTRY.get_sample_value(
            "fleetpulse_controller_replicas",
            {"app": "gauged", "deployment": deployment, "state": state},
        )

    exporter.status(status("gauged", A=(3, 2, 2, 0), B=(1, 1, 0, 1)))
    assert [replicas("A", s) for s in ("target", "running", "healthy", "unhealthy")] == [3, 2, 2, 0]
    assert replicas("B", "unhealthy") == 1
    assert (
        REGISTRY.get_sample_value(
            "fleetpulse_controller_demand", {"app": "gauged", "deployment": "A"}
        )
        == 1.5
    )
    exporter.status(status("gauged", A=(4, 3, 3, 0)))  # B was deleted
    assert replicas("A", "target") == 4 and replicas("B", "target") is None
    exporter.forget_partition(7, lambda app: 7)  # handed over to another member
    assert replicas("A", "target") is None

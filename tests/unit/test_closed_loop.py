"""The closed-loop what-if: calibration from request stats, the queueing model, tune."""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
from pathlib import Path

import pytest

from services.whatif import closedloop
from services.whatif.__main__ import main as recorder_main
from services.whatif.calibrate import calibrate
from services.whatif.run import load_app_configs
from services.whatif.simulate import ModelOptions, run_deployment
from services.whatif.tune import Rule, candidates, frontier, parse_slo, tune, tuned_yaml
from shared.appconfig import AutoscalingConfig
from shared.errors import UsageError, WireError
from shared.wire.codec import encode
from shared.wire.messages import HandleReport
from tests.replay import queue_recording as q

KEY = "queue.d000"


def rows(**kw: object) -> list[tuple[int, str, bytes]]:
    return [(round((q.START + t) * 1e6), s, p) for t, s, p in q.messages(**kw)]  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def cal_rows() -> list[tuple[int, str, bytes]]:
    return rows(peak=40.0)


def cfg(**kw: object) -> AutoscalingConfig:
    base = AutoscalingConfig(
        min_replicas=1, max_replicas=20, target_ongoing_requests=2, upscale_delay_s=5,
        downscale_delay_s=30, look_back_period_s=10, metrics_interval_s=1,
    )  # fmt: skip
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def test_calibration_recovers_arrivals_service_time_startup_and_limit(cal_rows: list) -> None:
    cals, _ = calibrate(cal_rows, [KEY])
    c = cals[KEY]
    assert c.arrivals is not None
    assert c.arrivals.total > 1000  # the counter's growth from the first report
    # service grows with concurrency: 0.2 s at one request, + 0.1 s per extra request
    assert c.base_s == pytest.approx(q.BASE_S, rel=0.15)
    assert c.slope_s == pytest.approx(q.BASE_S * q.SLOPE, rel=0.25)
    assert c.startup_s == pytest.approx(q.STARTUP_S)
    assert c.max_ongoing == q.MAX_ONGOING
    assert c.report_interval_s == pytest.approx(1.0)
    assert 1.0 <= c.dispersion < 2.0  # Poisson arrivals under a ramp are not bursts


def test_reports_without_stats_leave_the_closed_loop_without_arrivals() -> None:
    old = HandleReport("h", "queue", "d000", q.START + 1, 1, 0.0, {"r": 1.0}, (), 1)
    cals, _ = calibrate([(1, "fp.v1.report.handle.queue.d000", encode(old))], [KEY])
    assert cals[KEY].arrivals is None
    with pytest.raises(UsageError, match="no request stats"):
        run_deployment(KEY, cfg(), 5, cals[KEY], 60.0, ModelOptions())


def test_fewer_replicas_queue_longer_and_cost_less(cal_rows: list) -> None:
    c = calibrate(cal_rows, [KEY])[0][KEY]
    roomy = run_deployment(KEY, cfg(), 5, c, 600.0, ModelOptions())
    tight = run_deployment(KEY, cfg(max_replicas=3), 5, c, 600.0, ModelOptions())
    assert tight.replica_seconds(0.1) < roomy.replica_seconds(0.1)
    assert tight.percentile(99) > 2 * roomy.percentile(99)  # type: ignore[operator]
    assert tight.queued.max() > roomy.queued.max()
    # the same requests arrive whatever the config (common draws)
    assert tight.arrived == roomy.arrived


def test_a_bounded_queue_rejects_and_a_deadline_times_out(cal_rows: list) -> None:
    c = calibrate(cal_rows, [KEY])[0][KEY]
    starved = cfg(max_replicas=1, min_replicas=1)
    r = run_deployment(KEY, starved, 5, c, 600.0, ModelOptions(max_queued=50))
    assert r.rejected > 0 and r.queued.max() <= 50 + 1e-9
    t = run_deployment(KEY, starved, 5, c, 600.0, ModelOptions(timeout_s=2.0))
    assert t.timed_out > 0 and t.latency.max() <= 2.0


def test_replications_pool_latencies_and_average_the_series(cal_rows: list) -> None:
    c = calibrate(cal_rows, [KEY])[0][KEY]
    one = [run_deployment(KEY, cfg(), 5, c, 600.0, ModelOptions(seed=s)) for s in (3, 4)]
    both = run_deployment(KEY, cfg(), 5, c, 600.0, ModelOptions(seed=3, replications=2))
    assert both.replications == tuple(both.replications) and len(both.replications) == 2
    s = closedloop.summary(both, 0.1)
    mean_rs = sum(r.replica_seconds(0.1) for r in one) / 2
    assert s["replica_seconds"] == pytest.approx(mean_rs)
    assert both.completed() == pytest.approx(sum(r.completed() for r in one) / 2)
    lo, hi = sorted(r.percentile(99) or 0.0 for r in one)
    assert lo <= (both.percentile(99) or 0.0) <= hi


def test_startup_time_delays_running_replicas(cal_rows: list) -> None:
    c = calibrate(cal_rows, [KEY])[0][KEY]
    fast = run_deployment(KEY, cfg(), 5, c, 600.0, ModelOptions(startup_s=0.0))
    slow = run_deployment(KEY, cfg(), 5, c, 600.0, ModelOptions(startup_s=20.0))
    assert slow.percentile(99) > fast.percentile(99)  # type: ignore[operator]


def test_same_inputs_give_byte_identical_json_and_the_seed_matters(
    cal_rows: list, tmp_path: Path
) -> None:
    path = tmp_path / "q.yaml"
    path.write_text(q.config_yaml())
    apps = load_app_configs(path)
    one = closedloop.closed_json(closedloop.run_closed(cal_rows, [("a", apps)], ModelOptions()))
    two = closedloop.closed_json(closedloop.run_closed(cal_rows, [("a", apps)], ModelOptions()))
    other = closedloop.closed_json(
        closedloop.run_closed(cal_rows, [("a", apps)], ModelOptions(seed=5))
    )
    assert one == two and one != other
    out = io.StringIO()
    closedloop.print_closed(
        closedloop.run_closed(cal_rows, [("a", apps), ("b", apps)], ModelOptions()), out
    )
    assert "p99 s" in out.getvalue() and "calibrated service" in out.getvalue()


def test_tune_finds_the_cheapest_config_that_meets_the_slo(cal_rows: list, tmp_path: Path) -> None:
    c = calibrate(cal_rows, [KEY])[0][KEY]
    base = cfg(min_replicas=3)
    cands, best = tune(c, KEY, base, 5, 600.0, Rule(99.0, 1.0), ModelOptions(interval_s=0.25), 25)
    assert len(cands) == 25 and cands[0].config == base
    assert best is not None and best.percentile is not None and best.percentile <= 1.0
    assert best.replica_seconds == min(x.replica_seconds for x in cands if x.meets)
    front = frontier(cands)
    assert [f.replica_seconds for f in front] == sorted(f.replica_seconds for f in front)
    assert all(a.percentile > b.percentile for a, b in itertools.pairwise(front))  # type: ignore[operator]
    again = tune(c, KEY, base, 5, 600.0, Rule(99.0, 1.0), ModelOptions(interval_s=0.25), 25)[1]
    assert again is not None and again.index == best.index
    text = tuned_yaml(q.config_yaml(), "queue", "d000", best.config)
    path = tmp_path / "tuned.yaml"
    path.write_text(text)
    (tuned,) = load_app_configs(path)
    assert (
        tuned.deployments[0].policy.target_ongoing_requests == best.config.target_ongoing_requests
    )


def test_the_committed_closed_loop_fixture_gives_the_committed_output_byte_for_byte() -> None:
    from tests.replay.generate import QUEUE_CONFIG, QUEUE_EXPECTED, QUEUE_RECORDING, expected_closed

    assert expected_closed(QUEUE_RECORDING, QUEUE_CONFIG) == QUEUE_EXPECTED.read_bytes(), (
        "closed-loop output changed; if intended: .venv/bin/python -m tests.replay.generate"
    )


def test_candidates_are_distinct_valid_and_bounded() -> None:
    got = candidates(cfg(), 40, 0)
    assert len(got) == 40 == len(set(got))
    assert candidates(cfg(), 40, 0) == got


def test_slo_parsing() -> None:
    assert parse_slo("p99=0.5") == (99.0, 0.5)
    assert parse_slo("p95=2") == (95.0, 2.0)
    for bad in ("99=0.5", "p99", "p100=1", "p99=-1"):
        with pytest.raises(UsageError):
            parse_slo(bad)


def test_columnar_reports_carry_the_stats_and_calibrate_alike(cal_rows: list) -> None:
    from shared.wire.codec import decode_as
    from shared.wire.columnar import (
        columnar_to_handle_report,
        decode_handle_report_columnar,
        handle_report_to_columnar,
    )

    wide: list[tuple[int, str, bytes]] = []
    for t, subject, payload in cal_rows:
        if ".handle." in subject:
            report = decode_as(payload, HandleReport)
            (part,) = handle_report_to_columnar(report)
            assert columnar_to_handle_report(decode_handle_report_columnar(part)) == report
            payload = part
        wide.append((t, subject, payload))
    a = calibrate(cal_rows, [KEY])[0][KEY]
    b = calibrate(wide, [KEY])[0][KEY]
    assert a.doc() == b.doc()
    assert a.arrivals is not None and b.arrivals is not None
    assert a.arrivals.total == b.arrivals.total


def test_columnar_stats_of_bad_json_or_counts_are_refused() -> None:
    import pyarrow as pa

    from shared.wire import reasons
    from shared.wire.columnar import decode_handle_report_columnar, encode_handle_report_columnar

    (good,) = encode_handle_report_columnar(
        handle_id="h", app="a", deployment="d", sent_at=1.0, seq=1, queued_requests=0.0,
        membership_epoch=0, replica_ids=["r"], running=[1.0],
    )  # fmt: skip
    schema = pa.ipc.open_stream(good[4:]).schema
    batch = pa.ipc.open_stream(good[4:]).read_next_batch()

    def with_stats(text: bytes) -> bytes:
        meta = {**schema.metadata, b"stats": text}
        sink = pa.BufferOutputStream()
        sink.write(b"FPC1")
        with pa.ipc.new_stream(sink, schema.with_metadata(meta)) as w:
            w.write_batch(batch.replace_schema_metadata(meta))
        return bytes(sink.getvalue().to_pybytes())

    negative = {"v": 1, "arrived": -1, "completed": 0, "service_s": 0, "service_sq_s2": 0,
                "wait_s": 0, "rejected": 0, "timed_out": 0, "concurrency_sum": 0,
                "concurrency_sq_sum": 0, "concurrency_service_s": 0}  # fmt: skip
    for text, reason in (
        (b"{not json", reasons.MALFORMED),
        (json.dumps(negative).encode(), reasons.BAD_VALUE),
    ):
        with pytest.raises(WireError) as exc:
            decode_handle_report_columnar(with_stats(text))
        assert exc.value.reason == reason
    assert decode_handle_report_columnar(with_stats(b'{"v":9}')).stats is None


def test_a_deployment_s_own_queue_bound_is_the_model_s() -> None:
    """`max_queued_requests` set on the deployment bounds the simulated routers' queue, as it
    bounds the real ones; unset (-1), the routers' default applies."""
    from services.whatif.simulate import simulate_closed
    from shared.appconfig import AppConfig, DeploymentConfig

    c = calibrate(rows(peak=40.0), [KEY])[0][KEY]

    def app(bound: int) -> AppConfig:
        d = DeploymentConfig(
            "d000", "services.examples.model:Model", max_ongoing_requests=5,
            max_queued_requests=bound, autoscaling=cfg(max_replicas=1),
        )  # fmt: skip
        return AppConfig("queue", (d,))

    bounded = simulate_closed({KEY: c}, [app(20)], 600.0).deployments[KEY]
    default = simulate_closed({KEY: c}, [app(-1)], 600.0).deployments[KEY]
    assert bounded.rejected > 0 and bounded.queued.max() <= 20 + 1e-9
    assert default.queued.max() > 20


def test_queue_order_reaches_the_model_from_the_command_line(tmp_path: Path) -> None:
    from tests.replay.generate import QUEUE_CONFIG, QUEUE_EXPECTED, QUEUE_RECORDING

    out = {order: tmp_path / f"{order}.json" for order in ("fifo", "random")}
    base = ["replay", str(QUEUE_RECORDING), "--what-if", str(QUEUE_CONFIG)]
    for order, path in out.items():
        assert recorder_main([*base, "--queue-order", order, "--out", str(path)]) == 0
    # fifo is the default: the committed fixture's numbers
    fixture = json.loads(QUEUE_EXPECTED.read_text())
    assert json.loads(out["fifo"].read_text())["deployments"] == fixture["deployments"]
    assert out["random"].read_bytes() != out["fifo"].read_bytes()


def test_the_output_checks_the_model_against_the_recorded_concurrency_and_wait(
    cal_rows: list,
) -> None:
    """The routers count the concurrency each request found and its wait: the calibration
    reports both as recorded, the summary as modelled, and the table sets them side by side
    (the recorded config's model should match)."""
    c = calibrate(cal_rows, [KEY])[0][KEY]
    recorded = c.doc()["recorded"]
    assert isinstance(recorded, dict)
    assert recorded["mean_concurrency"] == pytest.approx(c.concurrency_sum / c.completed)
    as_live = cfg(min_replicas=q.MAX_ONGOING - 1, max_replicas=q.MAX_ONGOING - 1)  # 4, as recorded
    run = run_deployment(KEY, as_live, q.MAX_ONGOING, c, 600.0, ModelOptions(replications=2))
    s = closedloop.summary(run, 0.1)
    assert 1.0 <= s["mean_concurrency"] <= q.MAX_ONGOING
    assert s["mean_concurrency"] == pytest.approx(recorded["mean_concurrency"], abs=0.5)
    assert s["mean_wait_s"] >= 0.0
    result = closedloop.ClosedResult(ModelOptions(), 0, 600.0, {KEY: run})
    out = io.StringIO()
    closedloop.print_closed([("live", result)], out)
    line = next(x for x in out.getvalue().splitlines() if "at admission" in x)
    assert f"as recorded: {recorded['mean_concurrency']:.2f} requests" in line
    assert f"live {s['mean_concurrency']:.2f}, {s['mean_wait_s']:.3f} s" in line

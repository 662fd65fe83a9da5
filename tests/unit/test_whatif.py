"""What-if replay: determinism against the committed fixture, the simulation model, the CLI."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import numpy as np
import pytest

from services.whatif import model as whatif
from services.whatif.__main__ import main as recorder_main
from services.whatif.model import ReportRow, WhatIfOptions, simulate
from services.whatif.run import load_app_configs, load_report_rows, run_whatif
from shared.appconfig import AppConfig, AutoscalingConfig, DeploymentConfig
from shared.errors import UsageError
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.wire.codec import encode
from shared.wire.columnar import handle_report_to_columnar
from shared.wire.messages import HandleReport, ReplicaReport

FIXTURE = Path(__file__).resolve().parents[1] / "replay"
RECORDING = FIXTURE / "shop.arrows"
CONFIG = FIXTURE / "shop.yaml"
EXPECTED = FIXTURE / "shop.whatif.json"
REGENERATE = (
    "if the change is intended, regenerate with `.venv/bin/python -m tests.replay.generate`"
)
T0 = 1_714_550_400_000_000


def app(**scaling: float) -> list[AppConfig]:
    cfg = AutoscalingConfig(**{"min_replicas": 1, "max_replicas": 50, **scaling})  # type: ignore[arg-type]
    return [AppConfig("shop", (DeploymentConfig("api", "m:C", autoscaling=cfg),))]


def handle(t: float, seq: int, running: dict[str, float], queued: float = 0.0,
           handle_id: str = "h1") -> ReportRow:  # fmt: skip
    r = HandleReport(handle_id, "shop", "api", t, seq, queued, running, (), 1)
    return (T0 + round(t * 1e6), S.report("handle", "shop", "api"), encode(r))


def steady(
    load_per_replica: float, replicas: int, seconds: float, every: float = 5.0
) -> list[ReportRow]:
    ids = [f"r{i}" for i in range(replicas)]
    times = np.arange(0.0, seconds, every).tolist()
    return [handle(t, i + 1, dict.fromkeys(ids, load_per_replica)) for i, t in enumerate(times)]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Fixture:
    rows: list[ReportRow]
    apps: list[AppConfig]
    result: whatif.WhatIfResult


@pytest.fixture(scope="module")
def shop() -> Fixture:
    """The committed recording run once with the committed config (default options)."""
    rows = load_report_rows(RECORDING)
    apps = load_app_configs(CONFIG)
    return Fixture(rows, apps, simulate(rows, apps))


# -- determinism ------------------------------------------------------------------------------


def test_the_committed_fixture_gives_the_committed_timeline_byte_for_byte(shop: Fixture) -> None:
    assert whatif.timeline_json(shop.result) == EXPECTED.read_bytes(), REGENERATE


def test_two_runs_give_identical_bytes(tmp_path: Path) -> None:
    outs = []
    for i in range(2):
        path = tmp_path / f"run{i}.json"
        args = ["replay", str(RECORDING), "--what-if", str(CONFIG), "--interval-s", "0.5"]
        assert recorder_main([*args, "--out", str(path)]) == 0
        outs.append(path.read_bytes())
    assert outs[0] == outs[1]
    assert json.loads(outs[0])["options"]["interval_s"] == 0.5


def test_the_fixture_exercises_both_formats_and_counts_the_noise() -> None:
    doc = json.loads(EXPECTED.read_bytes())
    rec = doc["recording"]
    assert rec["used"]["object_accepted"] > 0 and rec["used"]["columnar_accepted"] > 0
    assert rec["used"]["replica_accepted"] > 0
    assert rec["ignored"] == {
        "heartbeat": 1,
        "lifecycle": 1,
        "not_a_report": 1,
        "other_deployment:shop.other": 1,
        "wire_malformed": 1,
    }
    api = doc["deployments"]["shop.api"]["summary"]
    assert api["max_target"] > 5 and api["final_target"] == 0  # scales up, then to zero


def test_json_floats_are_rounded_and_keys_sorted() -> None:
    doc = json.loads(EXPECTED.read_bytes())
    for v in doc["deployments"]["shop.api"]["samples"]["demand"]:
        assert round(v, whatif.DIGITS) == v
    assert list(doc) == sorted(doc)
    assert all(list(e) == sorted(e) for e in doc["timeline"])


# -- the model --------------------------------------------------------------------------------


def test_a_higher_target_gives_fewer_replicas_on_the_same_recording(shop: Fixture) -> None:
    apps = shop.apps
    api = apps[0].deployment("api")
    assert api.autoscaling is not None
    relaxed = dataclasses.replace(
        api, autoscaling=dataclasses.replace(api.autoscaling, target_ongoing_requests=4.0)
    )
    apps_relaxed = [dataclasses.replace(apps[0], deployments=(relaxed, apps[0].deployments[1]))]
    base = shop.result.deployments["shop.api"]
    fewer = simulate(shop.rows, apps_relaxed).deployments["shop.api"]
    assert fewer.target.max() < base.target.max()
    assert fewer.running.sum() < base.running.sum()
    # the offered load is a property of the recording, not of the config
    assert np.array_equal(fewer.demand, base.demand)


def test_constant_load_scales_to_demand_over_target_after_the_upscale_delay() -> None:
    rows = steady(2.0, replicas=10, seconds=120)  # demand 20
    res = simulate(
        rows, app(target_ongoing_requests=2, upscale_delay_s=30), WhatIfOptions(interval_s=1)
    )
    run = res.deployments["shop.api"]
    ups = [e for e in res.timeline if e.rule == "upscale"]
    # the first tick samples the demand at 1 s: a rise that has not held yet reads as its
    # newest sample, so the delay runs from 1 s and acts at 31 s
    assert [(e.target, e.t) for e in ups] == [(10, 31.0)]
    assert run.target[-1] == 10 and run.demand[-1] == pytest.approx(20.0)


def test_replicas_absent_from_reports_leave_the_running_gate() -> None:
    ids = [f"r{i}" for i in range(4)]
    rows = [handle(t, i + 1, dict.fromkeys(ids if t < 30 else ids[:1], 3.0))
            for i, t in enumerate(np.arange(0.0, 60.0, 5.0).tolist())]  # fmt: skip
    # a second handle that still names every replica, but stops reporting at 30 s
    rows += [handle(t, i + 1, dict.fromkeys(ids, 1.0), handle_id="h2")
             for i, t in enumerate(np.arange(1.0, 30.0, 5.0).tolist())]  # fmt: skip
    rows.sort(key=lambda r: r[0])
    run = simulate(rows, app(), WhatIfOptions(interval_s=1)).deployments["shop.api"]
    at = {float(t): float(d) for t, d in zip(run.times, run.demand, strict=True)}
    assert at[20.0] == pytest.approx(16.0)  # 4 x 3 + 4 x 1
    # h2 is silent after 26 s: once its source timeout (20 s) passed, it and the replicas only
    # it still named are gone
    assert at[45.0] == pytest.approx(3.0 + 4 * 1.0)
    assert at[47.0] == pytest.approx(3.0)


def test_replica_reports_override_handle_sums_and_queued_counts() -> None:
    rows = [handle(0.0, 1, {"r0": 1.0, "r1": 1.0}, queued=4.0)]
    rr = ReplicaReport("r0", 0.5, 1, 5.0, {})
    rows.append((T0 + 500_000, S.report("replica", "shop", "api"), encode(rr)))
    run = simulate(rows, app(), WhatIfOptions(interval_s=1)).deployments["shop.api"]
    assert run.demand[0] == pytest.approx(5.0 + 1.0 + 4.0)


def test_columnar_reports_count_like_object_reports() -> None:
    ids = {f"r{i}": 0.5 for i in range(100)}
    obj = simulate([handle(0.0, 1, ids)], app(), WhatIfOptions(interval_s=1))
    rep = HandleReport("h1", "shop", "api", 0.0, 1, 0.0, ids, (), 1)
    rows = [(T0, S.report("handle", "shop", "api"), p) for p in handle_report_to_columnar(rep)]
    col = simulate(rows, app(), WhatIfOptions(interval_s=1))
    assert col.used == {"columnar_accepted": 1} and obj.used == {"object_accepted": 1}
    assert np.array_equal(col.deployments["shop.api"].demand, obj.deployments["shop.api"].demand)


def test_startup_delay_makes_running_lag_the_target() -> None:
    rows = steady(2.0, replicas=10, seconds=120)
    cfg = app(upscale_delay_s=10)
    fast = simulate(rows, cfg, WhatIfOptions(interval_s=1)).deployments["shop.api"]
    slow = simulate(rows, cfg, WhatIfOptions(interval_s=1, startup_delay_s=20)).deployments[
        "shop.api"
    ]
    assert np.array_equal(fast.target, slow.target)
    assert np.array_equal(fast.running, fast.target)
    lag = np.flatnonzero(slow.running < slow.target)
    assert lag.size == 20  # 20 ticks of 1 s between the upscale and the replicas running
    assert slow.running[-1] == slow.target[-1] == 10


def test_idle_scales_to_zero_only_after_the_to_zero_delay() -> None:
    rows = steady(1.0, replicas=2, seconds=60) + [
        handle(t, 100 + i, {"r0": 0.0, "r1": 0.0}) for i, t in enumerate(np.arange(60.0, 400.0, 5.0).tolist())
    ]  # fmt: skip
    cfg = app(min_replicas=0, downscale_delay_s=60, downscale_to_zero_delay_s=120)
    res = simulate(rows, cfg, WhatIfOptions(interval_s=1))
    downs = [(e.target, e.t) for e in res.timeline if e.rule == "downscale"]
    # the 30 s look-back mean reaches 0 at 90 s; 1 -> 0 after the 120 s to-zero delay
    assert downs == [(0, 60.0 + 30.0 + 120.0)]


def test_bad_and_unrelated_input_is_counted_not_raised() -> None:
    rows = [
        (T0, S.report("handle", "shop", "api"), b"\x00garbage"),
        (T0 + 1, S.report("handle", "shop", "nope"), b""),
        (T0 + 2, "fp.v1.report.x", b""),
    ]
    res = simulate(rows, app())
    assert res.ignored == {
        "not_a_report": 1,
        "other_deployment:shop.nope": 1,
        "wire_malformed": 1,
    }
    with pytest.raises(UsageError, match="recv_time order"):
        simulate([rows[1], rows[0]], app())


def test_an_empty_recording_gives_an_empty_timeline() -> None:
    res = simulate([], app())
    doc = json.loads(whatif.timeline_json(res))
    assert doc["timeline"] == [] and doc["deployments"]["shop.api"]["summary"]["ticks"] == 0


def test_options_are_validated() -> None:
    with pytest.raises(UsageError):
        WhatIfOptions(interval_s=0)
    with pytest.raises(UsageError):
        WhatIfOptions(startup_delay_s=-1)


# -- compare and plot -------------------------------------------------------------------------


def test_compare_writes_both_runs_and_one_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    other = tmp_path / "relaxed.json"
    apps = load_app_configs(CONFIG)
    other.write_text(json.dumps([json.loads(a.to_json()) for a in apps]))
    out, png = tmp_path / "cmp.json", tmp_path / "cmp.png"
    opts = WhatIfOptions(interval_s=1.0)
    runs = run_whatif(RECORDING, [CONFIG, other], opts, out_json=out, out_plot=png)
    doc = json.loads(out.read_bytes())
    assert doc["kind"] == "whatif_compare"
    assert [r["label"] for r in doc["runs"]] == ["shop.yaml", "relaxed.json"]
    # the same config as JSON and as YAML decides the same
    assert doc["runs"][0]["timeline"] == doc["runs"][1]["timeline"]
    assert len(runs) == 2
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_errors_name_the_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = recorder_main(["replay", str(tmp_path / "missing"), "--what-if", str(CONFIG)])
    assert code == 2
    assert "no such file or directory" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("applications: [{name: shop}]\n")
    assert recorder_main(["replay", str(RECORDING), "--what-if", str(bad)]) == 2
    assert "bad.yaml" in capsys.readouterr().err


def test_a_custom_policy_is_not_simulated_and_what_if_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    apps = [json.loads(a.to_json()) for a in load_app_configs(CONFIG)]
    scaling = apps[0]["deployments"][0]["autoscaling"]
    scaling["policy"] = "services.examples.kv_policy:scale_on_kv_cache"
    custom = tmp_path / "custom.json"
    custom.write_text(json.dumps(apps))
    run_whatif(RECORDING, [custom], WhatIfOptions(interval_s=1.0), out=io.StringIO())
    err = capsys.readouterr().err
    assert "names the custom policy services.examples.kv_policy:scale_on_kv_cache" in err

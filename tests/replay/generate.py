"""Generate the what-if determinism fixture: a small recording, its app file, the expected output.

    .venv/bin/python -m tests.replay.generate           # rewrite the fixture
    .venv/bin/python -m tests.replay.generate --check   # exit 1 if the committed one differs

The recording (`shop.arrows`, zstd) is 15 minutes of one app, `shop`, seen by the recorder:

- `shop.api`: six production replicas behind two routers sending object-path (msgpack) handle
  reports every 5 s; three replicas also send their own replica reports every 10 s. Load: a
  quiet start, a ramp, a spike with requests queued at the routers, a plateau, then idle (two
  replicas leave the reports when production scaled down, at 10 min).
- `shop.model`: 70 replicas behind one router sending columnar (FPC1) handle reports every 10 s,
  under a sine-shaped load.
- Noise the simulation must skip and count: a heartbeat, a lifecycle event, an undecodable
  payload, a report of a deployment the config does not have, and a malformed report subject.

`shop.yaml` is the config under test; `shop.whatif.json` is `fleetpulse replay shop.arrows
--what-if shop.yaml --out ...` with default options (open loop: these reports carry no request
stats).

The closed-loop fixture: `queue.arrows` (10 minutes of `queue.d000`, one router with request
stats, replicas with lifecycle events: queue_recording.py), `queue.yaml` and
`queue.closed.json`, which is `fleetpulse replay queue.arrows --what-if queue.yaml --model
closed --out ...` with default options. Everything is seeded: the rows (and the
expected JSON) come out the same on every run; the compressed file bytes may differ between
pyarrow versions, so `--check` compares the rows, not the file bytes.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from services.whatif import closedloop
from services.whatif import model as whatif
from services.whatif.run import load_app_configs, load_report_rows
from services.whatif.simulate import ModelOptions
from shared.clock import FakeClock
from shared.recording import RecordingWriter, WriterConfig, read_recording, wall_to_us
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.wire.codec import encode
from shared.wire.columnar import handle_report_to_columnar
from shared.wire.messages import HandleReport, HealthStatus, Heartbeat, Lifecycle, ReplicaReport

from . import queue_recording

HERE = Path(__file__).resolve().parent
RECORDING = HERE / "shop.arrows"
CONFIG = HERE / "shop.yaml"
EXPECTED = HERE / "shop.whatif.json"
QUEUE_RECORDING = HERE / "queue.arrows"
QUEUE_CONFIG = HERE / "queue.yaml"
QUEUE_EXPECTED = HERE / "queue.closed.json"
QUEUE_PEAK = 40.0
QUEUE_YAML = "# The config under test for the closed-loop fixture (see generate.py).\n" + (
    queue_recording.config_yaml(max_replicas=6)
)
START = 1_714_550_400.0  # 2024-05-01T08:00:00Z
DURATION_S = 900.0
SEED = 7

CONFIG_YAML = """\
# The config under test for the what-if determinism fixture (see generate.py).
applications:
  - name: shop
    route_prefix: /shop
    deployments:
      - name: api
        import_path: services.examples.echo:Echo
        autoscaling_config:
          min_replicas: 0
          max_replicas: 20
          target_ongoing_requests: 2
          upscale_delay_s: 10
          downscale_delay_s: 60
          downscale_to_zero_delay_s: 90
          look_back_period_s: 30
          metrics_interval_s: 5
      - name: model
        import_path: services.examples.echo:Echo
        autoscaling_config:
          min_replicas: 1
          max_replicas: 40
          target_ongoing_requests: 5
          upscale_delay_s: 20
          downscale_delay_s: 120
          panic_mode: true
"""

API = [f"api-{c}" for c in "abcdef"]
MODEL = [f"model-{i:02d}" for i in range(70)]


def api_load(t: float) -> float:
    """Total running + queued requests offered to shop.api."""
    if t < 120:
        return 1.0
    if t < 300:
        return 1.0 + 11.0 * (t - 120) / 180
    if t < 420:
        return 25.0
    if t < 600:
        return 6.0
    return 0.0


def model_load(t: float) -> float:
    return 70.0 + 50.0 * math.sin(2 * math.pi * t / 600.0)


def messages() -> list[tuple[float, str, bytes]]:
    rng = np.random.default_rng(SEED)
    out: list[tuple[float, str, bytes]] = []
    api_handle = S.report("handle", "shop", "api")
    for router in range(2):
        for seq, t in enumerate(np.arange(router * 2.5, DURATION_S, 5.0).tolist()):
            live = API if t < 600 else API[:4]
            load = api_load(t) / 2  # each router carries half
            queued = max(0.0, load - 10.0)
            share = (load - queued) / len(live)
            running = {r: round(share * float(rng.uniform(0.8, 1.2)), 3) for r in live}
            health = (HealthStatus(live[seq % len(live)], True, START + t - 1, 0),)
            rep = HandleReport(
                f"router-{router}", "shop", "api", START + t, seq + 1, queued, running, health, 3
            )
            out.append((t + 0.001, api_handle, encode(rep)))
    for i, rid in enumerate(API[:3]):
        for seq, t in enumerate(np.arange(1.0 + i, DURATION_S, 10.0).tolist()):
            rr = ReplicaReport(rid, START + t, seq + 1, round(api_load(t) / 6, 3), {})
            out.append((t + 0.002, S.report("replica", "shop", "api"), encode(rr)))
    model_handle = S.report("handle", "shop", "model")
    for seq, t in enumerate(np.arange(3.0, DURATION_S, 10.0).tolist()):
        per = model_load(t) / len(MODEL)
        running = {r: round(per * float(rng.uniform(0.5, 1.5)), 3) for r in MODEL}
        rep = HandleReport("router-m", "shop", "model", START + t, seq + 1, 0.0, running, (), 1)
        for part in handle_report_to_columnar(rep):
            out.append((t + 0.003, model_handle, part))
    hb = Heartbeat(HealthStatus("api-a", True, START + 49, 0), START + 50)
    life = Lifecycle("api-g", "agent-1", "starting", START + 60, "fp.v1.rpc.shop.api.api-g", "v1",
                     None, "shop", "api")  # fmt: skip
    other = HandleReport("router-x", "shop", "other", START + 80, 1, 0.0, {"o-1": 3.0}, (), 1)
    out += [
        (50.0, S.report("heartbeat", "shop", "api"), encode(hb)),
        (60.0, S.report("lifecycle", "shop", "api"), encode(life)),
        (70.0, api_handle, b"\x00 not msgpack"),
        (80.0, S.report("handle", "shop", "other"), encode(other)),
        (90.0, "fp.v1.report.bogus.shop.api", b"x"),
        (95.0, "fp.v1.call.shop.api", b"a call: not a report, filtered out by the loader"),
    ]
    out.sort(key=lambda m: m[0])
    return out


def write_recording(path: Path, msgs: list[tuple[float, str, bytes]] | None = None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = WriterConfig(Path(tmp), prefix="shop", batch_rows=400, compression="zstd")
        writer = RecordingWriter(cfg, FakeClock(wall=START))
        for t, subject, payload in messages() if msgs is None else msgs:
            writer.append(wall_to_us(START + t), subject, payload)
        writer.close()
        (file,) = writer.files
        shutil.copyfile(file, path)


def expected_output(recording: Path, config: Path) -> bytes:
    rows = load_report_rows(recording)
    return whatif.timeline_json(whatif.simulate(rows, load_app_configs(config)))


def expected_closed(recording: Path, config: Path) -> bytes:
    rows = load_report_rows(recording)
    apps = load_app_configs(config)
    return closedloop.closed_json(
        closedloop.run_closed(rows, [(config.name, apps)], ModelOptions())
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    if not args.check:
        CONFIG.write_text(CONFIG_YAML)
        write_recording(RECORDING)
        EXPECTED.write_bytes(expected_output(RECORDING, CONFIG))
        QUEUE_CONFIG.write_text(QUEUE_YAML)
        write_recording(QUEUE_RECORDING, queue_recording.messages(peak=QUEUE_PEAK))
        QUEUE_EXPECTED.write_bytes(expected_closed(QUEUE_RECORDING, QUEUE_CONFIG))
        for p in (RECORDING, CONFIG, EXPECTED, QUEUE_RECORDING, QUEUE_CONFIG, QUEUE_EXPECTED):
            print(f"wrote {p.relative_to(HERE.parents[1])} ({p.stat().st_size:,} bytes)")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "shop.arrows"
        write_recording(fresh)
        same_rows = read_recording(fresh).equals(read_recording(RECORDING))
        same_config = CONFIG.read_text() == CONFIG_YAML
        same_output = expected_output(RECORDING, CONFIG) == EXPECTED.read_bytes()
        fresh_q = Path(tmp) / "queue.arrows"
        write_recording(fresh_q, queue_recording.messages(peak=QUEUE_PEAK))
        same_rows = same_rows and read_recording(fresh_q).equals(read_recording(QUEUE_RECORDING))
        same_config = same_config and QUEUE_CONFIG.read_text() == QUEUE_YAML
        same_output = same_output and (
            expected_closed(QUEUE_RECORDING, QUEUE_CONFIG) == QUEUE_EXPECTED.read_bytes()
        )
    print(f"recording rows: {same_rows}, config: {same_config}, expected output: {same_output}")
    return 0 if same_rows and same_config and same_output else 1


if __name__ == "__main__":
    sys.exit(main())

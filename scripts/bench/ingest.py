"""Ingest benchmark: decode + merge of handle reports, msgpack object path vs FPC1 columnar path.

For each width W, a deployment of W running replicas gets reports from several handles, each
report covering all W replicas with running requests and health for every replica, and the
request counters (`stats`) every router sends. One sample
is one report: format detection, decode, staleness gate, merge into `DeploymentMetrics` and
health extraction. Both paths run in the same process on the same data (distinct payloads per
report, so the staleness gate accepts every one), alternating in rounds of ROUND reports per
path, steady state with the slot-map cache warm; the cold-cache cost (a fresh store's first
columnar report) is measured separately. Also measured: decode alone per path, the aggregate
recompute (`snapshot`), what an incremental running total would add per report, and the
router's encode of the same `HandleReport` in each format (`encode` vs
`handle_report_to_columnar`, what `services/router/reports.py` calls; alternating rounds too).

The crossover is the smallest measured width from which columnar ingest is at least as fast as
the object path at every wider measured width (so one noisy width below 1 further up moves it
up, never down); the log-log interpolation of where the speedup first rises through 1 is
printed beside it. The gate the data supports is the power of two at or above the crossover.
Both are for the controller's ingest, the cost the gate exists for (one controller ingests every
router's reports); the router's encode is reported beside it, with the crossover of encode +
ingest.

    .venv/bin/python -m scripts.bench.ingest [--quick] [--smoke] [--handles 4] [--widths 16 64 ...]

Output: a table, bench-results/ingest.json, docs/img/ingest.png (both under
$FLEETPULSE_BENCH_OUT when set; a --smoke run without it writes to a fresh temporary
directory), one RESULT line per width and a last `RESULT bench=ingest crossover=...` line.
`--smoke` (seconds, three narrow widths, a few reports) goes through the same code path and
also checks that both paths leave identical per-replica rows; it exits non-zero on any failure.
"""

from __future__ import annotations

import argparse
import functools
import gc
import itertools
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scripts.bench.common import (
    OUT_ENV,
    add_smoke,
    percentiles,
    plot_path,
    print_table,
    result_line,
    shown,
    write_json,
)
from services.controller.metrics_store import DeploymentMetrics
from services.controller.replica_index import ReplicaIndex
from shared.wire.codec import decode_as, encode
from shared.wire.columnar import (
    DEFAULT_COLUMNAR_MIN_REPLICAS,
    decode_handle_report_columnar,
    detect_format,
    handle_report_to_columnar,
)
from shared.wire.messages import HandleReport, HealthStatus, RequestStats

WIDTHS = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024, 4096, 16384)
"""A sweep around the crossover (16..1024, steps of ~1.4x), then the wide widths."""
SMOKE_WIDTHS = (16, 64, 256)
SMOKE_REPS = 24
SAMPLE_BUDGET = 2_000_000  # replica-rows per width and path: reps = budget / width, clamped
MIN_REPS, MAX_REPS = 15, 500
QUICK_DIVISOR = 10
COLD_REPS = 5
ENCODE_REPS = (8, 60)  # the router's encode: reports per path, clamped by budget like ingest
ROUND = 8  # reports per path before switching to the other path
TARGET_SPEEDUP_4096 = 50.0
PLOT_NAME = "ingest.png"
INTERVAL_S = 10.0


def reps_for(width: int, quick: bool) -> int:
    reps = max(MIN_REPS, min(MAX_REPS, SAMPLE_BUDGET // width))
    return max(MIN_REPS // 3, reps // QUICK_DIVISOR) if quick else reps


def make_store(ids: Sequence[str]) -> DeploymentMetrics:
    index = ReplicaIndex()
    index.sync(ids)
    store = DeploymentMetrics(index, INTERVAL_S)
    store.set_running(ids)
    return store


def make_reports(
    ids: list[str], handles: int, reps: int, rng: np.random.Generator
) -> list[HandleReport]:
    """Distinct reports, round-robin over handles, seq increasing, health on every row and the
    request counters every router sends (`stats`)."""
    w = len(ids)
    out: list[HandleReport] = []
    for i in range(reps):
        done = 1000 * (i + 1)
        stats = RequestStats(
            arrived=done + 7, completed=done, service_s=0.05 * done, service_sq_s2=0.003 * done,
            wait_s=0.001 * done, rejected=i % 2, timed_out=0, concurrency_sum=3 * done,
            concurrency_sq_sum=11 * done, concurrency_service_s=0.16 * done,
        )  # fmt: skip
        running = rng.integers(0, 8, w).astype(np.float64)
        healthy = rng.random(w) < 0.99
        checked = 1.7e9 + i + rng.random(w)
        failures = np.where(healthy, 0, rng.integers(1, 4, w))
        health = tuple(
            HealthStatus(r, bool(h), float(c), int(f))
            for r, h, c, f in zip(ids, healthy, checked, failures, strict=True)
        )
        out.append(
            HandleReport(
                handle_id=f"handle-{i % handles}", app="bench", deployment="ingest",
                sent_at=1.7e9 + i, seq=i, queued_requests=float(i % 3),
                running=dict(zip(ids, running.tolist(), strict=True)), health=health,
                membership_epoch=1, stats=stats,
            )
        )  # fmt: skip
    return out


def encode_columnar(report: HandleReport) -> bytes:
    parts = handle_report_to_columnar(report)
    if len(parts) != 1:
        raise SystemExit(f"width {len(report.running)}: expected one FPC1 part, got {len(parts)}")
    return parts[0]


def payloads(reports: Sequence[HandleReport]) -> tuple[list[bytes], list[bytes]]:
    """The same reports in both formats, as the router encodes them."""
    return [encode(r) for r in reports], [encode_columnar(r) for r in reports]


def ingest_object(store: DeploymentMetrics, data: bytes, recv: float) -> None:
    if detect_format(data) != "msgpack":
        raise AssertionError("not msgpack")
    result = store.ingest_handle_report(decode_as(data, HandleReport), recv)
    if not result.accepted or result.health is None:
        raise AssertionError(result)


def ingest_columnar(store: DeploymentMetrics, data: bytes, recv: float) -> None:
    if detect_format(data) != "columnar":
        raise AssertionError("not columnar")
    result = store.ingest_columnar(decode_handle_report_columnar(data), recv)
    if not result.accepted or result.health is None:
        raise AssertionError(result)


def alternating(
    paths: Sequence[tuple[Callable[[int], object], int]], skip: int = 0
) -> list[list[float]]:
    """Per-call seconds of each path, `fn(i)` for i in range(n), in alternating rounds of
    ROUND calls per path, so drift in machine load hits every path alike while each path runs
    on its own warm CPU caches. The first `skip` calls of each path are not timed."""
    samples: list[list[float]] = [[] for _ in paths]
    n = max(count for _, count in paths)
    gc.collect()
    gc.disable()
    try:
        for start in range(0, n, ROUND):
            for (fn, count), out in zip(paths, samples, strict=True):
                for i in range(start, min(start + ROUND, count)):
                    t0 = time.perf_counter()
                    fn(i)
                    if i >= skip:
                        out.append(time.perf_counter() - t0)
    finally:
        gc.enable()
    return samples


def timed_pair(
    ids: Sequence[str], obj: Sequence[bytes], col: Sequence[bytes], warm: int
) -> tuple[list[float], list[float], DeploymentMetrics]:
    """Per-report seconds of both ingest paths (`alternating`); the first `warm` reports of
    each path (slot-map cache cold) are not timed. Both stores must end with the same rows."""
    stores = (make_store(ids), make_store(ids))
    obj_s, col_s = alternating(
        [
            (lambda i: ingest_object(stores[0], obj[i], float(i)), len(obj)),
            (lambda i: ingest_columnar(stores[1], col[i], float(i)), len(col)),
        ],
        warm,
    )
    a, b = (s.per_replica_running() for s in stores)
    if not np.array_equal(a, b) or stores[0].total_demand() != stores[1].total_demand():
        raise AssertionError("the object and columnar paths left different rows")
    return obj_s, col_s, stores[1]


def timed_encode(reports: Sequence[HandleReport], reps: int) -> tuple[list[float], list[float]]:
    """Per-report seconds of the router's encode in each format (`alternating`)."""
    obj_s, col_s = alternating(
        [(lambda i: encode(reports[i]), reps), (lambda i: encode_columnar(reports[i]), reps)]
    )
    return obj_s, col_s


def cold_columnar(ids: Sequence[str], col: Sequence[bytes]) -> float:
    """Median seconds of a fresh store's first columnar report (slot map built from scratch)."""
    samples = []
    for payload in col[:COLD_REPS]:
        store = make_store(ids)
        t0 = time.perf_counter()
        ingest_columnar(store, payload, 0.0)
        samples.append(time.perf_counter() - t0)
    return float(np.median(samples))


def median_s(fn: Callable[[], object], reps: int) -> float:
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return float(np.median(samples))


def bench_width(
    w: int, handles: int, reps: int, rng: np.random.Generator, small: bool = False
) -> dict[str, Any]:
    ids = [f"replica-{i:05d}-{rng.integers(1 << 20):05x}" for i in range(w)]
    # Reports list replicas in the router's order, not the controller's slot order.
    ids = [ids[i] for i in rng.permutation(w)]
    warm = handles  # one report per handle warms the slot-map cache
    reports = make_reports(ids, handles, reps + warm, rng)
    obj, col = payloads(reports)
    out: dict[str, Any] = {"width": w, "reps": reps, "handles": handles}
    obj_s, col_s, store = timed_pair(ids, obj, col, warm)
    for name, samples, data in (("object", obj_s, obj), ("columnar", col_s, col)):
        out[name] = percentiles(samples)
        out[name]["payload_bytes"] = len(data[0])
    few = 5 if small else 50
    out["snapshot_ms"] = median_s(functools.partial(store.snapshot, 0.0), few) * 1e3
    out["columnar_cold_ms"] = cold_columnar(ids, col) * 1e3
    # Decode alone, to split each path's time between the wire decoder and the store.
    decode_obj = functools.partial(decode_as, obj[-1], HandleReport)
    out["object_decode_ms"] = median_s(decode_obj, min(reps, 100)) * 1e3
    decode_col = functools.partial(decode_handle_report_columnar, col[-1])
    out["columnar_decode_ms"] = median_s(decode_col, 4 * few) * 1e3
    # What an incremental total would add to every report: subtract the old row, add the new.
    total, old, new = np.zeros(w), np.ones(w), np.ones(w)

    def incremental() -> None:
        total.__isub__(old)
        total.__iadd__(new)

    out["incremental_total_ms"] = median_s(incremental, 4 * few) * 1e3
    out["speedup"] = out["object"]["p50_ms"] / out["columnar"]["p50_ms"]
    # The router's side: encoding the same report in each format.
    enc_reps = min(len(reports), max(ENCODE_REPS[0], min(ENCODE_REPS[1], reps // 4)))
    enc_obj, enc_col = timed_encode(reports, enc_reps)
    out["object_encode_ms"] = float(np.median(enc_obj)) * 1e3
    out["columnar_encode_ms"] = float(np.median(enc_col)) * 1e3
    out["e2e_speedup"] = (out["object_encode_ms"] + out["object"]["p50_ms"]) / (
        out["columnar_encode_ms"] + out["columnar"]["p50_ms"]
    )
    return out


def crossover(rows: Sequence[dict[str, Any]], key: str = "speedup") -> int | None:
    """The smallest measured width from which `key` >= 1 at every wider measured width; None
    when the widest is below 1."""
    found = None
    for r in sorted(rows, key=lambda r: -r["width"]):
        if r[key] < 1.0:
            break
        found = r["width"]
    return found


def crossover_interpolated(rows: Sequence[dict[str, Any]], key: str = "speedup") -> float | None:
    """Width where `key` first rises through 1, interpolated on log-log; None if it does not
    cross within the measured widths."""
    pts = [(math.log(r["width"]), math.log(r[key])) for r in rows]
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if y0 < 0 <= y1:
            return math.exp(x0 - y0 * (x1 - x0) / (y1 - y0))
    return None


def recommended_gate(rows: Sequence[dict[str, Any]], cross: int | None) -> int | None:
    """The power of two at or above the crossover (columnar is not slower at any measured width
    from there on, by the crossover's definition); None if columnar is slower at the widest."""
    if cross is None:
        return None
    return 1 << math.ceil(math.log2(cross))


def check_targets(rows: Sequence[dict[str, Any]], gate: int) -> dict[str, bool | None]:
    """The brief's targets, None where the width was not measured."""
    by_width = {r["width"]: r["speedup"] for r in rows}
    at_4096, at_gate = by_width.get(4096), by_width.get(gate)
    return {
        f"speedup >= {TARGET_SPEEDUP_4096:g}x at 4096": (
            None if at_4096 is None else at_4096 >= TARGET_SPEEDUP_4096
        ),
        f"columnar not slower at the gate ({gate})": None if at_gate is None else at_gate >= 1.0,
    }


def plot(rows: Sequence[dict[str, Any]], path: Path, cross: int | None) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(
            "WARNING: matplotlib is not installed, skipping the plot "
            "(install it with `.venv/bin/pip install matplotlib`)",
            file=sys.stderr,
        )
        return None
    widths = [r["width"] for r in rows]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, style in (("object", "o-"), ("columnar", "s-")):
        ax.plot(widths, [r[name]["p50_ms"] * 1e3 for r in rows], style, label=f"{name} (p50)")
    ax.plot(widths, [r["columnar_cold_ms"] * 1e3 for r in rows], "s:", label="columnar, cold cache")
    ax.set(xscale="log", yscale="log", xlabel="replicas per report", ylabel="µs per report")
    ax.set_title("Controller: decode + merge + health extraction")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    ax2.plot(widths, [r["speedup"] for r in rows], "d-", color="tab:green", label="ingest")
    ax2.plot(widths, [r["e2e_speedup"] for r in rows], "d:", color="tab:olive",
             label="router encode + ingest")  # fmt: skip
    ax2.axhline(1.0, color="grey", lw=0.8)
    if cross is not None:
        ax2.axvline(cross, color="tab:blue", lw=0.8, ls=":", label=f"crossover ({cross})")
    ax2.axvline(DEFAULT_COLUMNAR_MIN_REPLICAS, color="tab:purple", lw=0.8, ls="-.",
                label=f"default gate ({DEFAULT_COLUMNAR_MIN_REPLICAS})")  # fmt: skip
    ax2.axhline(TARGET_SPEEDUP_4096, color="tab:red", lw=0.8, ls="--", label="target at 4096")
    ax2.set(xscale="log", yscale="log", xlabel="replicas per report", ylabel="object / columnar")
    ax2.set_title("Speedup of columnar")
    ax2.legend()
    ax2.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return shown(path)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--handles", type=int, default=4, help="handles (routers) reporting")
    ap.add_argument("--widths", type=int, nargs="+", help=f"default: {' '.join(map(str, WIDTHS))}")
    ap.add_argument("--seed", type=int, default=1)
    add_smoke(ap, f"widths {' '.join(map(str, SMOKE_WIDTHS))}, {SMOKE_REPS} reports per path")
    args = ap.parse_args(argv)
    widths = sorted(set(args.widths or (SMOKE_WIDTHS if args.smoke else WIDTHS)))
    out_dir: Path | None = None
    if args.smoke and not os.environ.get(OUT_ENV):
        # never the real results or the docs' plot, even when run by hand
        out_dir = Path(tempfile.mkdtemp(prefix="fleetpulse-ingest-smoke-"))
    rng = np.random.default_rng(args.seed)
    rows = []
    for w in widths:
        reps = SMOKE_REPS if args.smoke else reps_for(w, args.quick)
        rows.append(bench_width(w, args.handles, reps, rng, small=args.smoke))
        print(f"  width {w}: done", file=sys.stderr, flush=True)
    cross = crossover(rows)
    print_table(
        f"Ingest per report, {args.handles} handles, health on every row (ms; p50 unless said)",
        ["width", "reps", "object", "columnar", "speedup", "col>=obj", "obj decode",
         "col decode", "col cold", "snapshot", "incr", "obj encode", "col encode", "e2e speedup"],
        [
            [r["width"], r["reps"], r["object"]["p50_ms"], r["columnar"]["p50_ms"],
             r["speedup"], _verdict(r, cross), r["object_decode_ms"], r["columnar_decode_ms"],
             r["columnar_cold_ms"], r["snapshot_ms"], r["incremental_total_ms"],
             r["object_encode_ms"], r["columnar_encode_ms"], r["e2e_speedup"]]
            for r in rows
        ],
    )  # fmt: skip
    cross_interp = crossover_interpolated(rows)
    cross_e2e = crossover(rows, "e2e_speedup")
    gate = recommended_gate(rows, cross)
    print(
        f"\ncrossover (controller ingest): {cross} replicas per report (smallest measured width"
        " from which columnar >= object at every wider one)"
    )
    print(f"  interpolated where the speedup first rises through 1: {_rounded(cross_interp)}")
    print(f"crossover with the router's encode added: {cross_e2e}")
    print(f"gate the data supports (power of two at or above the crossover): {gate}")
    print(f"current default FLEETPULSE_COLUMNAR_MIN_REPLICAS = {DEFAULT_COLUMNAR_MIN_REPLICAS}")
    targets = check_targets(rows, DEFAULT_COLUMNAR_MIN_REPLICAS)
    for name, ok in targets.items():
        print(f"target {name}: {'-' if ok is None else 'met' if ok else 'MISSED'}")
    png = plot(rows, (out_dir / "img" / PLOT_NAME) if out_dir else plot_path(PLOT_NAME), cross)
    path = write_json(
        "ingest",
        {
            "quick": args.quick,
            "smoke": args.smoke,
            "handles": args.handles,
            "rows": rows,
            "crossover_width": cross,
            "crossover_interpolated": cross_interp,
            "crossover_with_encode": cross_e2e,
            "recommended_min_replicas": gate,
            "default_min_replicas": DEFAULT_COLUMNAR_MIN_REPLICAS,
            "targets": targets,
            "plot": png,
        },
        out_dir,
    )
    print(f"wrote {shown(path)}" + (f" and {png}" if png else ""))
    for r in rows:
        result_line("ingest", width=r["width"], speedup=float(r["speedup"]),
                    e2e_speedup=float(r["e2e_speedup"]))  # fmt: skip
    result_line(
        "ingest",
        crossover="none" if cross is None else cross,
        crossover_interpolated="none" if cross_interp is None else round(cross_interp, 1),
        crossover_with_encode="none" if cross_e2e is None else cross_e2e,
        gate=DEFAULT_COLUMNAR_MIN_REPLICAS,
        supported_gate="none" if gate is None else gate,
    )
    return 0


def _verdict(row: dict[str, Any], cross: int | None) -> str:
    """The table's col>=obj cell: whether columnar ingest kept up, the crossover row marked."""
    mark = "yes" if row["speedup"] >= 1.0 else "no"
    return f"{mark} <- crossover" if row["width"] == cross else mark


def _rounded(x: float | None) -> str:
    return "none" if x is None else f"{x:.1f}"


if __name__ == "__main__":
    sys.exit(main())

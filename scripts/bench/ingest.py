"""Ingest benchmark: decode + merge of handle reports, msgpack object path vs FPC1 columnar path.

For each width W, a deployment of W running replicas gets reports from several handles, each
report covering all W replicas with running requests and health for every replica. One sample
is one report: format detection, decode, staleness gate, merge into `DeploymentMetrics` and
health extraction. Both paths run in the same process on the same data (distinct payloads per
report, so the staleness gate accepts every one), alternating report by report, steady state with
the slot-map cache warm; the cold-cache cost (a fresh store's first columnar report) is measured
separately. Also measured: decode alone per path, the aggregate recompute (`snapshot`) and what
an incremental running total would add per report.

    .venv/bin/python -m scripts.bench.ingest [--quick] [--handles 4] [--widths 16 64 ...]

Output: a table, bench-results/ingest.json, docs/img/ingest.png, one RESULT line per width.
"""

from __future__ import annotations

import argparse
import functools
import gc
import itertools
import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from scripts.bench.common import ROOT, percentiles, print_table, result_line, write_json
from services.controller.metrics_store import DeploymentMetrics
from services.controller.replica_index import ReplicaIndex
from shared.wire.codec import decode_as, encode
from shared.wire.columnar import (
    DEFAULT_COLUMNAR_MIN_REPLICAS,
    decode_handle_report_columnar,
    detect_format,
    encode_handle_report_columnar,
)
from shared.wire.messages import HandleReport, HealthStatus

WIDTHS = (16, 64, 256, 1024, 4096, 16384)
SAMPLE_BUDGET = 2_000_000  # replica-rows per width and path: reps = budget / width, clamped
MIN_REPS, MAX_REPS = 15, 500
QUICK_DIVISOR = 10
COLD_REPS = 5
ROUND = 8  # reports per path before switching to the other path
TARGET_SPEEDUP_4096 = 50.0
PLOT_PATH = ROOT / "docs" / "img" / "ingest.png"
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


def payloads(
    ids: list[str], handles: int, reps: int, rng: np.random.Generator
) -> tuple[list[bytes], list[bytes]]:
    """The same reports in both formats, round-robin over handles, seq increasing."""
    w = len(ids)
    obj: list[bytes] = []
    col: list[bytes] = []
    for i in range(reps):
        hid = f"handle-{i % handles}"
        running = rng.integers(0, 8, w).astype(np.float64)
        healthy = rng.random(w) < 0.99
        checked = 1.7e9 + i + rng.random(w)
        failures = np.where(healthy, 0, rng.integers(1, 4, w))
        meta: dict[str, Any] = dict(
            handle_id=hid, app="bench", deployment="ingest", sent_at=1.7e9 + i, seq=i,
            queued_requests=float(i % 3), membership_epoch=1,
        )  # fmt: skip
        health = tuple(
            HealthStatus(r, bool(h), float(c), int(f))
            for r, h, c, f in zip(ids, healthy, checked, failures, strict=True)
        )
        report = HandleReport(
            **meta, running=dict(zip(ids, running.tolist(), strict=True)), health=health
        )
        obj.append(encode(report))
        parts = encode_handle_report_columnar(
            **meta, replica_ids=ids, running=running, health_healthy=healthy,
            health_checked_at=checked, health_failures=failures,
        )  # fmt: skip
        if len(parts) != 1:
            raise SystemExit(f"width {w}: expected one FPC1 part, got {len(parts)}")
        col.append(parts[0])
    return obj, col


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


def timed_pair(
    ids: Sequence[str], obj: Sequence[bytes], col: Sequence[bytes], warm: int
) -> tuple[list[float], list[float], DeploymentMetrics]:
    """Per-report seconds of both paths, in alternating rounds of ROUND reports per path, so
    drift in machine load hits both alike while each path runs on its own warm CPU caches.
    The first `warm` reports of each path (slot-map cache cold) are not timed."""
    stores = (make_store(ids), make_store(ids))
    paths = ((ingest_object, obj), (ingest_columnar, col))
    samples: tuple[list[float], list[float]] = ([], [])
    gc.collect()
    gc.disable()
    try:
        for start in range(0, len(obj), ROUND):
            for (fn, data), store, out in zip(paths, stores, samples, strict=True):
                for i in range(start, min(start + ROUND, len(data))):
                    t0 = time.perf_counter()
                    fn(store, data[i], float(i))
                    if i >= warm:
                        out.append(time.perf_counter() - t0)
    finally:
        gc.enable()
    return samples[0], samples[1], stores[1]


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


def bench_width(w: int, handles: int, quick: bool, rng: np.random.Generator) -> dict[str, Any]:
    ids = [f"replica-{i:05d}-{rng.integers(1 << 20):05x}" for i in range(w)]
    # Reports list replicas in the router's order, not the controller's slot order.
    ids = [ids[i] for i in rng.permutation(w)]
    reps = reps_for(w, quick)
    warm = handles  # one report per handle warms the slot-map cache
    obj, col = payloads(ids, handles, reps + warm, rng)
    out: dict[str, Any] = {"width": w, "reps": reps, "handles": handles}
    obj_s, col_s, store = timed_pair(ids, obj, col, warm)
    for name, samples, data in (("object", obj_s, obj), ("columnar", col_s, col)):
        out[name] = percentiles(samples)
        out[name]["payload_bytes"] = len(data[0])
    out["snapshot_ms"] = median_s(functools.partial(store.snapshot, 0.0), 50) * 1e3
    out["columnar_cold_ms"] = cold_columnar(ids, col) * 1e3
    # Decode alone, to split each path's time between the wire decoder and the store.
    decode_obj = functools.partial(decode_as, obj[-1], HandleReport)
    out["object_decode_ms"] = median_s(decode_obj, min(reps, 100)) * 1e3
    decode_col = functools.partial(decode_handle_report_columnar, col[-1])
    out["columnar_decode_ms"] = median_s(decode_col, 200) * 1e3
    # What an incremental total would add to every report: subtract the old row, add the new.
    total, old, new = np.zeros(w), np.ones(w), np.ones(w)

    def incremental() -> None:
        total.__isub__(old)
        total.__iadd__(new)

    out["incremental_total_ms"] = median_s(incremental, 200) * 1e3
    out["speedup"] = out["object"]["p50_ms"] / out["columnar"]["p50_ms"]
    return out


def crossover(rows: Sequence[dict[str, Any]]) -> float | None:
    """Width where the speedup first rises through 1, interpolated on log-log; None if it does
    not cross within the measured widths."""
    pts = [(math.log(r["width"]), math.log(r["speedup"])) for r in rows]
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if y0 < 0 <= y1:
            return math.exp(x0 - y0 * (x1 - x0) / (y1 - y0))
    return None


def recommended_gate(rows: Sequence[dict[str, Any]], cross: float | None) -> int | None:
    """The power of two at or above the crossover, provided columnar is not slower at any
    measured width from there on; None if the data cannot support a gate."""
    if cross is None:
        return rows[0]["width"] if all(r["speedup"] >= 1.0 for r in rows) else None
    gate = 1 << math.ceil(math.log2(cross))
    return gate if all(r["speedup"] >= 1.0 for r in rows if r["width"] >= gate) else None


def check_targets(rows: Sequence[dict[str, Any]]) -> dict[str, bool | None]:
    """The brief's targets, None where the width was not measured."""
    by_width = {r["width"]: r["speedup"] for r in rows}
    at_4096, at_64 = by_width.get(4096), by_width.get(64)
    return {
        f"speedup >= {TARGET_SPEEDUP_4096:g}x at 4096": (
            None if at_4096 is None else at_4096 >= TARGET_SPEEDUP_4096
        ),
        "columnar not slower at 64": None if at_64 is None else at_64 >= 1.0,
    }


def plot(rows: Sequence[dict[str, Any]]) -> str | None:
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
    ax.set_title("Decode + merge + health extraction")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    ax2.plot(widths, [r["speedup"] for r in rows], "d-", color="tab:green")
    ax2.axhline(1.0, color="grey", lw=0.8)
    ax2.axhline(TARGET_SPEEDUP_4096, color="tab:red", lw=0.8, ls="--", label="target at 4096")
    ax2.set(xscale="log", yscale="log", xlabel="replicas per report", ylabel="object / columnar")
    ax2.set_title("Speedup")
    ax2.legend()
    ax2.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    PLOT_PATH.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(PLOT_PATH, dpi=110)
    plt.close(fig)
    return str(PLOT_PATH.relative_to(ROOT))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    ap.add_argument("--handles", type=int, default=4, help="handles (routers) reporting")
    ap.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS))
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    rows = []
    for w in sorted(args.widths):
        rows.append(bench_width(w, args.handles, args.quick, rng))
        print(f"  width {w}: done", file=sys.stderr, flush=True)
    print_table(
        f"Ingest per report, {args.handles} handles, health on every row (ms)",
        ["width", "reps", "object p50", "columnar p50", "speedup", "obj decode", "col decode",
         "col cold", "snapshot", "incr"],
        [
            [r["width"], r["reps"], r["object"]["p50_ms"], r["columnar"]["p50_ms"],
             r["speedup"], r["object_decode_ms"], r["columnar_decode_ms"], r["columnar_cold_ms"],
             r["snapshot_ms"], r["incremental_total_ms"]]
            for r in rows
        ],
    )  # fmt: skip
    cross = crossover(rows)
    gate = recommended_gate(rows, cross)
    print(f"\ncrossover width ~ {cross if cross is None else round(cross, 1)}")
    print(f"gate the data supports (power of two at or above the crossover): {gate}")
    print(f"current default FLEETPULSE_COLUMNAR_MIN_REPLICAS = {DEFAULT_COLUMNAR_MIN_REPLICAS}")
    targets = check_targets(rows)
    for name, ok in targets.items():
        print(f"target {name}: {'met' if ok else 'MISSED'}")
    path = plot(rows)
    out = write_json(
        "ingest",
        {
            "quick": args.quick,
            "handles": args.handles,
            "rows": rows,
            "crossover_width": cross,
            "recommended_min_replicas": gate,
            "default_min_replicas": DEFAULT_COLUMNAR_MIN_REPLICAS,
            "targets": targets,
            "plot": path,
        },
    )
    print(f"wrote {out.relative_to(ROOT)}" + (f" and {path}" if path else ""))
    for r in rows:
        result_line("ingest", width=r["width"], speedup=float(r["speedup"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Decode off the event loop: the fleet benchmark with the controller's columnar decode inline vs
on a worker thread (`--decode-threads 0` / `1`), alternated.

Per replica count, `--rounds` rounds; each round runs both modes one after the other as separate
fleet points (a fresh server, controller and simulated fleet each), in ABBA order across rounds
so a drift in the machine's load hits both alike. Interval 1 s (the heavy ingest case), the
fleet benchmark's other defaults. Reported per mode: loop p50/p99 (median and range over rounds),
controller CPU, ingest ms per second, deadline misses; and the thread/inline ratio of each round.

    .venv/bin/python -m scripts.bench.decode_thread [--sizes 65536 262144] [--rounds 2]

`--micro` measures the mechanism alone, in one process, without the fleet's other load: a
100 ms ticker doing `--tick-ms` of work, and the columnar handle reports of N replicas (16
deployments x 4 routers, 1 s interval, parts of at most 256 KiB) decoded and merged into real
metric stores, inline vs through the worker thread in alternating windows; the ticker's
lateness (how long a due tick waited for the loop) is the number the thread should cut.

`--smoke`: both of the above in seconds: 256 replicas, one round of each mode (2 s warm-up, 3 s
window), then the mechanism alone for 3 s per mode (scripts/bench/smoke.py runs it).

Output: a table, bench-results/decode_thread.json, one RESULT line per size.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scripts.bench import fleet
from scripts.bench.common import add_smoke, print_table, result_line, write_json
from services.controller.machinery.decode_pipeline import Decoded, DecodePipeline
from services.controller.metrics_store import DeploymentMetrics
from services.controller.replica_index import ReplicaIndex
from shared.errors import WireError
from shared.wire.columnar import decode_handle_report_columnar, encode_handle_report_columnar
from shared.wire.limits import REPORT_PART_MAX_BYTES

MODES = {0: "inline", 1: "thread"}
SMOKE: dict[str, Any] = {
    "sizes": [256], "rounds": 1, "warm_s": 2.0, "measure_s": 3.0, "deployments": 4,
    "startup_timeout_s": 120.0,
}  # fmt: skip
KEYS = ("loop_p50_ms", "loop_p99_ms", "controller_cpu", "misses_pct")


def order(rnd: int) -> tuple[int, int]:
    return (0, 1) if rnd % 2 == 0 else (1, 0)


def summary(rows: list[dict[str, Any]], key: str) -> str:
    values = [float(r[key]) for r in rows]
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def ingest_ms_per_s(row: dict[str, Any]) -> float:
    per = row.get("ingest_ms_per_s") or {}
    return float(sum(per.values())) if isinstance(per, dict) else float(per)


# -- the mechanism alone --------------------------------------------------------------------------

DEPLOYMENTS, ROUTERS, TICK_S = 16, 4, 0.1


def micro_payloads(n: int, seconds: int) -> tuple[list[list[str]], list[tuple[int, bytes]]]:
    """Per deployment its replica ids; and one second's worth of report parts per second of the
    window, in wire order: (deployment, part)."""
    rng = np.random.default_rng(1)
    width = n // DEPLOYMENTS
    ids = [[f"d{d:02d}-r{i:06d}" for i in range(width)] for d in range(DEPLOYMENTS)]
    out: list[tuple[int, bytes]] = []
    for s in range(seconds):
        for d in range(DEPLOYMENTS):
            for h in range(ROUTERS):
                parts = encode_handle_report_columnar(
                    handle_id=f"h{h}", app="bench", deployment=f"d{d:02d}", sent_at=1.7e9 + s,
                    seq=s + 1, queued_requests=0.0, membership_epoch=1, replica_ids=ids[d],
                    running=rng.integers(0, 4, width).astype(np.float64),
                    health_healthy=np.ones(width, bool),
                    health_checked_at=1.7e9 + s + rng.random(width),
                    health_failures=np.zeros(width, np.int64),
                    max_payload=REPORT_PART_MAX_BYTES,
                )  # fmt: skip
                out += [(d, p) for p in parts]
    return ids, out


async def micro_window(
    threads: int, ids: list[list[str]], parts: list[tuple[int, bytes]], seconds: int, tick_s: float
) -> list[float]:
    stores = []
    for dep in ids:
        index = ReplicaIndex()
        index.sync(dep)
        store = DeploymentMetrics(index, 1.0)
        store.set_running(dep)
        stores.append(store)
    pipeline = DecodePipeline(threads)
    loop = asyncio.get_running_loop()
    lateness: list[float] = []
    per_s = len(parts) // seconds
    start = loop.time()

    async def ticker() -> None:
        due = start + TICK_S
        while due < start + seconds:
            await asyncio.sleep(max(0.0, due - loop.time()))
            lateness.append(loop.time() - due)
            end = time.perf_counter() + tick_s
            while time.perf_counter() < end:  # the tick's own work holds the loop (and the GIL)
                pass
            due += TICK_S

    async def feeder() -> None:
        for i, (d, data) in enumerate(parts):
            at = start + i / per_s
            # one message per loop iteration, as the bus delivers them (never a burst)
            await asyncio.sleep(max(0.0, at - loop.time()))
            store = stores[d]

            def apply(
                decoded: Decoded, store: DeploymentMetrics = store, data: bytes = data
            ) -> None:
                part = decoded if decoded is not None else decode_handle_report_columnar(data)
                assert not isinstance(part, WireError)
                store.ingest_columnar(part, loop.time())

            pipeline.submit(data, True, apply)

    await asyncio.gather(ticker(), feeder())
    while pipeline.pending:  # noqa: ASYNC110 - drained through call_soon_threadsafe
        await asyncio.sleep(0.001)
    pipeline.close()
    return lateness


def micro(a: argparse.Namespace) -> int:
    seconds = int(a.measure_s)
    rows: list[dict[str, Any]] = []
    for n in a.sizes:
        ids, parts = micro_payloads(n, seconds)
        late: dict[str, list[float]] = {m: [] for m in MODES.values()}
        for rnd in range(a.rounds):
            for mode in order(rnd):
                gc.collect()
                late[MODES[mode]] += asyncio.run(
                    micro_window(mode, ids, parts, seconds, a.tick_ms / 1e3)
                )
        row: dict[str, Any] = {"replicas": n, "parts_per_s": len(parts) / seconds}
        for m, xs in late.items():
            row[f"{m}_late_p50_ms"] = float(np.percentile(xs, 50)) * 1e3
            row[f"{m}_late_p99_ms"] = float(np.percentile(xs, 99)) * 1e3
            row[f"{m}_late_max_ms"] = max(xs) * 1e3
        rows.append(row)
    print_table(
        f"Tick lateness, 100 ms ticks of {a.tick_ms:g} ms work, columnar ingest at 1 s (ms)",
        ["replicas", "parts/s", "inline p50", "inline p99", "inline max", "thread p50",
         "thread p99", "thread max"],
        [[r["replicas"], f"{r['parts_per_s']:.0f}",
          *(f"{r[f'{m}_late_{q}_ms']:.2f}" for m in MODES.values() for q in ("p50", "p99", "max"))]
         for r in rows],
    )  # fmt: skip
    out = write_json("decode_thread_micro", {"args": vars(a), "rows": rows})
    print(f"wrote {out}")
    for r in rows:
        result_line(
            "decode_thread_micro", replicas=r["replicas"],
            late_p99_ratio=r["thread_late_p99_ms"] / max(r["inline_late_p99_ms"], 1e-9),
        )  # fmt: skip
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[65536, 262144])
    ap.add_argument("--rounds", type=int, default=2, help="rounds per size (each runs both modes)")
    ap.add_argument("--warm-s", type=float, default=20.0)
    ap.add_argument("--measure-s", type=float, default=40.0)
    ap.add_argument("--deployments", type=int, default=16)
    ap.add_argument("--startup-timeout-s", type=float, default=900.0)
    ap.add_argument("--retention-s", type=float, default=120.0, help="the controller's")
    ap.add_argument("--micro", action="store_true", help="the mechanism alone (see above)")
    ap.add_argument("--tick-ms", type=float, default=1.5, help="--micro: work per tick")
    add_smoke(ap, "256 replicas, one round of each mode, then --micro for 3 s per mode")
    a = ap.parse_args(argv)
    if a.smoke:
        for k, v in SMOKE.items():
            setattr(a, k, v)
    if a.micro:
        return micro(a)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="decode-thread-") as tmp:
        for n in a.sizes:
            for rnd in range(a.rounds):
                for mode in order(rnd):
                    args = fleet.with_defaults(
                        fleet.parser().parse_args(
                            [
                                "--sizes", str(n), "--intervals", "1",
                                "--deployments", str(a.deployments),
                                "--warm-s", str(a.warm_s), "--measure-s", str(a.measure_s),
                                "--startup-timeout-s", str(a.startup_timeout_s),
                                "--decode-threads", str(mode), "--faults", "0", "--no-plot",
                                "--retention-s", str(a.retention_s),
                            ]
                        )
                    )  # fmt: skip
                    work = Path(tmp) / f"{n}-{rnd}-{MODES[mode]}"
                    work.mkdir()
                    print(f"N={n} round {rnd + 1}/{a.rounds}: decode {MODES[mode]}", flush=True)
                    (row,) = asyncio.run(fleet.Point(n, args, work).run())
                    row.update(
                        mode=MODES[mode], round=rnd, ingest_total_ms_per_s=ingest_ms_per_s(row)
                    )
                    rows.append(row)
    table: list[list[str]] = []
    results: list[dict[str, Any]] = []
    for n in a.sizes:
        at = [r for r in rows if r["replicas"] == n]
        by = {m: [r for r in at if r["mode"] == m] for m in MODES.values()}
        ratios = [
            t["loop_p99_ms"] / i["loop_p99_ms"]
            for i, t in zip(by["inline"], by["thread"], strict=True)
            if i["loop_p99_ms"] > 0
        ]
        for m, rs in by.items():
            table.append(
                [str(n), m, *(summary(rs, k) for k in KEYS), summary(rs, "ingest_total_ms_per_s")]
            )
        results.append(
            {"replicas": n, "p99_ratio_thread_over_inline": ratios,
             "p99_ratio_median": statistics.median(ratios) if ratios else None}
        )  # fmt: skip
    print_table(
        "Decode inline vs on a worker thread, interval 1 s (median (range) over rounds)",
        ["replicas", "decode", "loop p50 ms", "loop p99 ms", "cpu", "misses %", "ingest ms/s"],
        table,
    )
    for r in results:
        print(
            f"N={r['replicas']}: loop p99 thread/inline per round {r['p99_ratio_thread_over_inline']}"
        )
    out = write_json("decode_thread", {"args": vars(a), "rows": rows, "results": results})
    print(f"wrote {out}")
    for r in results:
        result_line("decode_thread", replicas=r["replicas"], p99_ratio=r["p99_ratio_median"])
    if a.smoke:  # and the mechanism alone, so that both paths keep working
        return micro(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())

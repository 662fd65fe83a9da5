"""Decode off the event loop: the fleet benchmark with the controller's columnar decode inline vs
on a worker thread (`--decode-threads 0` / `1`), alternated.

Per replica count, `--rounds` rounds; each round runs both modes one after the other as separate
fleet points (a fresh server, controller and simulated fleet each), in ABBA order across rounds
so a drift in the machine's load hits both alike. Interval 1 s (the heavy ingest case), the
fleet benchmark's other defaults. Reported per mode: loop p50/p99 (median and range over rounds),
controller CPU, ingest ms per second, deadline misses; and the thread/inline ratio of each round.

    .venv/bin/python -m scripts.bench.decode_thread [--sizes 65536 262144] [--rounds 2]

Output: a table, bench-results/decode_thread.json, one RESULT line per size.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scripts.bench import fleet
from scripts.bench.common import print_table, result_line, write_json

MODES = {0: "inline", 1: "thread"}
KEYS = ("loop_p50_ms", "loop_p99_ms", "controller_cpu", "misses_pct")


def order(rnd: int) -> tuple[int, int]:
    return (0, 1) if rnd % 2 == 0 else (1, 0)


def summary(rows: list[dict[str, Any]], key: str) -> str:
    values = [float(r[key]) for r in rows]
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def ingest_ms_per_s(row: dict[str, Any]) -> float:
    per = row.get("ingest_ms_per_s") or {}
    return float(sum(per.values())) if isinstance(per, dict) else float(per)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[65536, 262144])
    ap.add_argument("--rounds", type=int, default=2, help="rounds per size (each runs both modes)")
    ap.add_argument("--warm-s", type=float, default=20.0)
    ap.add_argument("--measure-s", type=float, default=40.0)
    ap.add_argument("--deployments", type=int, default=16)
    ap.add_argument("--startup-timeout-s", type=float, default=900.0)
    a = ap.parse_args(argv)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The fleet benchmark's probes: process CPU and memory (/proc), nats-server /varz, the controller's
--stats-file as it grows, and the per-window figures taken from them (scripts/bench/fleet.py)."""

from __future__ import annotations

import json
import math
import os
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from scripts.bench.fleet_report import STALE_AFTER_S
from scripts.bench.fleet_sim import GAP_BIN_S
from shared.natsserver import NatsServer

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | str = "self") -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


def varz(server: NatsServer) -> dict[str, Any]:
    with urllib.request.urlopen(server.monitor_url + "/varz", timeout=2) as r:
        doc: dict[str, Any] = json.loads(r.read())
    return doc


class StatsFile:
    """Reads the controller's --stats-file as it grows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: list[dict[str, Any]] = []
        self._offset = 0

    def poll(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return self.lines
        with self.path.open() as f:
            f.seek(self._offset)
            chunk = f.read()
        end = chunk.rfind("\n") + 1
        self._offset += len(chunk[:end].encode())
        self.lines += [json.loads(x) for x in chunk[:end].splitlines() if x]
        return self.lines

    def ticks(self, t0: float, t1: float) -> np.ndarray:
        """[start, duration, late, core, core_cpu] per tick (core_cpu NaN in older files)."""
        rows = [
            [*t, math.nan][:5] for line in self.poll() for t in line["ticks"] if t0 <= t[0] < t1
        ]
        return np.asarray(rows, dtype=np.float64).reshape(-1, 5)

    def writes(self, t0: float, t1: float) -> np.ndarray:
        """Durations of the KV write attempts reported in lines written in [t0, t1)."""
        return np.asarray(
            [w for line in self.poll() if t0 <= line["mono"] < t1 for w in line.get("writes", ())],
            dtype=np.float64,
        )

    def last(self) -> dict[str, Any]:
        lines = self.poll()
        return lines[-1] if lines else {}


def member_row(member: str, stats: StatsFile, t0: float, t1: float, cpu: float) -> dict[str, Any]:
    ticks = stats.ticks(t0, t1)
    loop = ticks[:, 1] * 1e3
    return {
        "member": member, "ticks": int(loop.size), "loop_p50_ms": pct(loop, 50),
        "loop_p99_ms": pct(loop, 99), "core_p99_ms": pct(ticks[:, 3] * 1e3, 99),
        "core_cpu_p99_ms": pct(ticks[:, 4] * 1e3, 99), "cpu": cpu,
        "kv_writes_per_s": stats.writes(t0, t1).size / (t1 - t0),
    }  # fmt: skip


def sum_lines(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """The members' cumulative stats-file counters, added up."""
    ingest: dict[str, float] = {}
    for x in lines:
        for k, v in x.get("ingest_s", {}).items():
            ingest[k] = ingest.get(k, 0.0) + v
    return {
        "ingest_s": ingest,
        "gc_s": [sum(x.get("gc_s", [0] * 3)[i] for x in lines) for i in range(3)],
        "gc_n": [sum(x.get("gc_n", [0] * 3)[i] for x in lines) for i in range(3)],
        "writes_failed": sum(x.get("writes_failed", 0) for x in lines),
        "probes": sum(x.get("probes", 0) for x in lines),
    }


def delta(b: dict[str, Any], e: dict[str, Any], key: str) -> list[float]:
    return [x - y for x, y in zip(e.get(key, [0] * 3), b.get(key, [0] * 3), strict=True)]


def pct(a: np.ndarray, q: float) -> float:
    return float(np.nanpercentile(a, q)) if a.size and not np.isnan(a).all() else math.nan


def gaps(hist: np.ndarray) -> dict[str, float]:
    total = int(hist.sum())
    if not total:
        return {"gap_p50_s": math.nan, "gap_p99_s": math.nan, "gap_max_s": math.nan,
                "gaps_over_stale_pct": math.nan}  # fmt: skip
    cum = np.cumsum(hist)
    edges = (np.arange(hist.size) + 1) * GAP_BIN_S  # upper edge of each bin
    over = int(hist[int(STALE_AFTER_S / GAP_BIN_S) :].sum())
    return {
        "gap_p50_s": float(edges[np.searchsorted(cum, 0.5 * total)]),
        "gap_p99_s": float(edges[np.searchsorted(cum, 0.99 * total)]),
        "gap_max_s": float(edges[np.flatnonzero(hist)[-1]]),
        "gaps_over_stale_pct": 100.0 * over / total,
    }

"""`--stats-file`: a small machine-readable dump of the control loop, for benchmarks.

How it works: the service reports every tick's duration (and how late it started against its
schedule) and the time spent ingesting each message, by kind; every `interval_s` the collected
ticks go out as one JSON line appended to the file, with cumulative counters. A tick's `duration`
is all of it: deciding, then carrying out the actions (KV writes go to the write-behind queue,
kv_writer.py, whose attempts are listed apart; probes are spawned). `core` is the decision alone
(`ControllerCore.tick`) and `core_cpu` the CPU time its thread spent in it: a `core` much longer
than its `core_cpu` is the process waiting for a CPU, not work (or the collector, listed in
"gc"). The Prometheus histogram `fleetpulse_controller_loop_seconds` has coarse buckets; this
file gives exact per-tick samples so a benchmark can take p50/p99 over any window it chooses.

One line (all times in seconds; `mono` is the controller's monotonic clock, `wall` unix time):

    {"wall": ..., "mono": ..., "ticks": [[mono_start, duration, late, core, core_cpu], ...],
     "ingest_s": {"handle_columnar": ..., "handle_msgpack": ..., "replica": ...,
                  "heartbeat": ..., "lifecycle": ...},            # cumulative
     "ingest_n": {...},                                           # cumulative messages
     "gc_s": [gen0, gen1, gen2], "gc_n": [...],                  # cumulative collections
     "gc": [[mono_start, seconds, generation], ...],              # this line's collections
     "writes": [seconds, ...],                                    # this line's KV write attempts
     "writes_failed": N,                                          # cumulative
     "probes": N, "pending": N, "stalled": bool, "live": bool}

Off unless the flag is given; when on, the cost is two `perf_counter` calls per message and one
small write per `interval_s`.
"""

from __future__ import annotations

import gc
import json
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import IO, Any

from shared.subjects import Subjects
from shared.wire.columnar import COLUMNAR_MAGIC

DEFAULT_STATS_INTERVAL_S = 1.0


def ingest_kind(subjects: Subjects, subject: str, data: bytes) -> str:
    """`fp.v1.report.{kind}.{app}.{deployment}` -> kind; handle reports split by format."""
    kind = subjects.report_kind(subject)
    if kind == "handle":
        return "handle_columnar" if data[:4] == COLUMNAR_MAGIC else "handle_msgpack"
    return kind


class StatsDump:
    def __init__(self, path: str, interval_s: float = DEFAULT_STATS_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._file: IO[str] = Path(path).open("a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._ticks: list[tuple[float, ...]] = []
        self.ingest_s: defaultdict[str, float] = defaultdict(float)
        self.ingest_n: Counter[str] = Counter()
        self._next_write = 0.0
        self.gc_s = [0.0, 0.0, 0.0]
        self.gc_n = [0, 0, 0]
        self._gc_started = 0.0
        self._gc_events: list[tuple[float, float, int]] = []
        self._writes: list[float] = []
        self.writes_failed = 0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        # collector pauses land inside whatever allocated: count them to explain tick outliers
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        gen = min(info.get("generation", 0), 2)
        took = time.perf_counter() - self._gc_started
        self.gc_s[gen] += took
        self.gc_n[gen] += 1
        # perf_counter and the controller's monotonic clock are both CLOCK_MONOTONIC on Linux
        self._gc_events.append((self._gc_started, took, gen))

    def wrote(self, seconds: float, ok: bool) -> None:
        """One KV write attempt of the write-behind queue (kv_writer.py) and how long it took."""
        self._writes.append(seconds)
        self.writes_failed += not ok

    def ingested(self, kind: str, seconds: float) -> None:
        self.ingest_s[kind] += seconds
        self.ingest_n[kind] += 1

    def tick(
        self, start_mono: float, duration_s: float, late_s: float, core_s: float,
        core_cpu_s: float,
    ) -> None:  # fmt: skip
        self._ticks.append((start_mono, duration_s, late_s, core_s, core_cpu_s))

    def maybe_write(self, now_mono: float, **extra: Any) -> None:
        if now_mono < self._next_write:
            return
        self._next_write = now_mono + self.interval_s
        doc = {
            "wall": time.time(),
            "mono": now_mono,
            "ticks": [[round(x, 7) for x in t] for t in self._ticks],
            "ingest_s": {k: round(v, 6) for k, v in self.ingest_s.items()},
            "ingest_n": dict(self.ingest_n),
            "gc_s": [round(x, 6) for x in self.gc_s],
            "gc_n": list(self.gc_n),
            "gc": [[round(t, 6), round(d, 7), g] for t, d, g in self._gc_events],
            "writes": [round(x, 7) for x in self._writes],
            "writes_failed": self.writes_failed,
            **extra,
        }
        self._ticks.clear()
        self._gc_events.clear()
        self._writes.clear()
        self._file.write(json.dumps(doc, separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        self._file.close()

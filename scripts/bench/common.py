"""Helpers every benchmark uses: percentiles, a table, JSON output and the RESULT line.

Where output goes: `results_dir()` (bench-results/) for the JSON, `plot_path(NAME)`
(docs/img/NAME) for a plot. With FLEETPULSE_BENCH_OUT set, both go under that directory instead
(plots in its img/): the smoke runner sets it, so a smoke run never overwrites a real result or a
plot the docs show.

Smoke runs: every benchmark with a `main` takes `--smoke` (seconds, tiny sizes, the real servers
and processes), and `python -m scripts.bench.smoke` runs them all, each in its own process; it
fails when one exits non-zero or prints no `RESULT bench=` line (CI runs it, see .ci/run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = ROOT / "bench-results"
PLOTS_DIR = ROOT / "docs" / "img"
OUT_ENV = "FLEETPULSE_BENCH_OUT"
"""When set, the directory every result and plot goes to instead of bench-results/ and docs/img/."""


def add_smoke(ap: argparse.ArgumentParser, what: str) -> None:
    """The `--smoke` flag of a benchmark; `what` says what the smoke run shrinks to."""
    ap.add_argument(
        "--smoke", action="store_true",
        help=f"a run of seconds through the same code path: {what} (scripts/bench/smoke.py)",
    )  # fmt: skip


def results_dir() -> Path:
    """bench-results/, or $FLEETPULSE_BENCH_OUT when set."""
    out = os.environ.get(OUT_ENV)
    return Path(out) if out else RESULTS_DIR


def plot_path(name: str) -> Path:
    """docs/img/NAME, or $FLEETPULSE_BENCH_OUT/img/NAME when set (a smoke run's plot must not
    replace the one the docs show)."""
    out = os.environ.get(OUT_ENV)
    return (Path(out) / "img" if out else PLOTS_DIR) / name


def shown(path: Path) -> str:
    """A path to print: relative to the repository when inside it, else as it is."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def percentiles(samples_s: Sequence[float]) -> dict[str, float]:
    a = np.asarray(samples_s, dtype=np.float64) * 1e3
    return {
        "n": int(a.size),
        "p50_ms": float(np.percentile(a, 50)),
        "p90_ms": float(np.percentile(a, 90)),
        "p99_ms": float(np.percentile(a, 99)),
        "mean_ms": float(a.mean()),
    }


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    def fmt(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    cells = [[fmt(v) for v in row] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print(f"\n{title}")
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True)))
    for r in cells:
        print("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)))


def write_json(name: str, payload: Mapping[str, Any], out_dir: Path | None = None) -> Path:
    out = out_dir or results_dir()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    doc = {"bench": name, "machine": machine_facts(), **payload}
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return path


def result_line(bench: str, **fields: object) -> str:
    parts = [f"bench={bench}"]
    for k, v in fields.items():
        parts.append(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}")
    line = "RESULT " + " ".join(parts)
    print(line, flush=True)
    return line


def machine_facts() -> dict[str, Any]:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "commit": commit,
    }


def start_service(args: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """A service process (`python ARGS`) of the tree, its output in `log`."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    with open(log, "wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, *args], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )


def stop_services(procs: Sequence[subprocess.Popen[bytes]], timeout_s: float = 30.0) -> None:
    """SIGTERM to each, then wait; what does not stop in time is killed."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def cli_deploy(path: Path, nats_url: str) -> None:
    """`fleetpulse deploy PATH`; RuntimeError with its output if it fails."""
    _cli(["deploy", str(path)], nats_url)


def cli_delete(app: str, nats_url: str) -> None:
    """`fleetpulse delete APP`; RuntimeError with its output if it fails."""
    _cli(["delete", app], nats_url)


def _cli(args: list[str], nats_url: str) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "services.cli", *args, "--nats", nats_url],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    if res.returncode != 0:
        raise RuntimeError(f"{args[0]} failed: {res.stdout}{res.stderr}")

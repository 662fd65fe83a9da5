"""The table, the verdicts and the plot of scripts/bench/http_ray.py, from its results.

`ROWS` are the issue's rows (issue 32, "Show"): each a metric read from one system's results,
whether lower or higher is better, and the target: a fleetpulse / Ray fastest ratio, or a bound
on fleetpulse's own value (wake from zero, resident memory, the handle against raw nats-py).
`evaluate` turns the results of the systems that ran into rows with values, the ratio and
pass/fail (None when the row has no target or a side is missing).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scripts.bench.common import plot_path, print_table, shown

PLOT_NAME = "http_ray.png"
SYSTEMS = ("fleetpulse", "ray-fastest", "ray-default", "floor")


@dataclass(frozen=True, slots=True)
class Row:
    label: str
    get: Callable[[dict[str, Any]], float | None]
    better: str  # "lower" | "higher"
    target: float | None = None
    """The fleetpulse / Ray fastest ratio the issue asks for (<= for lower, >= for higher)."""
    absolute: float | None = None
    """A bound on fleetpulse's own value instead (<= ; wake seconds, MB)."""


def _wl(key: str, metric: str) -> Callable[[dict[str, Any]], float | None]:
    def get(sys_res: dict[str, Any]) -> float | None:
        v = sys_res.get("workloads", {}).get(key, {}).get(metric)
        return float(v) if v is not None else None

    return get


def _cpu(key: str) -> Callable[[dict[str, Any]], float | None]:
    return _wl(key, "cpu_us_per_request")


def _wake(sys_res: dict[str, Any]) -> float | None:
    v = sys_res.get("wake", {}).get("median_s")
    return float(v) if v is not None else None


def handle_vs_raw(sys_res: dict[str, Any]) -> float | None:
    h, raw = _wl("handle_seq_256", "p50_ms")(sys_res), _wl("raw_nats_seq_256", "p50_ms")(sys_res)
    return h / raw if h and raw else None


ROWS = (
    Row("HTTP sequential p50, 256 B (ms)", _wl("http_seq_256", "p50_ms"), "lower", 0.6),
    Row("HTTP sequential p50, 64 KiB (ms)", _wl("http_seq_64k", "p50_ms"), "lower", 1.0),
    Row("HTTP 16 concurrent, 256 B (req/s)", _wl("http_c16_256", "rps"), "higher", 1.5),
    Row("HTTP 16 concurrent p99, 256 B (ms)", _wl("http_c16_256", "p99_ms"), "lower", 1.0),
    Row("HTTP 16 concurrent, 64 KiB (req/s)", _wl("http_c16_64k", "rps"), "higher", 1.0),
    Row("HTTP 16 concurrent p99, 64 KiB (ms)", _wl("http_c16_64k", "p99_ms"), "lower", 1.0),
    Row("HTTP stream, time to first chunk p50 (ms)", _wl("stream", "ttfc_p50_ms"), "lower", 1.0),
    Row("HTTP stream, chunks/s", _wl("stream", "chunks_per_s"), "higher", 1.0),
    Row("HTTP seq p50, aiohttp client (ms)", _wl("aiohttp_seq_256", "p50_ms"), "lower", 1.0),
    Row("handle sequential p50, 256 B (ms)", _wl("handle_seq_256", "p50_ms"), "lower", 0.35),
    Row("handle sequential p50, 64 KiB (ms)", _wl("handle_seq_64k", "p50_ms"), "lower"),
    Row("handle 16 concurrent, 256 B (req/s)", _wl("handle_c16_256", "rps"), "higher", 5.0),
    Row("handle 16 concurrent p99, 256 B (ms)", _wl("handle_c16_256", "p99_ms"), "lower"),
    Row("handle 16 concurrent, 64 KiB (req/s)", _wl("handle_c16_64k", "rps"), "higher"),
    Row("raw nats-py request/reply p50 (ms)", _wl("raw_nats_seq_256", "p50_ms"), "lower"),
    Row("handle p50 / raw nats-py", handle_vs_raw, "lower", absolute=1.2),
    Row("wake from zero over HTTP (s)", _wake, "lower", absolute=0.35),
    Row(
        "replica resident, 2 s after the load (MB)",
        lambda r: r.get("replica_rss_mb"),
        "lower",
        absolute=40.0,
    ),
    Row(
        "replica resident, right after the load (MB)",
        lambda r: r.get("replica_rss_loaded_mb"),
        "lower",
    ),
    Row("CPU/request, HTTP 16 conc 256 B (us)", _cpu("http_c16_256"), "lower"),
    Row("CPU/request, HTTP seq 256 B (us)", _cpu("http_seq_256"), "lower"),
    Row("CPU/request, handle 16 conc 256 B (us)", _cpu("handle_c16_256"), "lower"),
)


def above_floor(res: dict[str, Any]) -> dict[str, float] | None:
    """HTTP sequential p50 at 256 B above the floor (the same two hops with HAProxy answering in
    the replica's place), per system, and fleetpulse's excess over Ray fastest's: the part of
    the path each replica costs. None unless the floor and both systems ran."""
    get = _wl("http_seq_256", "p50_ms")
    floor = get(res["floor"]) if "floor" in res else None
    fp = get(res["fleetpulse"]) if "fleetpulse" in res else None
    fast = get(res["ray-fastest"]) if "ray-fastest" in res else None
    if floor is None or fp is None or fast is None or fast <= floor:
        return None
    return {
        "floor_p50_ms": floor,
        "floor_ratio": floor / fast,
        "fleetpulse_above_ms": fp - floor,
        "ray_fastest_above_ms": fast - floor,
        "above_ratio": (fp - floor) / (fast - floor),
    }


def evaluate(res: dict[str, Any]) -> list[dict[str, Any]]:
    fp, fast = res.get("fleetpulse"), res.get("ray-fastest")
    ours = "fleetpulse" if fp else "endpoint"  # a --target without fleetpulse: the endpoint's ratio
    rows = []
    for row in ROWS:
        vals = {name: row.get(r) for name, r in res.items()}
        ratio = None
        if fast and vals.get(ours) and vals.get("ray-fastest"):
            ratio = vals[ours] / vals["ray-fastest"]  # type: ignore[operator]
        target, ok = "", None
        if row.absolute is not None and fp is not None:
            target = f"<= {row.absolute:g}"
            v = vals.get("fleetpulse")
            ok = v is not None and v <= row.absolute
        elif row.target is not None:
            target = f"{'<=' if row.better == 'lower' else '>='} {row.target:g}x"
            if ratio is not None:
                ok = ratio <= row.target if row.better == "lower" else ratio >= row.target
        rows.append({"metric": row.label, "values": vals, "ratio": ratio, "target": target,
                     "pass": ok})  # fmt: skip
    return rows


def print_results(res: dict[str, Any], rows: list[dict[str, Any]], title: str) -> None:
    names = list(res)

    def fmt(v: float | None) -> str:
        if v is None:
            return "-"
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}" if abs(v) < 1 else f"{v:.2f}"

    table = []
    for r in rows:
        if all(r["values"].get(n) is None for n in names):
            continue  # a row none of these systems has (a --target alone has no handle)
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        verdict = {True: "pass", False: "FAIL", None: "-"}[r["pass"]]
        table.append([r["metric"], *(fmt(r["values"].get(n)) for n in names), ratio,
                      r["target"] or "-", verdict])  # fmt: skip
    ours = "fp" if "fleetpulse" in res else "endpoint"
    print_table(title, ["metric", *names, f"{ours}/ray-fastest", "target", ""], table)
    if (f := above_floor(res)) is not None:
        print(
            f"\nfloor (fleetpulse's HAProxy configuration in front of an HAProxy answering in the "
            f"replica's place): HTTP seq p50 {f['floor_p50_ms']:.3f} ms, {f['floor_ratio']:.2f}x "
            f"Ray fastest. Above it: fleetpulse +{f['fleetpulse_above_ms']:.3f} ms, Ray fastest "
            f"+{f['ray_fastest_above_ms']:.3f} ms ({f['above_ratio']:.2f}x)."
        )


def plot(res: dict[str, Any]) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        print("WARNING: matplotlib is not installed, skipping the plot", file=sys.stderr)
        return None
    panels: list[tuple[str, list[tuple[str, str, str]]]] = [
        ("p50 latency, ms (log)", [
            ("http seq 256", "http_seq_256", "p50_ms"), ("http seq 64k", "http_seq_64k", "p50_ms"),
            ("aiohttp seq 256", "aiohttp_seq_256", "p50_ms"),
            ("stream 1st chunk", "stream", "ttfc_p50_ms"),
            ("handle seq 256", "handle_seq_256", "p50_ms"),
            ("handle seq 64k", "handle_seq_64k", "p50_ms"),
        ]),
        ("16 concurrent, req/s", [
            ("http c16 256", "http_c16_256", "rps"), ("http c16 64k", "http_c16_64k", "rps"),
            ("handle c16 256", "handle_c16_256", "rps"),
            ("handle c16 64k", "handle_c16_64k", "rps"),
        ]),
    ]  # fmt: skip
    names = [n for n in (*SYSTEMS, *res) if n in res]
    names = list(dict.fromkeys(names))  # the usual order, whatever order the JSON kept
    colors = {"fleetpulse": "tab:blue", "ray-fastest": "tab:orange", "ray-default": "tab:green"}
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.4), gridspec_kw={"width_ratios": [6, 4, 2]})
    width = 0.8 / max(1, len(names))
    for ax, (title, cells) in zip(axes[:2], panels, strict=True):
        x = np.arange(len(cells))
        for i, name in enumerate(names):
            w = res[name]["workloads"]
            vals = [w.get(key, {}).get(metric) or 0 for _, key, metric in cells]
            ax.bar(x + i * width, vals, width, label=name, color=colors.get(name, "tab:gray"))
        ax.set_xticks(x + width * (len(names) - 1) / 2, [c[0] for c in cells],
                      rotation=20, fontsize=8)  # fmt: skip
        ax.set_title(title)
        if "log" in title:
            ax.set_yscale("log")
        ax.grid(True, axis="y", alpha=0.3)
    ax = axes[2]
    for i, name in enumerate(names):
        ax.bar(i, res[name]["wake"].get("median_s") or 0, 0.6, color=colors.get(name, "tab:gray"))
    ax.set_xticks(range(len(names)), names, rotation=20, fontsize=8)
    ax.set_title("wake from zero over HTTP, s")
    ax.grid(True, axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("fleetpulse vs Ray Serve 2.60 (fastest: throughput-optimized + HAProxy; default)")
    fig.tight_layout()
    path = plot_path(PLOT_NAME)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return shown(path)

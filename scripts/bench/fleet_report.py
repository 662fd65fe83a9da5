"""The fleet benchmark's report: the issue's targets, the table and the plot (scripts/bench/fleet.py)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from scripts.bench.common import plot_path, print_table, shown

HEALTH_PERIOD_S = 10.0
HEALTH_TIMEOUT_S = 30.0
STALE_AFTER_S = 1.5 * HEALTH_PERIOD_S + 2.0  # health_registry: freshness window + slack
PLOT_NAME = "fleet_scale.png"


def check_targets(rows: Sequence[dict[str, Any]]) -> dict[str, bool | None]:
    """The issue's targets, per point they apply to (None where not measured)."""
    out: dict[str, bool | None] = {}
    bound = HEALTH_PERIOD_S + HEALTH_TIMEOUT_S
    for r in rows:
        n, iv = r["replicas"], r["metrics_interval_s"]
        tag = f"N={n} interval={iv:g}s"
        if n == 16384:
            out[f"{tag}: loop p99 <= 15 ms"] = r["loop_p99_ms"] <= 15
            out[f"{tag}: misses 0"] = r["probes_healthy"] == 0
            out[f"{tag}: no heartbeat behind an active router"] = (
                r["heartbeats_behind_routers"] == 0
            )
            out[f"{tag}: controller < 0.5 core"] = r["controller_cpu"] < 0.5
        if n == 65536:
            out[f"{tag}: loop p99 <= 50 ms"] = r["loop_p99_ms"] <= 50
            out[f"{tag}: misses < 0.001%"] = r["misses_pct"] < 0.001
        out[f"{tag}: unhealthy detected within {bound:g} s"] = r["detect_unhealthy_max_s"] <= bound
    return out


RAY_SERVE = ((8192, 52.1, 0.002), (16384, 42.9, 0.55))
"""Published reference points: (replicas, control loop ms, health-deadline misses %)."""
MISS_FLOOR = 1e-5
"""Zero misses are drawn at this floor of the log axis."""


def plot(rows: Sequence[dict[str, Any]]) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("WARNING: matplotlib is not installed, skipping the plot", file=sys.stderr)
        return None
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    colors = {10.0: ("tab:blue", "tab:cyan"), 1.0: ("tab:orange", "tab:red")}
    for iv in sorted({r["metrics_interval_s"] for r in rows}, reverse=True):
        pts = sorted(
            (r for r in rows if r["metrics_interval_s"] == iv), key=lambda r: r["replicas"]
        )
        n = [r["replicas"] for r in pts]
        c1, c2 = colors.get(iv, ("tab:green", "tab:olive"))
        lbl = f"metrics every {iv:g} s"
        axes[0].plot(n, [r["loop_p50_ms"] for r in pts], "o--", color=c1, label=f"p50, {lbl}")
        axes[0].plot(n, [r["loop_p99_ms"] for r in pts], "s-", color=c2, label=f"p99, {lbl}")
        misses = [max(r["misses_pct"], MISS_FLOOR) for r in pts]
        axes[1].plot(n, misses, "o-", color=c1, label=f"probes needed, {lbl}")
        gaps = [max(r["gaps_over_stale_pct"], MISS_FLOOR) for r in pts]
        axes[1].plot(
            n, gaps, "x:", color=c2, label=f"health gaps > {STALE_AFTER_S:g} s (% of gaps), {lbl}"
        )
        axes[2].plot(n, [r["controller_cpu"] for r in pts], "o-", color=c1, label=lbl)
    rn, rloop, rmiss = zip(*RAY_SERVE, strict=True)
    axes[0].plot(rn, rloop, "k*", ms=10, label="Ray Serve (published)")
    axes[1].plot(rn, rmiss, "k*", ms=10, label="Ray Serve (published)")
    axes[0].set(xscale="log", yscale="log", xlabel="replicas", ylabel="ms per tick",
                title="Control-loop tick (wall time)")  # fmt: skip
    axes[1].set(xscale="log", yscale="log", xlabel="replicas", ylabel="% of replica-periods",
                title=f"Deadline misses ({MISS_FLOOR:g} = none)")  # fmt: skip
    axes[2].set(xscale="log", xlabel="replicas", ylabel="cores", title="Controller CPU")
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = plot_path(PLOT_NAME)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return shown(path)


def table(rows: Sequence[dict[str, Any]]) -> None:
    def ingest(r: dict[str, Any]) -> str:
        return " ".join(f"{k}={v:.1f}" for k, v in sorted(r["ingest_ms_per_s"].items()) if v)

    print_table(
        "Fleet scale (steady state; detect = fault injection to drop from fp_targets)",
        ["N", "iv s", "loop p50", "p99", "core p99", "its cpu", "kv w p99", "cpu", "gap p99 s",
         "misses %", "hb/s", "hb behind", "probes/s", "bus in/s", "det unh s", "det sil s",
         "startup s"],
        [
            [r["replicas"], r["metrics_interval_s"], r["loop_p50_ms"], r["loop_p99_ms"],
             r["core_p99_ms"], r["core_cpu_p99_ms"], r["kv_write_p99_ms"],
             r["controller_cpu"], r["gap_p99_s"], r["misses_pct"], r["heartbeats_per_s"],
             r["heartbeats_behind_routers"], r["probes_per_s"], r["bus_in_msgs_per_s"],
             r["detect_unhealthy_max_s"], r["detect_silent_max_s"], r["startup_s"]]
            for r in rows
        ],
    )  # fmt: skip
    print("\ningest ms per second by kind:")
    for r in rows:
        print(f"  N={r['replicas']} interval={r['metrics_interval_s']:g}s: {ingest(r)}")


def apps_table(rows: Sequence[dict[str, Any]]) -> None:
    """The many-apps shape: each member's loop and CPU, its share, and the simulator's own cost
    and lateness (it must keep real time for the controller's numbers to hold)."""
    print_table(
        "Many apps: per controller member (loop from its stats file, CPU from /proc)",
        ["apps", "members", "member", "partitions", "apps owned", "loop p50", "p99", "core p99",
         "its cpu", "cpu", "kv w/s"],
        [
            [r["apps"], r["members"], m["member"], m.get("partitions", "-"), m.get("apps", "-"),
             m["loop_p50_ms"], m["loop_p99_ms"], m["core_p99_ms"], m["core_cpu_p99_ms"],
             m["cpu"], m["kv_writes_per_s"]]
            for r in rows for m in r["per_member"]
        ],
    )  # fmt: skip
    print_table(
        "Many apps: fleet and simulator",
        ["apps", "members", "replicas", "misses", "ctl probes", "kv w/s", "nats cpu", "sim cpu",
         "sim late p99 s", "sim late max s", "late ticks", "load before", "load after"],
        [
            [r["apps"], r["members"], r["replicas"], r["probes_healthy"], r["controller_probes"],
             r["kv_writes_per_s"], r["nats_cpu"], r["sim_cpu"], r.get("late_p99_s"),
             r.get("late_max_s"), r["sim_late_ticks"], " ".join(f"{x:.1f}" for x in r["load_before"]),
             " ".join(f"{x:.1f}" for x in r["load_after"])]
            for r in rows
        ],
    )  # fmt: skip

"""Fleet benchmark: N simulated replicas and H routers against one real controller process.

What runs: an embedded nats-server; the controller as its own process
(`python -m services.controller --nats URL --stats-file F`); and, in this process, the fleet
simulator (scripts/bench/fleet_sim.py), which reads fp_targets and becomes the replicas the
controller asks for, and publishes what they and their routers would: lifecycle events, handle
reports with running requests and carried health at their cadence, replica reports for the share
that pushes its own, heartbeats when the suppression rules say so, probe answers.

Per replica count N and metrics interval (10 s and 1 s; health period 10 s, check timeout 30 s,
pinned replica count, `--deployments` deployments of N/D replicas, no agents so placement is off):
startup until every replica is a member, a warm-up, a steady-state window, then a fault injection
(replicas turning unhealthy, replicas going silent) timed until the controller drops them from
fp_targets.

Measured in the steady window: control-loop tick p50/p99 (exact per-tick samples from the
controller's --stats-file; the decision alone, its thread CPU time, and the KV write-behind's
write latency apart), controller CPU (/proc/PID/stat), ingest ms per second by format,
health gap p50/p99/max (time between fresh observations the controller was offered, per
replica), deadline misses (probes the controller sent to healthy replicas per replica-period),
standalone heartbeats by reason, probes/s, messages/s on the bus (nats-server /varz).

    .venv/bin/python -m scripts.bench.fleet [--quick] [--sizes 1024 4096 ...] [--intervals 10 1]

Many apps (`--apps N ...`): N apps of one deployment of `--replicas-per-app` replicas each, played
by the many-apps simulator (scripts/bench/fleet_apps.py), one interval (10 s); `--members M
--nodes K` runs M controller members of one group on a K-node cluster and reports each member's
loop, CPU and share (partitions, apps) beside the fleet's misses, KV writes/s and the simulator's
own CPU and event lateness.

    .venv/bin/python -m scripts.bench.fleet --apps 1000 --routers 2 --retention-s 120 \
        [--members 3 --nodes 3 --member-ttl-s 10] [--put-rate 200]

`--smoke`: one small point of each simulator (128 replicas; 4 apps of 4), metrics every 1 s,
health checks every 2 s (timeout 6 s), 2 s warm-up, 3 s window, one fault of each kind: the
same processes and code path in well under a minute (scripts/bench/smoke.py runs it).

Output: a table, bench-results/fleet.json, docs/img/fleet_scale.png, one RESULT line per point.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scripts.bench.common import ROOT, add_smoke, result_line, results_dir, shown, write_json
from scripts.bench.fleet_apps import AppsFleetSim, late_summary
from scripts.bench.fleet_report import (
    HEALTH_PERIOD_S,
    HEALTH_TIMEOUT_S,
    apps_table,
    check_targets,
    plot,
    table,
)
from scripts.bench.fleet_sim import (
    SILENT,
    UNHEALTHY,
    FleetSim,
    SimConfig,
    SimCounters,
)
from scripts.bench.fleet_stats import (
    StatsFile,
    cpu_seconds,
    delta,
    gaps,
    member_row,
    pct,
    rss_mib,
    sum_lines,
    varz,
)
from services.controller.group import DEFAULT_MEMBER_TTL_S
from services.controller.stream import DEFAULT_PARTITIONS as PARTITIONS
from services.controller.stream import DEFAULT_RETENTION_S
from shared.appconfig import AppConfig, AutoscalingConfig, DeploymentConfig
from shared.kv import envelope
from shared.kv.group import ControllerMember
from shared.natsbus import NatsBus
from shared.natsserver import NatsCluster, NatsServer, free_ports
from shared.subjects import KV_APPS, KV_CONTROLLERS
from shared.wire.limits import DEFAULT_MAX_PAYLOAD

log = logging.getLogger("fleet")

APP = "bench"
SIZES = (1024, 4096, 16384, 65536)
QUICK_SIZES = (1024, 16384)
INTERVALS = (10.0, 1.0)
SMOKE: dict[str, Any] = {
    "sizes": [128], "apps": [4], "replicas_per_app": 4, "intervals": [1.0], "deployments": 2,
    "routers": 2, "warm_s": 2.0, "measure_s": 3.0, "faults": 1, "health_period_s": 2.0,
    "health_timeout_s": 6.0,
}  # fmt: skip


# -- process and server probes -----------------------------------------------------------------


# -- one point -------------------------------------------------------------------------------


def app_config(
    n: int,
    deployments: int,
    interval: float,
    period: float = HEALTH_PERIOD_S,
    timeout: float = HEALTH_TIMEOUT_S,
) -> AppConfig:
    sizes = [n // deployments + (1 if i < n % deployments else 0) for i in range(deployments)]
    return AppConfig(
        APP,
        tuple(
            DeploymentConfig(
                name=f"d{i:02d}",
                import_path="bench.fleet:Simulated",
                health_check_period_s=period,
                health_check_timeout_s=timeout,
                autoscaling=AutoscalingConfig(
                    min_replicas=k, max_replicas=k, initial_replicas=k, metrics_interval_s=interval
                ),
            )
            for i, k in enumerate(sizes)
        ),
        version="v1",
    )


class Point:
    """One fleet shape: servers up, fleet running, measured at each interval. `apps` > 0: that
    many apps of one deployment each (the many-apps simulator), else one app of `deployments`."""

    def __init__(self, n: int, args: argparse.Namespace, workdir: Path, apps: int = 0) -> None:
        self.n, self.args, self.workdir, self.apps = n, args, workdir, apps
        self.deployments = apps or max(1, min(args.deployments, n // 64))
        # the server's defaults: no control value or message grows with a deployment any more
        self.max_payload = args.max_payload or DEFAULT_MAX_PAYLOAD
        self.cluster: NatsServer | NatsCluster = (
            NatsServer(max_payload=self.max_payload, monitoring=True)
            if args.nodes == 1
            else NatsCluster(args.nodes, max_payload=self.max_payload)
        )
        self.member_ids = (
            ["bench"] if args.members == 1 else [f"bench{i}" for i in range(args.members)]
        )
        tag = f"{apps}apps" if apps else str(n)
        self.stats = [StatsFile(workdir / f"controller-{tag}-{m}.jsonl") for m in self.member_ids]
        self.logs = [workdir / f"controller-{tag}-{m}.log" for m in self.member_ids]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.sim: FleetSim | None = None
        self.bus: NatsBus | None = None

    @property
    def _health(self) -> tuple[float, float]:
        return self.args.health_period_s, self.args.health_timeout_s

    @property
    def servers(self) -> list[NatsServer]:
        c = self.cluster
        return c.servers if isinstance(c, NatsCluster) else [c]

    @property
    def urls(self) -> list[str]:
        return [x.url for x in self.servers]

    async def run(self) -> list[dict[str, Any]]:
        a = self.args
        self.cluster.start()
        try:
            self.bus = await NatsBus.connect(self.cluster.url, name="fleet-bench")
            cfg = SimConfig(
                APP, a.health_period_s, a.intervals[0], a.routers, a.request_rate, a.idle_share,
                a.push_share,
            )  # fmt: skip
            if self.apps:
                keys = [(app_name(i), "d") for i in range(self.apps)]
                self.sim = AppsFleetSim(cfg, keys, seed=a.seed)
            else:
                self.sim = FleetSim(
                    cfg, [f"d{i:02d}" for i in range(self.deployments)], seed=a.seed
                )
            await self.sim.start(self.cluster.url)
            self.sim.set_interval(a.intervals[0])
            since = time.monotonic()
            if a.put_rate:  # the group first, then the apps arrive, as on a running platform
                self._start_controllers()
                await self._wait_balanced(since)
                await self._put_app(a.intervals[0], a.put_rate)
            else:
                await self._put_app(a.intervals[0])
                self._start_controllers()
            startup = await self._wait_members(since)
            rows = []
            for i, interval in enumerate(a.intervals):
                if i:
                    await self._put_app(interval)
                    self.sim.set_interval(interval)
                row = await self._measure(interval)
                row["startup_s"] = startup
                rows.append(row)
                print(f"  N={self.n} interval={interval:g}s: {_brief(row)}", flush=True)
            return rows
        finally:
            await self._shutdown()

    async def _put_app(self, interval: float, rate: float = 0.0) -> None:
        """Put the app(s); with `rate` > 0, at that many apps a second."""
        assert self.bus is not None
        kv = await self.bus.kv(KV_APPS)
        if not self.apps:
            doc = app_config(self.n, self.deployments, interval, *self._health)
            await kv.put(APP, doc.to_json())
            return
        per = self.n // self.apps
        docs = [
            (app_name(i), one_deployment_app(app_name(i), per, interval, *self._health))
            for i in range(self.apps)
        ]
        batch = 500 if not rate else max(1, int(rate / 10))
        started = time.monotonic()
        for i in range(0, len(docs), batch):
            await asyncio.gather(*(kv.put(k, v) for k, v in docs[i : i + batch]))
            if rate:
                await asyncio.sleep(max(0.0, started + (i + batch) / rate - time.monotonic()))

    def _start_controllers(self) -> None:
        urls = self.urls
        env = dict(os.environ)
        if self.args.stream_replicas > 1:
            env["FLEETPULSE_KV_REPLICAS"] = str(self.args.stream_replicas)
        for i, (member, stats, log_path) in enumerate(
            zip(self.member_ids, self.stats, self.logs, strict=True)
        ):
            (port,) = free_ports(1)
            cmd = [
                sys.executable, "-m", "services.controller", "--nats", urls[i % len(urls)],
                "--stats-file", str(stats.path), "--metrics-port", str(port),
                "--log-level", "WARNING", "--rebuild-s", "5", "--member-id", member,
                "--decode-threads", str(self.args.decode_threads),
                "--retention-s", str(self.args.retention_s),
                "--stream-replicas", str(self.args.stream_replicas),
                "--member-ttl-s", str(self.args.member_ttl_s),
                "--heartbeat-s", str(self.args.member_ttl_s / 4),
            ]  # fmt: skip
            self.procs.append(subprocess.Popen(
                cmd, cwd=ROOT, stdout=log_path.open("wb"), stderr=subprocess.STDOUT,
                start_new_session=True, env=env,
            ))  # fmt: skip

    async def _wait_members(self, since: float) -> float:
        assert self.sim is not None
        deadline = since + self.args.startup_timeout_s + self.n / 500
        while self.sim.members() < self.n or not await self._balanced():
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"N={self.n}: only {self.sim.members()} members after "
                    f"{time.monotonic() - since:.0f} s (shares {await self._shares()})"
                )
            self._check_controller()
            await asyncio.sleep(0.25)
        return time.monotonic() - since

    async def _wait_balanced(self, since: float) -> None:
        while not await self._balanced():
            if time.monotonic() > since + self.args.startup_timeout_s:
                raise RuntimeError(f"partitions not balanced: {await self._shares()}")
            self._check_controller()
            await asyncio.sleep(0.25)

    async def _shares(self) -> dict[str, dict[str, int]]:
        """Each controller member's partitions and apps, from its fp_controllers entry."""
        assert self.bus is not None
        kv = await self.bus.kv(KV_CONTROLLERS)
        out = {}
        for m in self.member_ids:
            entry = await kv.get(m)
            if entry is not None and entry.value:
                doc = envelope.decode(entry.value, ControllerMember)
                out[m] = {"partitions": len(doc.partitions), "apps": doc.apps}
        return out

    async def _balanced(self) -> bool:
        """Every partition owned, no member more than one partition above another."""
        got = [x["partitions"] for x in (await self._shares()).values()]
        return (
            len(got) == len(self.member_ids) and sum(got) == PARTITIONS and max(got) - min(got) <= 1
        )

    def _check_controller(self) -> None:
        for proc, log_path in zip(self.procs, self.logs, strict=True):
            if proc.poll() is not None:
                tail = log_path.read_text()[-3000:]
                raise RuntimeError(f"controller exited with {proc.returncode}:\n{tail}")

    async def _measure(self, interval: float) -> dict[str, Any]:
        a, sim = self.args, self.sim
        assert sim is not None and self.procs
        await asyncio.sleep(a.warm_s)
        self._check_controller()
        spy = self._py_spy(interval)
        before = self._sample()
        await asyncio.sleep(a.measure_s)
        after = self._sample()
        shares = await self._shares()
        if spy is not None:
            spy.wait(30)
        self._check_controller()
        row = self._window(interval, before, after)
        for m in row.get("per_member", ()):
            m.update(shares.get(m["member"], {}))
        row.update(await self._faults())
        # replacements must be members again before the next phase
        await self._wait_members(time.monotonic())
        return row

    def _py_spy(self, interval: float) -> subprocess.Popen[bytes] | None:
        """With --py-spy: sample the controller over the window into collapsed stacks."""
        if not self.args.py_spy or not self.procs:
            return None
        out = results_dir() / f"fleet-pyspy-{self.n}-{interval:g}s.txt"
        out.parent.mkdir(parents=True, exist_ok=True)
        cmd = [
            str(Path(sys.executable).parent / "py-spy"),
            "record",
            "-p",
            str(self.procs[0].pid),
            "-d",
            str(int(self.args.measure_s)),
            "-r",
            "200",
            "-f",
            "raw",
            "-o",
            str(out),
        ]
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _sample(self) -> dict[str, Any]:
        assert self.sim is not None and self.procs
        v = [varz(x) for x in self.servers]  # summed over nodes (a routed message counts twice)
        fleet = getattr(self.sim, "fleet", None)
        return {
            "t": time.monotonic(),
            "ctl_cpu": [cpu_seconds(x.pid) for x in self.procs],
            "nats_cpu": sum(cpu_seconds(x.pid or 0) for x in self.servers),
            "sim_cpu": cpu_seconds(),
            **{k: sum(x[k] for x in v) for k in ("in_msgs", "out_msgs", "in_bytes", "out_bytes")},
            "sim": self.sim.counters.snapshot(),
            "sim_ticks": len(self.sim.tick_seconds),
            "sim_late": self.sim.late_ticks,
            "sim_lateness": None if fleet is None else fleet.lateness_hist.copy(),
            "ctl": [x.last() for x in self.stats],
            "load": os.getloadavg(),
        }  # fmt: skip

    def _window(self, interval: float, b: dict[str, Any], e: dict[str, Any]) -> dict[str, Any]:
        assert self.sim is not None and self.procs
        span = e["t"] - b["t"]
        per_member = [
            member_row(m, st, b["t"], e["t"], (c1 - c0) / span)
            for m, st, c0, c1 in zip(self.member_ids, self.stats, b["ctl_cpu"], e["ctl_cpu"],
                                     strict=True)
        ]  # fmt: skip
        ticks = np.concatenate([st.ticks(b["t"], e["t"]) for st in self.stats])
        loop = ticks[:, 1] * 1e3
        late = ticks[:, 2] * 1e3
        core = ticks[:, 3] * 1e3
        core_cpu = ticks[:, 4] * 1e3
        writes = np.concatenate([st.writes(b["t"], e["t"]) for st in self.stats]) * 1e3
        bc, ec = sum_lines(b["ctl"]), sum_lines(e["ctl"])
        sb, se = b["sim"], e["sim"]
        assert isinstance(sb, SimCounters) and isinstance(se, SimCounters)
        probes_healthy = se.probes["healthy"] - sb.probes["healthy"]
        replica_periods = self.n * span / self.args.health_period_s
        hb = {k: se.heartbeats[k] - sb.heartbeats[k] for k in se.heartbeats}
        sent = {k: (se.sent[k] - sb.sent[k]) / span for k in se.sent}
        ib, ie = bc["ingest_s"], ec["ingest_s"]
        sim_ticks = np.asarray(self.sim.tick_seconds[b["sim_ticks"] : e["sim_ticks"]]) * 1e3
        lines = [x for st in self.stats for x in st.lines if b["t"] <= x.get("mono", 0) < e["t"]]
        return {
            "replicas": self.n,
            "deployments": self.deployments,
            "routers": self.args.routers * self.deployments,
            "metrics_interval_s": interval,
            "max_payload": self.max_payload,
            "largest_kv_value_bytes": self.sim.largest_kv_value,
            "largest_message_bytes": max(self.sim.largest_kv_value, self.sim.largest_sent),
            "window_s": span,
            "ticks": int(loop.size),
            "loop_p50_ms": pct(loop, 50),
            # several members: the worst member's p99 (each one's is in per_member)
            "loop_p99_ms": max(m["loop_p99_ms"] for m in per_member),
            "loop_max_ms": float(loop.max()) if loop.size else math.nan,
            "core_p50_ms": pct(core, 50),
            "core_p99_ms": pct(core, 99),
            "core_cpu_p50_ms": pct(core_cpu, 50),
            "core_cpu_p99_ms": pct(core_cpu, 99),
            # the decision is synchronous: wall time over its thread's CPU time is time spent
            # waiting for a CPU (or collecting garbage, counted apart)
            "core_waited_ms_max": float(np.nanmax(core - core_cpu)) if core.size else math.nan,
            "core_waited_ticks": int(np.count_nonzero(core - core_cpu > 1.0)),
            "kv_writes": int(writes.size),
            "kv_write_p50_ms": pct(writes, 50),
            "kv_write_p99_ms": pct(writes, 99),
            "kv_writes_per_s": writes.size / span,
            "kv_write_failures": ec["writes_failed"] - bc["writes_failed"],
            "tick_late_p99_ms": pct(late, 99),
            "controller_cpu": sum(m["cpu"] for m in per_member),
            "controller_rss_mib": sum(rss_mib(x.pid) for x in self.procs),
            "apps": self.apps,
            "members": len(self.procs),
            "nodes": len(self.servers),
            "per_member": per_member,
            "load_before": b["load"],
            "load_after": e["load"],
            "nats_cpu": (e["nats_cpu"] - b["nats_cpu"]) / span,
            "sim_cpu": (e["sim_cpu"] - b["sim_cpu"]) / span,
            "sim_tick_p99_ms": pct(sim_ticks, 99),
            "sim_late_ticks": e["sim_late"] - b["sim_late"],
            **(
                {}
                if b["sim_lateness"] is None
                else late_summary(e["sim_lateness"] - b["sim_lateness"])
            ),
            "ingest_ms_per_s": {k: (v - ib.get(k, 0.0)) * 1e3 / span for k, v in ie.items()},
            "gc_ms_per_s": [x * 1e3 / span for x in delta(bc, ec, "gc_s")],
            "gc_collections": delta(bc, ec, "gc_n"),
            "bus_in_msgs_per_s": (e["in_msgs"] - b["in_msgs"]) / span,
            "bus_out_msgs_per_s": (e["out_msgs"] - b["out_msgs"]) / span,
            "bus_in_mib_per_s": (e["in_bytes"] - b["in_bytes"]) / span / 2**20,
            "sent_per_s": sent,
            "heartbeats": hb,
            "heartbeats_per_s": sum(hb.values()) / span,
            "heartbeats_behind_routers": hb.get("window_active", 0),
            "probes_per_s": sum(se.probes[k] - sb.probes[k] for k in se.probes) / span,
            "probes_healthy": probes_healthy,
            "controller_probes": ec["probes"] - bc["probes"],
            "misses_pct": 100.0 * probes_healthy / replica_periods,
            "pending_max": max((x.get("pending", 0) for x in lines), default=0),
            "stalled": any(x.get("stalled") for x in lines),
            **gaps(se.gap_hist - sb.gap_hist),
        }

    async def _faults(self) -> dict[str, Any]:
        sim = self.sim
        assert sim is not None
        k = self.args.faults
        if k == 0:
            return {}  # no fault phase (decode_thread.py measures the steady window only)
        made = sim.inject(UNHEALTHY, k) + sim.inject(SILENT, k)
        bound = self.args.health_period_s + self.args.health_timeout_s + 30.0
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline and any(f.detected_after_s is None for f in made):
            self._check_controller()
            await asyncio.sleep(0.1)
        out: dict[str, Any] = {}
        for kind in ("unhealthy", "silent"):
            got = [f.detected_after_s for f in made if f.kind == kind]
            done = [x for x in got if x is not None]
            out[f"detect_{kind}_max_s"] = max(done) if len(done) == len(got) else math.inf
            out[f"detect_{kind}_p50_s"] = float(np.median(done)) if done else math.inf
            out[f"detect_{kind}_missed"] = len(got) - len(done)
        return out

    async def _shutdown(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if self.sim is not None:
            await self.sim.stop()
        if self.bus is not None:
            await self.bus.close()
        self.cluster.stop()


def app_name(i: int) -> str:
    return f"a{i:05d}"


def one_deployment_app(
    name: str,
    replicas: int,
    interval: float,
    period: float = HEALTH_PERIOD_S,
    timeout: float = HEALTH_TIMEOUT_S,
) -> bytes:
    """An app of one deployment `d` of `replicas` pinned replicas."""
    app = app_config(replicas, 1, interval, period, timeout)
    d = dataclasses.replace(app.deployments[0], name="d")
    return dataclasses.replace(app, name=name, deployments=(d,)).to_json()


def _brief(r: dict[str, Any]) -> str:
    return (
        f"loop p50 {r['loop_p50_ms']:.2f} ms p99 {r['loop_p99_ms']:.2f} ms "
        f"(core p99 {r['core_p99_ms']:.2f}, its CPU p99 {r['core_cpu_p99_ms']:.2f}), "
        f"cpu {r['controller_cpu']:.2f}, misses {r['misses_pct']:.4f}%, "
        f"hb behind routers {r['heartbeats_behind_routers']}, "
        f"detect {r.get('detect_unhealthy_max_s', math.nan):.1f}"
        f"/{r.get('detect_silent_max_s', math.nan):.1f} s, "
        f"gap p99 {r['gap_p99_s']:.1f} s, largest KV value {r['largest_kv_value_bytes']} B, "
        f"largest message {r['largest_message_bytes']} B"
    )


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"N = {QUICK_SIZES}, shorter windows")
    ap.add_argument("--sizes", type=int, nargs="+", help=f"replica counts (default {SIZES})")
    ap.add_argument(
        "--intervals", type=float, nargs="+", help=f"default {INTERVALS}; 10 with --apps"
    )
    ap.add_argument(
        "--apps", type=int, nargs="+",
        help="app counts: N apps of one deployment each (the many-apps simulator), not --sizes",
    )  # fmt: skip
    ap.add_argument("--replicas-per-app", type=int, default=4)
    ap.add_argument(
        "--put-rate", type=float, default=0.0,
        help="start the controllers first and put the apps at this many a second"
        " (default 0: put them all, then start the controllers, which take them over from KV)",
    )  # fmt: skip
    ap.add_argument("--members", type=int, default=1, help="controller members (one group)")
    ap.add_argument("--nodes", type=int, default=1, help="nats-servers (>1: one cluster)")
    ap.add_argument(
        "--member-ttl-s", type=float, default=DEFAULT_MEMBER_TTL_S,
        help="the controllers' --member-ttl-s (their --heartbeat-s a quarter of it)",
    )  # fmt: skip
    ap.add_argument(
        "--stream-replicas", type=int, default=1,
        help="FP_REPORTS and KV replicas (3 on a 3-node cluster for durability; costs CPU)",
    )  # fmt: skip
    ap.add_argument("--deployments", type=int, default=16, help="deployments per point")
    ap.add_argument("--routers", type=int, default=4, help="routers per deployment")
    ap.add_argument("--request-rate", type=float, default=2.0, help="admissions/s per replica")
    ap.add_argument("--idle-share", type=float, default=0.05, help="replicas without traffic")
    ap.add_argument("--push-share", type=float, default=0.01, help="replicas pushing reports")
    ap.add_argument("--faults", type=int, default=8, help="replicas per fault kind")
    ap.add_argument(
        "--health-period-s", type=float, default=HEALTH_PERIOD_S,
        help=f"the deployments' health_check_period_s (default {HEALTH_PERIOD_S:g})",
    )  # fmt: skip
    ap.add_argument(
        "--health-timeout-s", type=float, default=HEALTH_TIMEOUT_S,
        help=f"the deployments' health_check_timeout_s (default {HEALTH_TIMEOUT_S:g})",
    )  # fmt: skip
    ap.add_argument("--warm-s", type=float)
    ap.add_argument("--measure-s", type=float)
    ap.add_argument("--startup-timeout-s", type=float, default=120.0)
    ap.add_argument(
        "--max-payload", type=int, help="nats-server max_payload (default: the server's own, 1 MiB)"
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--workdir", help="keep the controller's stats file and log here")
    ap.add_argument(
        "--py-spy", action="store_true", help="profile the controller in each window (py-spy)"
    )
    ap.add_argument("--plot-from", help="only redraw the plot from a bench-results JSON")
    ap.add_argument(
        "--decode-threads", type=int, choices=(0, 1), default=0,
        help="the controller's --decode-threads (columnar decode on a worker thread)",
    )  # fmt: skip
    ap.add_argument(
        "--retention-s", type=float, default=DEFAULT_RETENTION_S,
        help="the controller's --retention-s (FP_REPORTS in memory: shorten it for big fleets at 1 s)",
    )  # fmt: skip
    add_smoke(ap, "128 replicas, then 4 apps of 4; 1 s interval, 2 s health period, 3 s window")
    return ap


def with_defaults(args: argparse.Namespace) -> argparse.Namespace:
    if getattr(args, "smoke", False):
        for k, v in SMOKE.items():
            setattr(args, k, v)
    args.sizes = args.sizes or list(QUICK_SIZES if args.quick else SIZES)
    args.intervals = args.intervals or ([10.0] if args.apps else list(INTERVALS))
    args.warm_s = args.warm_s if args.warm_s is not None else (20.0 if args.quick else 30.0)
    args.measure_s = (
        args.measure_s if args.measure_s is not None else (30.0 if args.quick else 60.0)
    )
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.plot_from:
        print(plot(json.loads(Path(args.plot_from).read_text())["rows"]))
        return 0
    args = with_defaults(args)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        # a smoke run plays both simulators: the sizes, then the apps
        if args.smoke or not args.apps:
            for n in args.sizes:
                rows += asyncio.run(Point(n, args, workdir).run())
        for apps in args.apps or ():
            rows += asyncio.run(Point(apps * args.replicas_per_app, args, workdir, apps).run())
    table(rows)
    if args.apps:
        apps_table([r for r in rows if r["apps"]])
    targets = check_targets(rows)
    for name, ok in targets.items():
        print(f"target {name}: {'met' if ok else 'MISSED'}")
    path = None if args.no_plot else plot(rows)
    out = write_json(
        "fleet",
        {"quick": args.quick, "args": {k: v for k, v in vars(args).items()}, "rows": rows,
         "targets": targets, "plot": path},
    )  # fmt: skip
    print(f"wrote {shown(out)}" + (f" and {path}" if path else ""))
    for r in rows:
        result_line(
            "fleet", replicas=r["replicas"], loop_p50_ms=r["loop_p50_ms"],
            loop_p99_ms=r["loop_p99_ms"], misses_pct=r["misses_pct"],
            heartbeats_behind_routers=r["heartbeats_behind_routers"],
            controller_cpu=r["controller_cpu"], detect_s=r["detect_unhealthy_max_s"],
            metrics_interval_s=r["metrics_interval_s"], core_p99_ms=r["core_p99_ms"],
            core_cpu_p99_ms=r["core_cpu_p99_ms"], largest_kv_value_bytes=r["largest_kv_value_bytes"],
            largest_message_bytes=r["largest_message_bytes"], apps=r["apps"],
            members=r["members"], kv_writes_per_s=r["kv_writes_per_s"],
            member_loop_p99_ms=[m["loop_p99_ms"] for m in r["per_member"]],
        )  # fmt: skip
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())

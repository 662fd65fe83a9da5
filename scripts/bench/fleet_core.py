"""The controller's decision offline: `ControllerCore` fed by the fleet simulator in one process.

How it works: the deployments of `fleet_sim.DeploymentSim` play the fleet as in the fleet
benchmark, but nothing goes over a bus and time is virtual: every 0.2 s of it the simulator's
messages are ingested, every 0.1 s the core ticks, and the tick's actions are applied to the
simulator (target sets start replicas, memberships reach the routers). Only `ControllerCore.tick`
is timed (wall and thread CPU), so the numbers are the decision's own cost with no scheduler,
network or ingest in them; `--profile` adds a cProfile of the ticks. Collections the garbage
collector runs inside a tick are counted by generation (gc callbacks).

Shapes: `--deployments D` splits the replicas over D deployments of one app; `--apps N` makes
N apps of one deployment each instead (10,000 apps x 4 replicas: `--apps 10000 --replicas 40000`);
`--churn P` replaces P% of the replicas per minute (each crashes: its process exits) during the
measured window. `--roll` then rolls the first app to a new version with the rollout settings
`--surge` / `--max-unavailable` (comma lists roll once per value, one after the other on the same
fleet), replicas taking `--start-s` to become ready: completion time, the fewest routable
replicas against the floor (target - max_unavailable), the most new ones in flight, tick times. `--compare` runs the same fleet twice in one process, visiting every deployment
at every tick and then only the due ones (the schedule), for a before/after in one run.

    .venv/bin/python -m scripts.bench.fleet_core [--replicas 16384] [--interval 1] [--profile]

`--smoke`: 256 replicas in 4 deployments on 2 agents (placement on), 2 s warm-up, a 5 s window,
then one replaced replica and one rolling update (replicas start in 1 s): the paths above in
seconds (scripts/bench/smoke.py runs it).
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import gc
import math
import pstats
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from scripts.bench.common import add_smoke, result_line, write_json
from scripts.bench.fleet import app_config
from scripts.bench.fleet_report import HEALTH_PERIOD_S
from scripts.bench.fleet_sim import DeploymentSim, Outbox, SimConfig, SimCounters
from services.controller.core import Action, ControllerCore, Probe
from services.controller.kv_delta import DeleteDoc, PutDoc
from services.controller.machinery.collector import Collector
from shared.appconfig import AppConfig
from shared.kv import buckets, envelope
from shared.kv.agents import AGENT_TTL_S, AgentInfo
from shared.kv.membership import Member, parse_member_key
from shared.kv.targets import ReplicaTarget, TargetKey
from shared.rollout import RolloutConfig
from shared.wire.codec import encode
from shared.wire.messages import Lifecycle

TICK_S = 0.1
SIM_TICK_S = 0.2
WALL0 = 1_700_000_000.0
SMOKE: dict[str, Any] = {
    "replicas": 256, "deployments": 4, "agents": 2, "warm_s": 2.0, "measure_s": 5.0,
    "replace": True, "roll": True, "start_s": 1.0,
}  # fmt: skip


class GcInTicks:
    """Counts the collections that start while a tick runs, by generation, and their time."""

    def __init__(self) -> None:
        self.inside = False
        self.count: Counter[int] = Counter()
        self.seconds: Counter[int] = Counter()
        self._started = 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict[str, Any]) -> None:
        if not self.inside:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            gen = int(info["generation"])
            self.count[gen] += 1
            self.seconds[gen] += time.perf_counter() - self._started

    def close(self) -> None:
        gc.callbacks.remove(self._cb)


def apps_config(
    n: int, apps: int, interval: float, *, autoscaled: bool = False
) -> dict[str, AppConfig]:
    """`apps` apps of one deployment each, `n` replicas in all; `autoscaled`: each may grow to
    twice its size (its decision reads demand), else pinned."""
    out = {}
    for i in range(apps):
        name = f"a{i:05d}"
        cfg = app_config(n // apps + (1 if i < n % apps else 0), 1, interval)
        deps = cfg.deployments
        if autoscaled:
            deps = tuple(
                dataclasses.replace(d, autoscaling=dataclasses.replace(
                    d.autoscaling, max_replicas=2 * d.autoscaling.max_replicas
                ))
                for d in deps
            )  # fmt: skip
        out[name] = AppConfig(name, deps, version=cfg.version)
    return out


class Offline:
    def __init__(
        self, n: int, deployments: int, interval: float, seed: int, *, apps: int = 0,
        visit_all: bool = False, routers: int = 4, start_s: float = 0.0, agents: int = 0,
        agent_room: float = 1.25, autoscaled: bool = False,
    ) -> None:  # fmt: skip
        self.core = ControllerCore(visit_all=visit_all)
        rng = np.random.default_rng(seed)
        self.rng = rng
        counters = SimCounters()
        self.now = 1000.0
        if apps:
            configs = apps_config(n, apps, interval, autoscaled=autoscaled)
        else:
            configs = {"bench": app_config(n, deployments, interval)}
        slots = math.ceil(n * agent_room / agents) if agents else 0
        offer = {"cpus": float(slots), "gpus": float(-(-slots // 10))}
        self.agents = [
            AgentInfo(f"agent-{i:05d}", slots, 0, "host", 1, 0.0, offer) for i in range(agents)
        ]
        """With agents, placement is on and every replica asks for a CPU and a tenth of a GPU:
        the fleet fills them to 1 / agent_room (80%; a rollout gets room for a surge)."""
        if agents:
            ask = {"cpus": 1.0, "gpus": 0.1}
            configs = {
                name: dataclasses.replace(
                    c, deployments=tuple(
                        dataclasses.replace(d, resources=ask) for d in c.deployments
                    ),
                )
                for name, c in configs.items()
            }  # fmt: skip
        self._announced = -math.inf
        self.sims: dict[tuple[str, str], DeploymentSim] = {}
        for app, acfg in configs.items():
            cfg = SimConfig(
                app, HEALTH_PERIOD_S, interval, routers_per_deployment=routers,
                max_payload=64 << 20, start_s=start_s,
            )  # fmt: skip
            for d in acfg.deployments:
                self.sims[(app, d.name)] = DeploymentSim(cfg, d.name, counters, rng)
        self.configs = configs
        self.announce()
        self.core.set_apps(configs, self.now)
        self.gc = GcInTicks()
        self.collector: Collector | None = None
        self.churn_per_s = 0.0
        self._churn_due = 0.0
        self.replaced = 0
        self.probes = 0
        """Probes the core sent: every replica here is healthy, so each one is a miss."""

    def announce(self) -> None:
        """Agents re-put their fp_agents entry every few seconds (AGENT_TTL_S / 3)."""
        if self.now - self._announced >= AGENT_TTL_S / 3:
            self._announced = self.now
            for a in self.agents:
                self.core.on_agent(a, self.now)

    def members(self) -> int:
        return sum(int(s.member_slots.size) for s in self.sims.values())

    def _feed(self, out: Outbox) -> None:
        for subject, data in out:
            self.core.ingest(subject, data, self.now)

    def _apply(self, actions: list[Action]) -> int:
        """Carry out the fp_targets / fp_membership writes on the simulator; returns the bytes
        they write (keys and values; fp_status refreshes are not counted)."""
        written = 0
        targets, members = set(), set()
        for a in actions:
            if not isinstance(a, PutDoc | DeleteDoc):
                continue
            written += len(a.key) + (len(envelope.encode(a.doc)) if isinstance(a, PutDoc) else 0)
            if isinstance(a, PutDoc) and isinstance(a.doc, ReplicaTarget):
                key = (a.doc.app, a.doc.deployment)
                self.sims[key].wanted_by_key[a.key] = (a.doc.replica_id, a.doc.version)
                targets.add(key)
            elif isinstance(a, PutDoc) and isinstance(a.doc, Member):
                key = (a.doc.app, a.doc.deployment)
                self.sims[key].view.put(a.key, a.doc)
                members.add(key)
            elif a.bucket == buckets.TARGETS.name:
                tk = TargetKey.parse(a.key)
                key = (tk.app, tk.deployment)
                self.sims[key].wanted_by_key.pop(a.key, None)
                targets.add(key)
            else:
                app, dep, _ = parse_member_key(a.key)
                self.sims[(app, dep)].view.delete(a.key)
                members.add((app, dep))
        for key in sorted(targets):
            sim = self.sims[key]
            wanted = dict(sim.wanted_by_key.values())
            self._feed(sim.apply_targets(wanted, self.now, WALL0 + self.now)[0])
        for key in sorted(members):
            self.sims[key].apply_membership(self.sims[key].view)
        return written

    def start(self, n: int) -> None:
        while self.members() < n:
            self.announce()
            self._apply(self.core.tick(self.now, WALL0 + self.now))
            for s in self.sims.values():
                self._feed(s.tick(self.now, WALL0 + self.now, TICK_S))
            self.now += TICK_S
        for s in self.sims.values():
            s.set_interval(self.now)

    def run(self, seconds: float, prof: cProfile.Profile | None = None) -> np.ndarray:
        """(virtual time, wall s, thread CPU s) of each core tick."""
        rows = []
        every = round(SIM_TICK_S / TICK_S)
        for i in range(round(seconds / TICK_S)):
            self.announce()
            if i % every == 0:
                for s in self.sims.values():
                    self._feed(s.tick(self.now, WALL0 + self.now, SIM_TICK_S))
                self._churn(SIM_TICK_S)
            wall, cpu = time.perf_counter(), time.thread_time()
            self.gc.inside = True
            if prof is not None:
                prof.enable()
            actions = self.core.tick(self.now, WALL0 + self.now)
            if prof is not None:
                prof.disable()
            self.gc.inside = False
            took = time.perf_counter() - wall, time.thread_time() - cpu
            if self.collector is not None:
                self.collector.between_ticks(self.now)
            self.probes += sum(isinstance(a, Probe) for a in actions)
            rows.append((self.now, *took, self._apply(actions)))
            self.now += TICK_S
        return np.asarray(rows)

    def _churn(self, dt: float) -> None:
        """Crash replicas at `churn_per_s` (spread over the fleet at random)."""
        self._churn_due += self.churn_per_s * dt
        sims = list(self.sims.values())
        while self._churn_due >= 1.0:
            self._churn_due -= 1.0
            sim = sims[int(self.rng.integers(len(sims)))]
            running = [rid for rid in sim.slot_of if sim.member[sim.slot_of[rid]]]
            if not running:
                continue
            victim = running[int(self.rng.integers(len(running)))]
            wall = WALL0 + self.now
            self._feed([sim._lifecycle(victim, sim.versions.get(victim, ""), "exited", wall, 1)])
            self.replaced += 1

    def roll(self, limit_s: float, version: str, rollout: RolloutConfig) -> dict[str, Any]:
        """A new version (and rollout settings) of the first app: ticks until no replica of the
        old version is left (or `limit_s` of virtual time), with the fewest routable replicas
        (the routers' membership) and the most new ones in flight seen meanwhile."""
        app, acfg = next(iter(self.configs.items()))
        deps = tuple(dataclasses.replace(d, rollout=rollout) for d in acfg.deployments)
        self.configs = {**self.configs, app: dataclasses.replace(acfg, deployments=deps,
                                                                  version=version)}  # fmt: skip
        self.core.set_apps(self.configs, self.now)
        key = (app, acfg.deployments[0].name)
        m, sim = self.core.deployments[key], self.sims[key]
        target = m.state.target
        surge, unavailable = rollout.budget(target)
        started, rows, fewest, in_flight, most_live = self.now, [], target, 0, target
        every = round(SIM_TICK_S / TICK_S)
        self.gc.count.clear()
        i = 0
        while self.now - started < limit_s:
            self.announce()
            if i % every == 0:
                for s in self.sims.values():
                    self._feed(s.tick(self.now, WALL0 + self.now, SIM_TICK_S))
            wall, cpu = time.perf_counter(), time.thread_time()
            self.gc.inside = True
            actions = self.core.tick(self.now, WALL0 + self.now)
            self.gc.inside = False
            rows.append((time.perf_counter() - wall, time.thread_time() - cpu))
            self._apply(actions)
            self.now += TICK_S
            i += 1
            view = m.state.view()
            fewest = min(fewest, int(sim.member_slots.size))
            in_flight = max(in_flight, view.waiting_current)
            most_live = max(most_live, len(view.live))
            if not view.old and view.running_current >= target:
                break
        ms, cpu = (np.asarray(rows) * 1e3).T
        return {
            "replicas": target,
            "max_surge": rollout.max_surge,
            "max_unavailable": rollout.max_unavailable,
            "surge_n": surge,
            "floor": target - unavailable,
            "done": not m.state.view().old,
            "virtual_s": round(self.now - started, 1),
            "fewest_routable": fewest,
            "most_in_flight": in_flight,
            "most_live": most_live,
            "ticks": len(ms),
            "p50_ms": round(float(np.percentile(ms, 50)), 3),
            "p99_ms": round(float(np.percentile(ms, 99)), 3),
            "max_ms": round(float(ms.max()), 3),
            "cpu_p99_ms": round(float(np.percentile(cpu, 99)), 3),
            "gc2_in_ticks": self.gc.count[2],
        }

    def replace_one(self, seconds: float) -> np.ndarray:
        """One replica of the first deployment crashes (its process exits): the ticks that
        follow, as rows of (virtual time, wall s, CPU s, KV bytes)."""
        sim = next(iter(self.sims.values()))
        victim = next(iter(sim.slot_of))
        self._feed([sim._lifecycle(victim, sim.versions.get(victim, ""), "exited", WALL0, 1)])
        return self.run(seconds)


def tracked_objects(configs: dict[str, AppConfig]) -> tuple[int, int, int]:
    """Container objects the collector tracks for a core running `configs` with every replica
    running (no simulator in the count): (objects, replicas, deployments)."""
    gc.collect()
    before = len(gc.get_objects())
    core, t = ControllerCore(), 100.0
    core.set_apps(configs, t)
    for _ in range(8):
        t += TICK_S
        for a in core.tick(t, WALL0 + t):
            if isinstance(a, PutDoc) and isinstance(a.doc, ReplicaTarget):
                d = a.doc
                rpc = core.subjects.rpc(d.app, d.deployment, d.replica_id)
                subject = core.subjects.report("lifecycle", d.app, d.deployment)
                for state in ("starting", "ready"):
                    ev = Lifecycle(d.replica_id, "", state, WALL0, rpc, d.version, None, d.app,
                                   d.deployment)  # fmt: skip
                    core.ingest(subject, encode(ev), t)
    gc.collect()
    replicas = sum(len(m.state.replicas) for m in core.deployments.values())
    return len(gc.get_objects()) - before, replicas, len(core.deployments)


def objects_report(interval: float) -> dict[str, float]:
    """Objects per replica (one big deployment) and per deployment beyond its replicas."""
    a, n1, _ = tracked_objects({"bench": app_config(16384, 1, interval)})
    b, n2, d2 = tracked_objects(apps_config(16384, 4096, interval))
    per_replica = a / n1
    per_deployment = (b - per_replica * n2) / d2
    print(
        f"tracked objects: {per_replica:.1f} per replica (1 deployment of {n1}), "
        f"{per_deployment:.1f} per deployment beyond its replicas ({d2} deployments of {n2 // d2})"
    )
    return {"per_replica": round(per_replica, 2), "per_deployment": round(per_deployment, 1)}


def measure(
    args: argparse.Namespace, *, visit_all: bool, autoscaled: bool = False
) -> dict[str, Any]:
    """Start the fleet, warm up, measure the steady (or churning) window; one row."""
    gc.collect()
    built = time.perf_counter()
    off = Offline(
        args.replicas, args.deployments, args.interval, args.seed, apps=args.apps,
        visit_all=visit_all, routers=args.routers, start_s=args.start_s, agents=args.agents,
        agent_room=2.0 if args.roll else 1.25, autoscaled=autoscaled,
    )  # fmt: skip
    off.start(args.replicas)
    started_s = time.perf_counter() - built
    if args.collector:
        off.collector = Collector()
        off.collector.settle(off.now)  # as the service does once a start is rebuilt
    off.run(args.warm_s)
    off.churn_per_s = args.churn / 100.0 * args.replicas / 60.0
    off.gc.count.clear()
    off.gc.seconds.clear()
    off.probes = 0
    prof = cProfile.Profile() if args.profile else None
    cpu0 = time.process_time()
    ticks = off.run(args.measure_s, prof)
    ms, cpu = ticks[:, 1] * 1e3, ticks[:, 2] * 1e3
    row = {
        "mode": ("visit all" if visit_all else "visit due") + (" autoscaled" if autoscaled else ""),
        "replicas": off.members(),
        "deployments": len(off.sims),
        "interval_s": args.interval,
        "churn_pct_per_min": args.churn,
        "replaced": off.replaced,
        "probes_to_healthy": off.probes,
        "ticks": len(ms),
        "p50_ms": round(float(np.percentile(ms, 50)), 3),
        "p99_ms": round(float(np.percentile(ms, 99)), 3),
        "max_ms": round(float(ms.max()), 3),
        "cpu_p99_ms": round(float(np.percentile(cpu, 99)), 3),
        "core_share": round(float(ticks[:, 2].sum()) / args.measure_s, 4),
        "process_cpu_share": round((time.process_time() - cpu0) / args.measure_s, 4),
        "gc_in_ticks": {str(g): off.gc.count[g] for g in (0, 1, 2)},
        "gc2_in_ticks_ms": round(off.gc.seconds[2] * 1e3, 1),
        "startup_s": round(started_s, 1),
        "gc_objects": len(gc.get_objects()),
        "frozen": gc.get_freeze_count(),
        "collector": bool(args.collector),
    }
    off.gc.close()
    print(
        f"{row['mode']}: N={row['replicas']} in {row['deployments']} deployments, metrics every "
        f"{args.interval:g} s, churn {args.churn:g}%/min ({off.replaced} replaced), {len(ms)} ticks: "
        f"core p50 {row['p50_ms']:.2f} p99 {row['p99_ms']:.2f} max {row['max_ms']:.2f} ms "
        f"(CPU p99 {row['cpu_p99_ms']:.2f}); tick CPU {row['core_share']:.3f} core; "
        f"collections in ticks gen0/1/2 {off.gc.count[0]}/{off.gc.count[1]}/{off.gc.count[2]} "
        f"(gen2 {row['gc2_in_ticks_ms']} ms); {off.probes} probes to healthy replicas; "
        f"{row['gc_objects']} tracked objects"
    )
    if prof is not None:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
    if args.replace:
        rows = off.replace_one(5.0)
        wrote = rows[rows[:, 3] > 0]
        worst = float(rows[:, 1].max() * 1e3)
        print(
            f"replace one of {args.replicas}: {len(wrote)} ticks wrote fp_targets/fp_membership, "
            f"{int(rows[:, 3].sum())} bytes in all; worst tick {worst:.2f} ms, worst writing tick "
            f"{float(wrote[:, 1].max() * 1e3) if len(wrote) else 0.0:.2f} ms"
        )
        result_line(
            "fleet_core_replace", replicas=args.replicas, worst_tick_ms=round(worst, 3),
            kv_bytes=int(rows[:, 3].sum()), members=off.members(),
        )  # fmt: skip
    if args.roll:
        row["roll"] = []
        for n, (surge, unavailable) in enumerate(rollouts(args), start=2):
            r = off.roll(args.roll_limit_s, f"v{n}", RolloutConfig(surge, unavailable))
            row["roll"].append(r)
            print(
                f"rolling update of {r['replicas']} replicas, max_surge {r['max_surge']} "
                f"({r['surge_n']}), max_unavailable {r['max_unavailable']} (floor {r['floor']}), "
                f"replicas start in {args.start_s:g} s: {'done' if r['done'] else 'NOT done'} in "
                f"{r['virtual_s']} virtual s ({r['ticks']} ticks), fewest routable "
                f"{r['fewest_routable']}, most in flight {r['most_in_flight']}, most live "
                f"{r['most_live']}; tick p50 {r['p50_ms']:.2f} p99 {r['p99_ms']:.2f} max "
                f"{r['max_ms']:.2f} ms (CPU p99 {r['cpu_p99_ms']:.2f}), {r['gc2_in_ticks']} full "
                "collections in ticks"
            )
            result_line(
                "fleet_core_roll", replicas=r["replicas"], max_surge=r["max_surge"],
                max_unavailable=r["max_unavailable"], start_s=args.start_s, done=r["done"],
                virtual_s=r["virtual_s"], fewest_routable=r["fewest_routable"],
                floor=r["floor"], p50_ms=r["p50_ms"], p99_ms=r["p99_ms"], max_ms=r["max_ms"],
            )  # fmt: skip
    if off.collector is not None:
        off.collector.close()
        gc.unfreeze()
    del off
    return row


def rollouts(args: argparse.Namespace) -> list[tuple[int | str, int | str]]:
    """The (max_surge, max_unavailable) of each rollout, in order: `--surge 1,25%` rolls twice,
    one after the other on the same fleet (a baseline in the same run)."""
    surges = [_amount(a) for a in args.surge.split(",")]
    unavailable = [_amount(a) for a in args.max_unavailable.split(",")]
    if len(unavailable) == 1:
        unavailable *= len(surges)
    if len(unavailable) != len(surges):
        raise SystemExit("--max-unavailable: one value, or one per --surge value")
    return list(zip(surges, unavailable, strict=True))


def _amount(text: str) -> int | str:
    return text if text.endswith("%") else int(text)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--replicas", type=int, default=16384)
    ap.add_argument("--deployments", type=int, default=16)
    ap.add_argument("--apps", type=int, default=0, help="N apps of one deployment each")
    ap.add_argument("--routers", type=int, default=4, help="routers per deployment")
    ap.add_argument("--interval", type=float, default=1.0, help="metrics interval, s")
    ap.add_argument("--warm-s", type=float, default=20.0, help="virtual seconds")
    ap.add_argument("--measure-s", type=float, default=60.0, help="virtual seconds")
    ap.add_argument("--churn", type=float, default=0.0, help="%% of replicas replaced per minute")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--agents", type=int, default=0,
        help="N agents: placement on, each replica asks for 1 cpu and 0.1 gpu (default 0: off)",
    )  # fmt: skip
    ap.add_argument("--profile", action="store_true", help="cProfile the measured ticks")
    ap.add_argument("--visit-all", action="store_true", help="visit every deployment every tick")
    ap.add_argument("--compare", action="store_true", help="visit all, then visit due")
    ap.add_argument(
        "--autoscaled", action="store_true",
        help="with --apps: then the same apps with max_replicas twice their size (autoscaled)",
    )  # fmt: skip
    ap.add_argument(
        "--collector", action="store_true",
        help="the service's collector policy (services/controller/machinery/collector.py)",
    )  # fmt: skip
    ap.add_argument("--json", default="", help="also write the rows here")
    ap.add_argument("--objects", action="store_true", help="only count objects per replica")
    ap.add_argument("--roll", action="store_true", help="then roll the first app to a new version")
    ap.add_argument("--roll-limit-s", type=float, default=7200.0, help="virtual seconds")
    ap.add_argument(
        "--surge", default="1",
        help="the rollout's max_surge (a count or 'P%%'); a comma list rolls once per value",
    )  # fmt: skip
    ap.add_argument(
        "--max-unavailable", default="0",
        help="the rollout's max_unavailable (one value, or one per --surge value)",
    )  # fmt: skip
    ap.add_argument(
        "--start-s", type=float, default=0.0,
        help="seconds a new replica takes to become ready (0: by the next simulator tick)",
    )  # fmt: skip
    ap.add_argument(
        "--replace", action="store_true",
        help="then crash one replica and measure the ticks until it is replaced",
    )  # fmt: skip
    add_smoke(ap, "256 replicas, 2 agents, a 5 s window, a replacement and a rollout")
    args = ap.parse_args(argv)
    if args.smoke:
        for k, v in SMOKE.items():
            setattr(args, k, v)
    if args.objects:
        result_line("fleet_core_objects", **objects_report(args.interval))
        return 0
    modes = [True, False] if args.compare else [args.visit_all]
    rows = [measure(args, visit_all=v) for v in modes]
    if args.autoscaled:  # the same fleet again, each app free to grow: its decision reads demand
        rows.append(measure(args, visit_all=args.visit_all, autoscaled=True))
    for row in rows:
        result_line(
            "fleet_core", mode=row["mode"].replace(" ", "_"), replicas=row["replicas"],
            deployments=row["deployments"], interval_s=args.interval, churn=args.churn,
            agents=args.agents,
            p50_ms=row["p50_ms"], p99_ms=row["p99_ms"], core_share=row["core_share"],
            gc2_in_ticks=row["gc_in_ticks"]["2"],
        )  # fmt: skip
    if args.json:
        write_json(args.json, {"args": vars(args), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())

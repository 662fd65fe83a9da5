"""The controller's decision offline: `ControllerCore` fed by the fleet simulator in one process.

How it works: the deployments of `fleet_sim.DeploymentSim` play the fleet as in the fleet
benchmark, but nothing goes over a bus and time is virtual: every 0.2 s of it the simulator's
messages are ingested, every 0.1 s the core ticks, and the tick's actions are applied to the
simulator (target sets start replicas, memberships reach the routers). Only `ControllerCore.tick`
is timed (wall and thread CPU), so the numbers are the decision's own cost with no scheduler,
network or ingest in them; `--profile` adds a cProfile of the ticks.

    .venv/bin/python -m scripts.bench.fleet_core [--replicas 16384] [--interval 1] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import sys
import time
from collections.abc import Sequence

import numpy as np

from scripts.bench.common import result_line
from scripts.bench.fleet import HEALTH_PERIOD_S, app_config
from scripts.bench.fleet_sim import DeploymentSim, Outbox, SimConfig, SimCounters
from services.controller.core import Action, ControllerCore
from services.controller.kv_delta import DeleteDoc, PutDoc
from shared.kv import buckets, envelope
from shared.kv.membership import Member, parse_member_key
from shared.kv.targets import ReplicaTarget, TargetKey

TICK_S = 0.1
SIM_TICK_S = 0.2
WALL0 = 1_700_000_000.0


class Offline:
    def __init__(self, n: int, deployments: int, interval: float, seed: int) -> None:
        self.core = ControllerCore()
        cfg = SimConfig("bench", HEALTH_PERIOD_S, interval, max_payload=64 << 20)
        rng = np.random.default_rng(seed)
        counters = SimCounters()
        names = [f"d{i:02d}" for i in range(deployments)]
        self.sims = {d: DeploymentSim(cfg, d, counters, rng) for d in names}
        self.now = 1000.0
        self.core.set_apps({"bench": app_config(n, deployments, interval)}, self.now)

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
                sim = self.sims[a.doc.deployment]
                sim.wanted_by_key[a.key] = (a.doc.replica_id, a.doc.version)
                targets.add(sim.name)
            elif isinstance(a, PutDoc) and isinstance(a.doc, Member):
                self.sims[a.doc.deployment].view.put(a.key, a.doc)
                members.add(a.doc.deployment)
            elif a.bucket == buckets.TARGETS.name:
                sim = self.sims[TargetKey.parse(a.key).deployment]
                sim.wanted_by_key.pop(a.key, None)
                targets.add(sim.name)
            else:
                dep = parse_member_key(a.key)[1]
                self.sims[dep].view.delete(a.key)
                members.add(dep)
        for name in sorted(targets):
            sim = self.sims[name]
            wanted = dict(sim.wanted_by_key.values())
            self._feed(sim.apply_targets(wanted, self.now, WALL0 + self.now)[0])
        for name in sorted(members):
            self.sims[name].apply_membership(self.sims[name].view)
        return written

    def start(self, n: int) -> None:
        while self.members() < n:
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
            if i % every == 0:
                for s in self.sims.values():
                    self._feed(s.tick(self.now, WALL0 + self.now, SIM_TICK_S))
            wall, cpu = time.perf_counter(), time.thread_time()
            if prof is not None:
                prof.enable()
            actions = self.core.tick(self.now, WALL0 + self.now)
            if prof is not None:
                prof.disable()
            took = time.perf_counter() - wall, time.thread_time() - cpu
            rows.append((self.now, *took, self._apply(actions)))
            self.now += TICK_S
        return np.asarray(rows)

    def replace_one(self, seconds: float) -> np.ndarray:
        """One replica of the first deployment crashes (its process exits): the ticks that
        follow, as rows of (virtual time, wall s, CPU s, KV bytes)."""
        sim = next(iter(self.sims.values()))
        victim = next(iter(sim.slot_of))
        self._feed([sim._lifecycle(victim, sim.versions.get(victim, ""), "exited", WALL0, 1)])
        return self.run(seconds)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--replicas", type=int, default=16384)
    ap.add_argument("--deployments", type=int, default=16)
    ap.add_argument("--interval", type=float, default=1.0, help="metrics interval, s")
    ap.add_argument("--warm-s", type=float, default=20.0, help="virtual seconds")
    ap.add_argument("--measure-s", type=float, default=60.0, help="virtual seconds")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--profile", action="store_true", help="cProfile the measured ticks")
    ap.add_argument(
        "--replace", action="store_true",
        help="then crash one replica and measure the ticks until it is replaced",
    )  # fmt: skip
    args = ap.parse_args(argv)
    off = Offline(args.replicas, args.deployments, args.interval, args.seed)
    off.start(args.replicas)
    off.run(args.warm_s)
    collections = sum(s["collections"] for s in gc.get_stats())
    prof = cProfile.Profile() if args.profile else None
    ticks = off.run(args.measure_s, prof)
    collections = sum(s["collections"] for s in gc.get_stats()) - collections
    ms, cpu = ticks[:, 1] * 1e3, ticks[:, 2] * 1e3
    print(
        f"N={args.replicas} in {args.deployments} deployments, metrics every {args.interval:g} s, "
        f"{len(ms)} ticks: core p50 {np.percentile(ms, 50):.2f} p99 {np.percentile(ms, 99):.2f} "
        f"max {ms.max():.2f} ms (CPU p99 {np.percentile(cpu, 99):.2f}); {collections} collections"
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
    return 0


if __name__ == "__main__":
    sys.exit(main())

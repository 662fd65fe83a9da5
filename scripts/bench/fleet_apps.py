"""A simulated fleet of many small apps: every replica of every deployment in one set of arrays.

How it works: `fleet_sim.DeploymentSim` keeps one set of arrays per deployment, and its tick is
~10 numpy calls per deployment whatever is due: at 10,000 one-deployment apps that is far more
than real time on a small machine. `AppsSim` keeps the same facts in flat arrays over every
replica slot of the fleet (each slot knows its deployment `dep`) and the routers in a
(deployments x routers) grid, so one `tick(now, wall, dt)` advances the whole fleet with a fixed
number of vectorised calls; Python per item runs only for what is due (a message to encode).
Per tick, in this order:

- Replicas become ready one tick after `starting` (lifecycle `ready`, their first check done, as
  the runtime does before it subscribes); `apply_targets` says `starting` for a replica new in
  fp_targets and `exited` for one that left it.
- Health checks run every `health_period_s` +-10% (first ones spread over one period); a fault
  makes a replica fail its checks (`unhealthy`) or freeze (`silent`: no checks, no messages, no
  probe answers).
- Admissions: a Poisson draw per tick (`request_rate`/s, none for the `idle_share`), each at one
  of its deployment's routers; the router keeps the newest `checked_at` per replica (receipt time
  kept, dropped after 30 s, pruned when the replica leaves the membership) and the replica
  counts the admission as a riding channel.
- Heartbeats exactly when `services/replica/suppression.py` says: nothing carried yet; nothing
  carried within the freshness window `max(1.5 x period, 1 s)`; the latest check failed and no
  direct channel (report, heartbeat, probe) sent it; the latest check flipped back to healthy
  and nothing carried it.
- Replica reports every metrics interval from the `push_share` (a riding and direct channel).
- Handle reports: each router every `metrics_interval_s` at a random phase, over its
  deployment's membership in fp_membership order, msgpack below `columnar_min_replicas`
  members and FPC1 from there (`fleet_sim.encode_handle`), with running requests and the
  router's carried health.
- Probes are answered from the arrays (`answer_probe`, a direct channel).

Approximations: events land on the simulator's tick (0.2 s by default), so a due event is up to
one tick late by design, and the freshness window is evaluated each tick (a replica: each
second); no request is sent (running requests are rate x 50 ms / routers, +-50%); no frames (no
held request declares them); replica ids are unique across the fleet. The lateness of every
timed event (check, handle report, replica report: the tick that ran it minus its due time) is
counted in `lateness_hist`, so a reader sees whether the simulator kept real time.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import numpy as np

from scripts.bench.fleet_sim import (
    F64,
    FAULT_NAMES,
    I64,
    OK,
    ROUTER_MAX_AGE_S,
    RUNNING_PER_REQUEST_S,
    SILENT,
    DeploymentSim,
    FaultRecord,
    FleetSim,
    Outbox,
    SimConfig,
    SimCounters,
    _grown,
    encode_handle,
    lifecycle,
    offered,
)
from shared.kv import envelope
from shared.kv.membership import Member, MembershipView, parse_member_key
from shared.kv.targets import ReplicaTarget, TargetKey
from shared.subjects import Subjects
from shared.wire.codec import encode
from shared.wire.messages import Heartbeat, ReplicaReport

LATE_BIN_S = 0.001
LATE_MAX_S = 10.0
Key = tuple[str, str]


class AppsSim:
    """Every deployment's replicas and routers, vectorised across deployments."""

    _ARRAYS = {
        "dep": -1, "alive": False, "started": False, "fault": OK, "rate": 0.0, "push": False,
        "next_check": math.inf, "checked": -math.inf, "healthy": False, "failures": 0,
        "carried_mono": math.nan, "carried_ck": -math.inf, "carried_healthy": False,
        "direct_ck": -math.inf, "next_push": math.inf, "push_seq": 0, "pub_ck": -math.inf,
        "last_fresh": math.nan, "member": False,
    }  # fmt: skip
    _DTYPES = {
        "dep": np.int64, "alive": np.bool_, "started": np.bool_, "fault": np.int8,
        "push": np.bool_, "healthy": np.bool_, "failures": np.int32,
        "carried_healthy": np.bool_, "push_seq": np.int64, "member": np.bool_,
    }  # fmt: skip
    _ROUTER = {"r_ck": -math.inf, "r_healthy": False, "r_failures": 0, "r_recv": -math.inf}
    _ROUTER_DTYPES = {"r_healthy": np.bool_, "r_failures": np.int32}

    def __init__(
        self, cfg: SimConfig, keys: list[Key], counters: SimCounters, rng: np.random.Generator
    ) -> None:
        self.cfg, self.keys, self.counters, self.rng = cfg, keys, counters, rng
        self.index = {k: d for d, k in enumerate(keys)}
        self.subjects = Subjects()
        nd, r = len(keys), cfg.routers_per_deployment
        self.cap = 0
        self.ids: list[str | None] = []
        self.free: list[int] = []
        self.slot_of: dict[str, int] = {}
        for k, fill in self._ARRAYS.items():
            setattr(self, k, np.full(0, fill, dtype=self._DTYPES.get(k, np.float64)))
        for k, fill in self._ROUTER.items():
            setattr(self, k, np.full((r, 0), fill, dtype=self._ROUTER_DTYPES.get(k, np.float64)))
        self.next_report = np.full((nd, r), math.inf)
        self.seq = np.zeros((nd, r), dtype=np.int64)
        self.handle_ids = [[f"sim-{a}-{d}-r{i}" for i in range(r)] for a, d in keys]
        self.wanted_by_key: list[dict[str, tuple[str, str]]] = [{} for _ in keys]
        self.versions: list[dict[str, str]] = [{} for _ in keys]
        self.dep_slots: list[dict[str, int]] = [{} for _ in keys]
        self.views = [MembershipView(a, d) for a, d in keys]
        self.member_slots: list[I64] = [np.zeros(0, dtype=np.int64) for _ in keys]
        self.member_ids: list[list[str]] = [[] for _ in keys]
        self.epochs = [0] * nd
        self.starting: list[int] = []
        self.subject = [
            {k: self.subjects.report(k, a, d) for k in ("handle", "replica", "heartbeat", "lifecycle")}
            for a, d in keys
        ]  # fmt: skip
        self.lateness_hist = np.zeros(int(LATE_MAX_S / LATE_BIN_S) + 1, dtype=np.int64)

    def members(self) -> int:
        return int(self.member.sum())

    # -- replicas come and go ------------------------------------------------------------------

    def _grow(self, n: int) -> None:
        if n <= self.cap:
            return
        n = max(n, 2 * self.cap, 1024)
        for k, fill in (self._ARRAYS | self._ROUTER).items():
            setattr(self, k, _grown(getattr(self, k), n, fill))
        self.ids.extend([None] * (n - self.cap))
        self.free.extend(range(n - 1, self.cap - 1, -1))
        self.cap = n

    def apply_targets(
        self, d: int, wanted: dict[str, str], now: float, wall: float
    ) -> tuple[Outbox, list[str]]:
        """Deployment `d`'s fp_targets changed: become its new replicas, stop the ones no longer
        listed. Returns the lifecycle messages and the ids that left."""
        out: Outbox = []
        app, name = self.keys[d]
        subject = self.subject[d]["lifecycle"]
        mine = self.dep_slots[d]
        gone = [rid for rid in mine if rid not in wanted]
        for rid in gone:
            slot = mine.pop(rid)
            del self.slot_of[rid]
            out.append((subject, lifecycle(self.subjects, app, name, rid,
                                           self.versions[d].get(rid, ""), "exited", wall, 0)))  # fmt: skip
            self.ids[slot] = None
            self.free.append(slot)
            for k, fill in self._ARRAYS.items():
                getattr(self, k)[slot] = fill
            for k, fill in self._ROUTER.items():
                getattr(self, k)[:, slot] = fill
        new = [rid for rid in wanted if rid not in mine]
        if new:
            self._grow(len(self.slot_of) + len(new))
            slots = np.array([self.free.pop() for _ in new], dtype=np.int64)
            for rid, slot in zip(new, slots.tolist(), strict=True):
                mine[rid] = self.slot_of[rid] = slot
                self.ids[slot] = rid
                out.append((subject, lifecycle(self.subjects, app, name, rid, wanted[rid],
                                               "starting", wall)))  # fmt: skip
            self.starting += slots.tolist()
            self.dep[slots] = d
            self.alive[slots] = True
            u = self.rng.random(slots.size)
            self.rate[slots] = np.where(u < self.cfg.idle_share, 0.0, self.cfg.request_rate)
            self.push[slots] = self.rng.random(slots.size) < self.cfg.push_share
            if not np.isfinite(self.next_report[d]).any():
                self.next_report[d] = now + self.rng.random(self.next_report.shape[1]) * (
                    self.cfg.metrics_interval_s
                )
        self.versions[d] = wanted
        return out, gone

    def apply_membership(self, d: int) -> None:
        view = self.views[d]
        mine = self.dep_slots[d]
        ids = [x.replica_id for x in view.members() if x.replica_id in mine]
        self.epochs[d] = view.epoch
        self.member_slots[d] = np.fromiter((mine[r] for r in ids), np.int64, len(ids))
        self.member_ids[d] = ids
        slots = np.fromiter(mine.values(), np.int64, len(mine))
        self.member[slots] = False
        self.member[self.member_slots[d]] = True
        left = slots[~self.member[slots]]  # routers prune entries of replicas that left
        for k, fill in self._ROUTER.items():
            getattr(self, k)[:, left] = fill

    def set_interval(self, now: float) -> None:
        """(Re)start the routers' and pushing replicas' report clocks at random phases."""
        iv = self.cfg.metrics_interval_s
        self.next_report = now + self.rng.random(self.next_report.shape) * iv
        pushing = np.flatnonzero(self.push & self.started)
        self.next_push[pushing] = now + self.rng.random(pushing.size) * iv

    # -- one tick ------------------------------------------------------------------------------

    def tick(self, now: float, wall: float, dt: float) -> Outbox:
        out: Outbox = []
        self._become_ready(now, wall, out)
        checked = self._checks(now, wall)
        self._admissions(now, dt)
        self._heartbeats(now, wall, checked, out)
        self._replica_reports(now, wall, out)
        self._handle_reports(now, wall, out)
        return out

    def _late(self, due: F64, now: float) -> None:
        bins = np.clip(((now - due) / LATE_BIN_S).astype(np.int64), 0, self.lateness_hist.size - 1)
        self.lateness_hist += np.bincount(bins, minlength=self.lateness_hist.size)

    def _become_ready(self, now: float, wall: float, out: Outbox) -> None:
        if not self.starting:
            return
        slots = np.array(self.starting, dtype=np.int64)
        self.starting.clear()
        slots = slots[self.alive[slots]]
        for slot, d in zip(slots.tolist(), self.dep[slots].tolist(), strict=True):
            rid = self.ids[slot]
            assert rid is not None
            app, name = self.keys[d]
            out.append((self.subject[d]["lifecycle"], lifecycle(
                self.subjects, app, name, rid, self.versions[d].get(rid, ""), "ready", wall)))  # fmt: skip
        k = slots.size
        self.started[slots] = True
        self.checked[slots] = wall
        self.healthy[slots] = True
        self.failures[slots] = 0
        self.next_check[slots] = now + self.rng.random(k) * self.cfg.health_period_s
        iv = self.cfg.metrics_interval_s
        self.next_push[slots] = np.where(self.push[slots], now + self.rng.random(k) * iv, math.inf)

    _checks = DeploymentSim._checks  # the same arrays, by the same names

    def _admissions(self, now: float, dt: float) -> None:
        active = self.member & self.started & (self.fault != SILENT) & (self.rate > 0)
        p = -np.expm1(-self.rate * dt)
        hit = np.flatnonzero(active & (self.rng.random(self.cap) < p))
        if hit.size == 0:
            return
        which = self.rng.integers(0, self.r_ck.shape[0], hit.size)
        newer = self.checked[hit] > self.r_ck[which, hit]
        r, s = which[newer], hit[newer]
        self.r_ck[r, s] = self.checked[s]
        self.r_healthy[r, s] = self.healthy[s]
        self.r_failures[r, s] = self.failures[s]
        self.r_recv[r, s] = now
        self._carried(hit, now, direct=False)

    def _carried(self, slots: I64, now: float, *, direct: bool) -> None:
        """`HealthCarriage.carried(latest, now, via)` for these replicas (every channel here but
        the admission is direct; every one but the heartbeat and the probe rides)."""
        self.carried_mono[slots] = now
        if direct:
            self.direct_ck[slots] = np.maximum(self.direct_ck[slots], self.checked[slots])
        newer = self.checked[slots] > self.carried_ck[slots]
        s = slots[newer]
        self.carried_ck[s] = self.checked[s]
        self.carried_healthy[s] = self.healthy[s]

    def heartbeat_due(self, now: float) -> tuple[I64, dict[str, I64]]:
        """`HealthCarriage.heartbeat_due` over every slot: the due ones and why."""
        live = self.started & (self.fault != SILENT)
        never = live & np.isnan(self.carried_mono)
        window = live & ~never & (now - self.carried_mono >= self.cfg.freshness_s)
        bad = live & ~self.healthy & (self.checked > self.direct_ck)
        back = (
            live & self.healthy & (self.checked > self.carried_ck)
            & (self.healthy != self.carried_healthy)
        )  # fmt: skip
        due = never | window | bad | back
        reasons = {
            "first": never, "window_active": window & (self.rate > 0),
            "window_idle": window & (self.rate == 0), "bad": bad & ~never & ~window,
            "flip": back & ~never & ~window,
        }  # fmt: skip
        return np.flatnonzero(due), reasons

    def _heartbeats(self, now: float, wall: float, checked: I64, out: Outbox) -> None:
        due, reasons = self.heartbeat_due(now)
        if due.size == 0:
            return
        for reason, mask in reasons.items():
            self.counters.heartbeats[reason] += int(mask[due].sum())
        for slot, d in zip(due.tolist(), self.dep[due].tolist(), strict=True):
            out.append((self.subject[d]["heartbeat"], encode(Heartbeat(self._status(slot), wall))))
        self._count("heartbeat", out[-due.size :])
        self._carried(due, now, direct=True)
        self._offered(due, self.checked[due], now, direct=True)

    def _replica_reports(self, now: float, wall: float, out: Outbox) -> None:
        due = np.flatnonzero(self.started & (self.fault != SILENT) & (self.next_push <= now))
        if due.size == 0:
            return
        self._late(self.next_push[due], now)
        iv = self.cfg.metrics_interval_s
        self.next_push[due] = np.maximum(self.next_push[due] + iv, now)
        self.push_seq[due] += 1
        running = (self.rate[due] * RUNNING_PER_REQUEST_S).tolist()
        for slot, d, seq, run in zip(due.tolist(), self.dep[due].tolist(),
                                     self.push_seq[due].tolist(), running, strict=True):  # fmt: skip
            rid = self.ids[slot]
            assert rid is not None
            report = ReplicaReport(rid, wall, seq, run, {}, self._status(slot))
            out.append((self.subject[d]["replica"], encode(report)))
        self._count("replica", out[-due.size :])
        self._carried(due, now, direct=True)
        self._offered(due, self.checked[due], now, direct=True)

    def _handle_reports(self, now: float, wall: float, out: Outbox) -> None:
        deps, routers = np.nonzero(self.next_report <= now)
        if deps.size == 0:
            return
        iv = self.cfg.metrics_interval_s
        due_at = self.next_report[deps, routers]
        self._late(due_at, now)
        self.next_report[deps, routers] = np.where(due_at + iv <= now, now + iv, due_at + iv)
        self.seq[deps, routers] += 1
        nr = self.r_ck.shape[0]
        fresh: list[list[tuple[I64, F64]]] = [[] for _ in range(nr)]
        for d, r, seq in zip(deps.tolist(), routers.tolist(), self.seq[deps, routers].tolist(),
                             strict=True):  # fmt: skip
            ms = self.member_slots[d]
            if ms.size == 0:
                continue
            app, name = self.keys[d]
            running = (
                self.rate[ms] * RUNNING_PER_REQUEST_S / nr * self.rng.uniform(0.5, 1.5, ms.size)
            )
            ck = self.r_ck[r, ms]
            valid = (ck > -math.inf) & (now - self.r_recv[r, ms] <= ROUTER_MAX_AGE_S)
            meta = dict(
                handle_id=self.handle_ids[d][r], app=app, deployment=name, sent_at=wall, seq=seq,
                queued_requests=0.0, membership_epoch=self.epochs[d],
            )  # fmt: skip
            kind, parts = encode_handle(
                self.cfg,
                meta,
                self.member_ids[d],
                running,
                self.r_healthy[r, ms],
                ck,
                self.r_failures[r, ms],
                valid,
            )
            out.extend((self.subject[d]["handle"], p) for p in parts)
            self._count(kind, out[-len(parts) :])
            fresh[r].append((ms[valid], ck[valid]))
        # one call per router index: a replica appears at most once in each
        for got in fresh:
            if got:
                s = np.concatenate([x for x, _ in got])
                self._offered(s, np.concatenate([c for _, c in got]), now, direct=False)

    _status = DeploymentSim._status
    _count = DeploymentSim._count

    def _offered(self, slots: I64, ck: F64, now: float, *, direct: bool) -> None:
        offered(self.pub_ck, self.last_fresh, self.counters.gap_hist, slots, ck, now, direct=direct)

    # -- probes and faults ---------------------------------------------------------------------

    def answer_probe(self, slot: int, now: float) -> bytes | None:
        if not self.started[slot] or self.fault[slot] == SILENT:
            return None
        s = np.array([slot], dtype=np.int64)
        self._carried(s, now, direct=True)
        self._offered(s, self.checked[s], now, direct=True)
        return encode(self._status(slot))

    def candidates(self) -> I64:
        """Replicas a fault may hit: running members with traffic and no fault yet."""
        return np.flatnonzero(self.member & self.started & (self.fault == OK) & (self.rate > 0))

    def lateness(self) -> dict[str, float]:
        return late_summary(self.lateness_hist)


def late_summary(hist: I64) -> dict[str, float]:
    """p50/p99/max lateness (s) of the timed events counted in `hist` (upper bin edges)."""
    total = int(hist.sum())
    if not total:
        return {"late_p50_s": math.nan, "late_p99_s": math.nan, "late_max_s": math.nan}
    cum = np.cumsum(hist)
    edges = (np.arange(hist.size) + 1) * LATE_BIN_S
    return {
        "late_p50_s": float(edges[np.searchsorted(cum, 0.5 * total)]),
        "late_p99_s": float(edges[np.searchsorted(cum, 0.99 * total)]),
        "late_max_s": float(edges[np.flatnonzero(hist)[-1]]),
    }


class AppsFleetSim(FleetSim):
    """`FleetSim`'s bus side (fp_targets and fp_membership watches, probes, publishing every
    `tick_s`) over one `AppsSim` of many (app, deployment) pairs."""

    def __init__(self, cfg: SimConfig, keys: list[Key], *, seed: int = 1,
                 tick_s: float = 0.2) -> None:  # fmt: skip
        super().__init__(cfg, [], seed=seed, tick_s=tick_s)
        self.fleet = AppsSim(cfg, keys, self.counters, self.rng)
        self._dirty_t: set[int] = set()
        self._dirty_m: set[int] = set()

    async def start(self, url: str) -> None:
        await super().start(url)
        self.fleet.cfg = self.cfg

    def set_interval(self, metrics_interval_s: float) -> None:
        self.cfg = self.fleet.cfg = dataclasses.replace(
            self.cfg, metrics_interval_s=metrics_interval_s
        )
        self.fleet.set_interval(time.monotonic())

    def members(self) -> int:
        return self.fleet.members()

    def _on_target(self, key: str, value: bytes | None) -> None:
        where = TargetKey.parse(key)
        d = self.fleet.index.get((where.app, where.deployment))
        if d is None:
            return
        if value is None:
            self.fleet.wanted_by_key[d].pop(key, None)
        else:
            t = envelope.decode(value, ReplicaTarget)
            self.fleet.wanted_by_key[d][key] = (t.replica_id, t.version)
        self._dirty_t.add(d)

    def _on_member(self, key: str, value: bytes | None) -> None:
        app, dep, _ = parse_member_key(key)
        d = self.fleet.index.get((app, dep))
        if d is None:
            return
        if value is None:
            self.fleet.views[d].delete(key)
        else:
            self.fleet.views[d].put(key, envelope.decode(value, Member))
        self._dirty_m.add(d)

    async def _apply_changes(self) -> None:
        now, wall = time.monotonic(), time.time()
        f = self.fleet
        out: Outbox = []
        for d in sorted(self._dirty_t):
            got, gone = f.apply_targets(d, dict(f.wanted_by_key[d].values()), now, wall)
            out += got
            for rid in gone:
                rec = self.faults.get(rid)
                if rec is not None and rec.detected_after_s is None:
                    rec.detected_after_s = now - rec.at
        self._dirty_t.clear()
        await self._publish(out)
        for d in sorted(self._dirty_m):
            f.apply_membership(d)
        self._dirty_m.clear()

    async def _on_probe(self, msg: Any) -> None:
        rid = msg.subject.rsplit(".", 1)[1]
        slot = self.fleet.slot_of.get(rid)
        if slot is None:
            self.counters.probes["unknown"] += 1
            return
        self.counters.probes["faulted" if self.fleet.fault[slot] != OK else "healthy"] += 1
        data = self.fleet.answer_probe(slot, time.monotonic())
        if data is None or not msg.reply:
            self.counters.probes["unanswered"] += 1
            return
        await self._bus.nc.publish(msg.reply, data)

    def _tick(self, now: float, wall: float) -> Outbox:
        return self.fleet.tick(now, wall, self.tick_s)

    def inject(self, kind: int, count: int) -> list[FaultRecord]:
        f = self.fleet
        pool = f.candidates()
        picks = self.rng.choice(pool, size=min(count, pool.size), replace=False)
        now = time.monotonic()
        made = []
        for slot in picks.tolist():
            f.fault[slot] = kind
            rid = f.ids[slot]
            assert rid is not None
            app, name = f.keys[int(f.dep[slot])]
            made.append(rec := FaultRecord(f"{app}/{name}", rid, FAULT_NAMES[kind], now))
            self.faults[rid] = rec
        return made

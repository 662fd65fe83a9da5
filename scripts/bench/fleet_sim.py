"""A simulated fleet for the fleet benchmark: N replicas and H routers as numpy arrays.

How it works: nothing here runs a replica process or sends a request. Per deployment, every fact
a replica or router holds is an array over slots, and `DeploymentSim.tick(now, wall)` advances
them by one simulator tick and returns the messages the real fleet would publish at that moment:

- Replicas: the controller's fp_targets say which replicas it wants; the simulator "becomes" each
  new one (lifecycle `starting` then `ready`, with its first health check done, as the real
  runtime does before it subscribes) and says `exited` for ones that leave the targets (the agent
  stopping them). Each runs its check every `health_check_period_s` +-10% (first checks spread
  over one period, as in a fleet started over time). A fault makes a replica fail its checks
  (`unhealthy`) or freeze (`silent`: no checks carried, no probe answers).
- Traffic is modelled, not sent: an active replica gets admissions as a Poisson process
  (`request_rate` per second) spread over the deployment's routers; each admission carries the
  replica's latest status to that router (newest `checked_at` wins, receipt time kept, entries
  dropped 30 s after receipt, like `CarriedHealthMap`) and counts as "carried" for the replica's
  suppression state. Idle replicas (`idle_share`) get no traffic.
- Routers cover the deployment's membership (fp_membership, in its order) and send a handle report
  every `metrics_interval_s` at a random phase: columnar (FPC1, split under max_payload) from
  `DEFAULT_COLUMNAR_MIN_REPLICAS` (128) rows, msgpack below, with running requests and the
  carried health of every member.
- Replicas that push their own reports (`push_share`) send a ReplicaReport with their health
  every `metrics_interval_s`.
- Heartbeats follow `services/replica/suppression.py`: one goes out when nothing carried the
  replica's health within the freshness window (`max(1.5 x period, 1 s)`; checked every simulator
  tick, where a real replica checks every second), right after a check whose verdict flipped and
  was not carried yet, and right after the first check.
- Probes on `fp.v1.probe.{id}` are answered from the same arrays (`answer_probe`).

Measurement: counters of everything sent (by kind and reason), probes received per replica, and
the health gap: for each replica, the time between two messages that each gave the controller a
fresh observation under its rules (a relayed entry only with a newer `checked_at`; a direct one -
heartbeat, replica report, probe answer - also with an equal one), as a histogram.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from shared.errors import WireError
from shared.kv import buckets, envelope
from shared.kv.membership import Member, MembershipView, parse_member_key
from shared.kv.targets import ReplicaTarget, TargetKey
from shared.subjects import Subjects
from shared.wire.codec import encode
from shared.wire.columnar import DEFAULT_COLUMNAR_MIN_REPLICAS, encode_handle_report_columnar
from shared.wire.limits import REPORT_PART_MAX_BYTES
from shared.wire.messages import HandleReport, HealthStatus, Heartbeat, Lifecycle, ReplicaReport

log = logging.getLogger(__name__)

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]
Outbox = list[tuple[str, bytes]]

JITTER = 0.1
ROUTER_MAX_AGE_S = 30.0
"""services/router/carried_health.MAX_AGE_S: carried entries older than this are not re-sent."""
GAP_BIN_S = 0.05
GAP_MAX_S = 120.0
RUNNING_PER_REQUEST_S = 0.05
"""Mean service time: a router's running-requests value for a replica is rate x this / routers."""

OK, UNHEALTHY, SILENT = 0, 1, 2
FAULT_NAMES = {UNHEALTHY: "unhealthy", SILENT: "silent"}


@dataclass(frozen=True, slots=True)
class SimConfig:
    app: str
    health_period_s: float = 10.0
    metrics_interval_s: float = 10.0
    routers_per_deployment: int = 4
    request_rate: float = 2.0
    idle_share: float = 0.05
    push_share: float = 0.01
    max_payload: int = 1_048_576
    columnar_min_replicas: int = DEFAULT_COLUMNAR_MIN_REPLICAS
    start_s: float = 0.0
    """How long a new replica takes from `starting` to `ready` (0: by the next tick)."""

    @property
    def freshness_s(self) -> float:
        return max(1.5 * self.health_period_s, 1.0)


@dataclass(slots=True)
class SimCounters:
    sent: Counter[str] = field(default_factory=Counter)
    """Messages published, by kind (handle_columnar, handle_msgpack, replica, lifecycle, ...)."""
    bytes_sent: Counter[str] = field(default_factory=Counter)
    heartbeats: Counter[str] = field(default_factory=Counter)
    """Heartbeats by reason: window_active (behind an active router), window_idle, flip, first."""
    probes: Counter[str] = field(default_factory=Counter)
    """Probes received, by target: healthy (no fault), faulted, unknown, unanswered."""
    gap_hist: I64 = field(
        default_factory=lambda: np.zeros(int(GAP_MAX_S / GAP_BIN_S) + 1, dtype=np.int64)
    )

    def snapshot(self) -> SimCounters:
        return SimCounters(
            Counter(self.sent), Counter(self.bytes_sent), Counter(self.heartbeats),
            Counter(self.probes), self.gap_hist.copy(),
        )  # fmt: skip


def _grown(a: npt.NDArray[np.generic], n: int, fill: object) -> npt.NDArray[np.generic]:
    out = np.full((*a.shape[:-1], n), fill, dtype=a.dtype)
    out[..., : a.shape[-1]] = a
    return out


def lifecycle(
    subjects: Subjects,
    app: str,
    deployment: str,
    rid: str,
    version: str,
    state: str,
    wall: float,
    exit_code: int | None = None,
) -> bytes:
    """A replica's lifecycle event, as its agent (or runtime) publishes it."""
    return encode(Lifecycle(
        replica_id=rid, agent_id="", state=state, at=wall,
        rpc_subject=subjects.rpc(app, deployment, rid), version=version, exit_code=exit_code,
        app=app, deployment=deployment,
    ))  # fmt: skip


def encode_handle(
    cfg: SimConfig,
    meta: dict[str, Any],
    member_ids: pa.Array | list[str],
    running: F64,
    healthy: Mask,
    ck: F64,
    failures: npt.NDArray[np.int32],
    valid: Mask,
) -> tuple[str, list[bytes]]:
    """One router's handle report over its members, as the router encodes it: columnar (split
    under max_payload) from `columnar_min_replicas` rows, msgpack below. Returns (kind, parts)."""
    if len(member_ids) >= cfg.columnar_min_replicas:
        if isinstance(member_ids, list):
            member_ids = pa.array(member_ids, type=pa.utf8())
        parts = encode_handle_report_columnar(
            **meta, replica_ids=member_ids, running=running, health_healthy=healthy,
            health_checked_at=np.where(valid, ck, 0.0), health_failures=failures,
            health_valid=valid, max_payload=min(cfg.max_payload, REPORT_PART_MAX_BYTES),
        )  # fmt: skip
        return "handle_columnar", parts
    ids = member_ids if isinstance(member_ids, list) else member_ids.to_pylist()
    health = tuple(
        HealthStatus(ids[i], bool(healthy[i]), float(ck[i]), int(failures[i]))
        for i in np.flatnonzero(valid).tolist()
    )
    report = HandleReport(
        **meta, running=dict(zip(ids, running.tolist(), strict=True)), health=health
    )
    return "handle_msgpack", [encode(report)]


def offered(
    pub_ck: F64, last_fresh: F64, hist: I64, slots: I64, ck: F64, now: float, *, direct: bool
) -> None:
    """Health offered to the controller: record the gap since each replica's last fresh
    observation (a relayed entry is fresh with a newer `checked_at`, a direct one also with an
    equal one) into `hist`, in place."""
    held = pub_ck[slots]
    fresh = ck >= held if direct else ck > held
    s = slots[fresh]
    gaps = now - last_fresh[s]
    gaps = gaps[~np.isnan(gaps)]
    if gaps.size:
        bins = np.minimum((gaps / GAP_BIN_S).astype(np.int64), hist.size - 1)
        hist += np.bincount(bins, minlength=hist.size)
    last_fresh[s] = now
    pub_ck[s] = np.maximum(held[fresh], ck[fresh])


class DeploymentSim:
    """One deployment's replicas and routers."""

    _ARRAYS = {
        "alive": False, "started": False, "fault": OK, "rate": 0.0, "push": False,
        "next_check": math.inf, "checked": -math.inf, "healthy": False, "failures": 0,
        "carried_mono": math.nan, "carried_ck": -math.inf, "carried_healthy": False,
        "next_push": math.inf, "push_seq": 0, "pub_ck": -math.inf, "last_fresh": math.nan,
        "member": False,
    }  # fmt: skip
    _DTYPES = {
        "alive": np.bool_, "started": np.bool_, "fault": np.int8, "push": np.bool_,
        "healthy": np.bool_, "failures": np.int32, "carried_healthy": np.bool_,
        "push_seq": np.int64, "member": np.bool_,
    }  # fmt: skip
    _ROUTER = {"r_ck": -math.inf, "r_healthy": False, "r_failures": 0, "r_recv": -math.inf}
    _ROUTER_DTYPES = {"r_healthy": np.bool_, "r_failures": np.int32}

    def __init__(
        self, cfg: SimConfig, name: str, counters: SimCounters, rng: np.random.Generator
    ) -> None:
        self.cfg, self.name, self.counters, self.rng = cfg, name, counters, rng
        self.subjects = Subjects()
        self.ids: list[str | None] = []
        self.slot_of: dict[str, int] = {}
        self.free: list[int] = []
        self.cap = 0
        for k, fill in self._ARRAYS.items():
            setattr(self, k, np.full(0, fill, dtype=self._DTYPES.get(k, np.float64)))
        r = cfg.routers_per_deployment
        for k, fill in self._ROUTER.items():
            setattr(self, k, np.full((r, 0), fill, dtype=self._ROUTER_DTYPES.get(k, np.float64)))
        self.handle_ids = [f"sim-{name}-r{i}" for i in range(r)]
        self.seq = np.zeros(r, dtype=np.int64)
        self.next_report = np.full(r, math.inf)
        self.member_slots: I64 = np.zeros(0, dtype=np.int64)
        self.member_ids: pa.Array = pa.array([], type=pa.utf8())
        self.membership_epoch = 0
        self.wanted_by_key: dict[str, tuple[str, str]] = {}
        """fp_targets key -> (replica id, version), kept from the per-replica changes."""
        self.view = MembershipView(cfg.app, name)
        self.starting: list[tuple[float, int]] = []
        self.versions: dict[str, str] = {}
        self.subject = {k: self.subjects.report(k, cfg.app, name) for k in
                        ("handle", "replica", "heartbeat", "lifecycle")}  # fmt: skip

    # -- replicas come and go (fp_targets) ---------------------------------------------------

    def _grow(self, n: int) -> None:
        if n <= self.cap:
            return
        n = max(n, 2 * self.cap, 64)
        for k, fill in self._ARRAYS.items():
            setattr(self, k, _grown(getattr(self, k), n, fill))
        for k, fill in self._ROUTER.items():
            setattr(self, k, _grown(getattr(self, k), n, fill))
        self.ids.extend([None] * (n - self.cap))
        self.free.extend(range(n - 1, self.cap - 1, -1))
        self.cap = n

    def apply_targets(
        self, wanted: dict[str, str], now: float, wall: float
    ) -> tuple[Outbox, list[str]]:
        """fp_targets changed: become the new replicas, stop the ones no longer listed.
        Returns the lifecycle messages and the ids that left."""
        out: Outbox = []
        gone = [rid for rid in self.slot_of if rid not in wanted]
        for rid in gone:
            slot = self.slot_of.pop(rid)
            out.append(self._lifecycle(rid, self.versions.get(rid, ""), "exited", wall, 0))
            self.ids[slot] = None
            self.free.append(slot)
            for k, fill in self._ARRAYS.items():
                getattr(self, k)[slot] = fill
            for k, fill in self._ROUTER.items():
                getattr(self, k)[:, slot] = fill
        new = [rid for rid in wanted if rid not in self.slot_of]
        if new:
            self._grow(len(self.slot_of) + len(new))
            slots = np.array([self.free.pop() for _ in new], dtype=np.int64)
            for rid, slot in zip(new, slots.tolist(), strict=True):
                self.slot_of[rid] = slot
                self.ids[slot] = rid
                out.append(self._lifecycle(rid, wanted[rid], "starting", wall))
                self.starting.append((now, slot))
            k = len(new)
            self.alive[slots] = True
            u = self.rng.random(k)
            self.rate[slots] = np.where(u < self.cfg.idle_share, 0.0, self.cfg.request_rate)
            self.push[slots] = self.rng.random(k) < self.cfg.push_share
        self.versions = wanted
        return out, gone

    def _lifecycle(
        self, rid: str, version: str, state: str, wall: float, exit_code: int | None = None
    ) -> tuple[str, bytes]:
        return self.subject["lifecycle"], lifecycle(
            self.subjects, self.cfg.app, self.name, rid, version, state, wall, exit_code
        )

    def apply_membership(self, view: MembershipView) -> None:
        self.membership_epoch = view.epoch
        ids = [x.replica_id for x in view.members() if x.replica_id in self.slot_of]
        self.member_slots = np.fromiter((self.slot_of[r] for r in ids), np.int64, len(ids))
        self.member_ids = pa.array(ids, type=pa.utf8())
        self.member[:] = False
        self.member[self.member_slots] = True
        # routers prune carried entries of replicas that left the membership
        for k, fill in self._ROUTER.items():
            getattr(self, k)[:, ~self.member] = fill

    def set_interval(self, now: float) -> None:
        """(Re)start the routers' and pushing replicas' report clocks at random phases."""
        iv = self.cfg.metrics_interval_s
        self.next_report = now + self.rng.random(len(self.handle_ids)) * iv
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
        for r in np.flatnonzero(self.next_report <= now).tolist():
            self.next_report[r] += self.cfg.metrics_interval_s
            if self.next_report[r] <= now:
                self.next_report[r] = now + self.cfg.metrics_interval_s
            self._handle_report(r, now, wall, out)
        return out

    def _become_ready(self, now: float, wall: float, out: Outbox) -> None:
        if not self.starting:
            return
        cut = now - self.cfg.start_s
        due = [s for t, s in self.starting if t <= cut]
        self.starting = [(t, s) for t, s in self.starting if t > cut]
        slots = np.array(due, dtype=np.int64)
        slots = slots[self.alive[slots]]
        for slot in slots.tolist():
            rid = self.ids[slot]
            assert rid is not None
            out.append(self._lifecycle(rid, self.versions.get(rid, ""), "ready", wall))
        k = slots.size
        self.started[slots] = True
        # the runtime checks once before it subscribes; later checks land anywhere in a period
        self.checked[slots] = wall
        self.healthy[slots] = True
        self.failures[slots] = 0
        self.next_check[slots] = now + self.rng.random(k) * self.cfg.health_period_s
        iv = self.cfg.metrics_interval_s
        self.next_push[slots] = np.where(self.push[slots], now + self.rng.random(k) * iv, math.inf)

    def _checks(self, now: float, wall: float) -> I64:
        due = np.flatnonzero(self.started & (self.fault != SILENT) & (self.next_check <= now))
        if due.size:
            self._late(self.next_check[due], now)
            ok = self.fault[due] != UNHEALTHY
            self.checked[due] = wall
            self.healthy[due] = ok
            self.failures[due] = np.where(ok, 0, self.failures[due] + 1)
            jitter = self.rng.uniform(1 - JITTER, 1 + JITTER, due.size)
            self.next_check[due] = now + self.cfg.health_period_s * jitter
        return due

    def _late(self, due: F64, now: float) -> None:
        """Events that ran at `now`, due at `due` (fleet_apps.AppsSim counts them)."""

    def _admissions(self, now: float, dt: float) -> None:
        active = self.member & self.started & (self.fault != SILENT) & (self.rate > 0)
        p = -np.expm1(-self.rate * dt)
        hit = np.flatnonzero(active & (self.rng.random(self.cap) < p))
        if hit.size == 0:
            return
        which = self.rng.integers(0, len(self.handle_ids), hit.size)
        ck = self.checked[hit]
        for r in range(len(self.handle_ids)):
            sel = hit[which == r]
            newer = ck[which == r] > self.r_ck[r, sel]
            s = sel[newer]
            self.r_ck[r, s] = self.checked[s]
            self.r_healthy[r, s] = self.healthy[s]
            self.r_failures[r, s] = self.failures[s]
            self.r_recv[r, s] = now
        self._carried(hit, now)

    def _carried(self, slots: I64, now: float) -> None:
        """The suppression tracker's `carried(latest, now)` for these replicas."""
        self.carried_mono[slots] = now
        newer = self.checked[slots] > self.carried_ck[slots]
        s = slots[newer]
        self.carried_ck[s] = self.checked[s]
        self.carried_healthy[s] = self.healthy[s]

    def _heartbeats(self, now: float, wall: float, checked: I64, out: Outbox) -> None:
        live = self.started & (self.fault != SILENT)
        never = live & np.isnan(self.carried_mono)
        window = live & (now - self.carried_mono >= self.cfg.freshness_s)
        flip = np.zeros(self.cap, np.bool_)
        flip[checked] = (self.checked[checked] > self.carried_ck[checked]) & (
            self.healthy[checked] != self.carried_healthy[checked]
        )
        due = np.flatnonzero(never | window | flip)
        if due.size == 0:
            return
        c = self.counters.heartbeats
        c["first"] += int(never[due].sum())
        w = window[due] & ~never[due]
        c["window_active"] += int((w & (self.rate[due] > 0)).sum())
        c["window_idle"] += int((w & (self.rate[due] == 0)).sum())
        c["flip"] += int((flip[due] & ~w & ~never[due]).sum())
        subject = self.subject["heartbeat"]
        for slot in due.tolist():
            data = encode(Heartbeat(self._status(slot), wall))
            out.append((subject, data))
        self._count("heartbeat", out[-due.size :])
        self._carried(due, now)
        self._offered(due, self.checked[due], now, direct=True)

    def _replica_reports(self, now: float, wall: float, out: Outbox) -> None:
        due = np.flatnonzero(self.started & (self.fault != SILENT) & (self.next_push <= now))
        if due.size == 0:
            return
        iv = self.cfg.metrics_interval_s
        self.next_push[due] = np.maximum(self.next_push[due] + iv, now)
        self.push_seq[due] += 1
        running = self.rate[due] * RUNNING_PER_REQUEST_S
        for slot, seq, run in zip(due.tolist(), self.push_seq[due].tolist(), running.tolist(),
                                  strict=True):  # fmt: skip
            rid = self.ids[slot]
            assert rid is not None
            report = ReplicaReport(rid, wall, seq, run, {}, self._status(slot))
            out.append((self.subject["replica"], encode(report)))
        self._count("replica", out[-due.size :])
        self._carried(due, now)
        self._offered(due, self.checked[due], now, direct=True)

    def _status(self, slot: int) -> HealthStatus:
        rid = self.ids[slot]
        assert rid is not None
        return HealthStatus(
            rid, bool(self.healthy[slot]), float(self.checked[slot]), int(self.failures[slot])
        )

    def _handle_report(self, r: int, now: float, wall: float, out: Outbox) -> None:
        ms = self.member_slots
        if ms.size == 0:
            return
        self.seq[r] += 1
        routers = len(self.handle_ids)
        running = self.rate[ms] * RUNNING_PER_REQUEST_S / routers
        running = running * self.rng.uniform(0.5, 1.5, ms.size)
        ck = self.r_ck[r, ms]
        valid = (ck > -math.inf) & (now - self.r_recv[r, ms] <= ROUTER_MAX_AGE_S)
        meta = dict(
            handle_id=self.handle_ids[r], app=self.cfg.app, deployment=self.name, sent_at=wall,
            seq=int(self.seq[r]), queued_requests=0.0, membership_epoch=self.membership_epoch,
        )  # fmt: skip
        kind, parts = encode_handle(
            self.cfg, meta, self.member_ids, running, self.r_healthy[r, ms], ck,
            self.r_failures[r, ms], valid,
        )  # fmt: skip
        out.extend((self.subject["handle"], p) for p in parts)
        self._count(kind, out[-len(parts) :])
        self._offered(ms[valid], ck[valid], now, direct=False)

    def _count(self, kind: str, msgs: Outbox) -> None:
        self.counters.sent[kind] += len(msgs)
        self.counters.bytes_sent[kind] += sum(len(d) for _, d in msgs)

    def _offered(self, slots: I64, ck: F64, now: float, *, direct: bool) -> None:
        offered(self.pub_ck, self.last_fresh, self.counters.gap_hist, slots, ck, now, direct=direct)

    # -- probes and faults ---------------------------------------------------------------------

    def answer_probe(self, slot: int, now: float, wall: float) -> bytes | None:
        if not self.started[slot] or self.fault[slot] == SILENT:
            return None
        s = np.array([slot], dtype=np.int64)
        self._carried(s, now)
        self._offered(s, self.checked[s], now, direct=True)
        return encode(self._status(slot))

    def candidates(self) -> I64:
        """Replicas a fault may hit: running members with traffic and no fault yet."""
        return np.flatnonzero(self.member & self.started & (self.fault == OK) & (self.rate > 0))


# -- the bus side ------------------------------------------------------------------------------


@dataclass(slots=True)
class FaultRecord:
    deployment: str
    replica_id: str
    kind: str
    at: float
    detected_after_s: float | None = None


class FleetSim:
    """Every deployment of the fleet on one NATS connection: watches fp_targets and fp_membership,
    answers probes, publishes what the fleet would publish every `tick_s`."""

    def __init__(self, cfg: SimConfig, deployments: list[str], *, seed: int = 1,
                 tick_s: float = 0.2) -> None:  # fmt: skip
        self.cfg = cfg
        self.tick_s = tick_s
        self.counters = SimCounters()
        rng = np.random.default_rng(seed)
        self.rng = rng
        self.deps = {d: DeploymentSim(cfg, d, self.counters, rng) for d in deployments}
        self.faults: dict[str, FaultRecord] = {}
        self.tick_seconds: list[float] = []
        """Wall time each simulator tick took (the simulator must keep up for numbers to hold)."""
        self.late_ticks = 0
        self.bad_values = 0
        self.largest_kv_value = 0
        """Bytes of the largest fp_targets / fp_membership value seen (no limit raised for it)."""
        self.largest_sent = 0
        """Bytes of the largest message the simulated fleet published."""
        self._bus: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._subs: list[Any] = []
        self._stop = asyncio.Event()
        self._dirty_targets: set[str] = set()
        self._dirty_members: set[str] = set()

    def set_interval(self, metrics_interval_s: float) -> None:
        self.cfg = dataclasses.replace(self.cfg, metrics_interval_s=metrics_interval_s)
        now = time.monotonic()
        for d in self.deps.values():
            d.cfg = self.cfg
            d.set_interval(now)

    def members(self) -> int:
        return sum(int(d.member_slots.size) for d in self.deps.values())

    async def start(self, url: str) -> None:
        from shared.natsbus import NatsBus

        self._bus = bus = await NatsBus.connect(url, name="fleet-sim")
        self.cfg = dataclasses.replace(self.cfg, max_payload=bus.max_payload)
        for d in self.deps.values():
            d.cfg = self.cfg
        nc = bus.nc
        self._subs.append(await nc.subscribe(f"{Subjects().prefix}.probe.*", cb=self._on_probe))
        self._index: dict[str, DeploymentSim] = {}
        targets = await buckets.open_bucket(bus, buckets.TARGETS)
        members = await buckets.open_bucket(bus, buckets.MEMBERSHIP)
        self._tasks.append(asyncio.create_task(self._watch(targets, self._on_target)))
        self._tasks.append(asyncio.create_task(self._watch(members, self._on_member)))
        self._tasks.append(asyncio.create_task(self._loop()))

    async def stop(self) -> None:
        self._stop.set()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._bus is not None:
            await self._bus.close()

    async def _watch(self, kv: Any, apply: Any) -> None:
        """Per-replica (targets) and per-slot (members) changes are gathered here and applied
        to the deployments once per simulator tick (`_apply_changes`), as a router would."""
        async for entry in await kv.watch():
            if entry is None:
                continue
            self.largest_kv_value = max(self.largest_kv_value, len(entry.value or b""))
            try:
                apply(entry.key, entry.value if entry.op == "PUT" else None)
            except (WireError, ValueError, KeyError) as exc:
                self.bad_values += 1
                log.warning("simulator: ignoring %s: %s", entry.key, exc)

    def _on_target(self, key: str, value: bytes | None) -> None:
        where = TargetKey.parse(key)
        d = self.deps.get(where.deployment)
        if d is None:
            return
        if value is None:
            d.wanted_by_key.pop(key, None)
        else:
            t = envelope.decode(value, ReplicaTarget)
            d.wanted_by_key[key] = (t.replica_id, t.version)
        self._dirty_targets.add(d.name)

    def _on_member(self, key: str, value: bytes | None) -> None:
        _, dep, _ = parse_member_key(key)
        d = self.deps.get(dep)
        if d is None:
            return
        if value is None:
            d.view.delete(key)
        else:
            d.view.put(key, envelope.decode(value, Member))
        self._dirty_members.add(dep)

    async def _apply_changes(self) -> None:
        now = time.monotonic()
        for name in sorted(self._dirty_targets):
            d = self.deps[name]
            wanted = dict(d.wanted_by_key.values())
            out, gone = d.apply_targets(wanted, now, time.time())
            for rid in gone:
                self._index.pop(rid, None)
                f = self.faults.get(rid)
                if f is not None and f.detected_after_s is None:
                    f.detected_after_s = now - f.at
            for rid in wanted:
                self._index[rid] = d
            await self._publish(out)
        self._dirty_targets.clear()
        for name in sorted(self._dirty_members):
            self.deps[name].apply_membership(self.deps[name].view)
        self._dirty_members.clear()

    async def _on_probe(self, msg: Any) -> None:
        rid = msg.subject.rsplit(".", 1)[1]
        d = self._index.get(rid)
        slot = None if d is None else d.slot_of.get(rid)
        if d is None or slot is None:
            self.counters.probes["unknown"] += 1
            return
        self.counters.probes["faulted" if d.fault[slot] != OK else "healthy"] += 1
        data = d.answer_probe(slot, time.monotonic(), time.time())
        if data is None or not msg.reply:
            self.counters.probes["unanswered"] += 1
            return
        await self._bus.nc.publish(msg.reply, data)

    async def _loop(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            started = time.perf_counter()
            now, wall = time.monotonic(), time.time()
            await self._apply_changes()
            await self._publish(self._tick(now, wall))
            self.tick_seconds.append(time.perf_counter() - started)
            next_at += self.tick_s
            delay = next_at - time.monotonic()
            if delay < 0:
                self.late_ticks += 1
                next_at = time.monotonic()
            await asyncio.sleep(max(0.0, delay))

    def _tick(self, now: float, wall: float) -> Outbox:
        out: Outbox = []
        for d in self.deps.values():
            out += d.tick(now, wall, self.tick_s)
        return out

    async def _publish(self, out: Outbox) -> None:
        nc = self._bus.nc
        for subject, data in out:
            self.largest_sent = max(self.largest_sent, len(data))
            await nc.publish(subject, data)

    def inject(self, kind: int, count: int) -> list[FaultRecord]:
        """Fault `count` replicas (spread over deployments, chosen at random)."""
        pool = [(d, int(s)) for d in self.deps.values() for s in d.candidates().tolist()]
        picks = self.rng.choice(len(pool), size=min(count, len(pool)), replace=False)
        now = time.monotonic()
        made = []
        for i in picks.tolist():
            d, slot = pool[i]
            d.fault[slot] = kind
            rid = d.ids[slot]
            assert rid is not None
            made.append(f := FaultRecord(d.name, rid, FAULT_NAMES[kind], now))
            self.faults[rid] = f
        return made

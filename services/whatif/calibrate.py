"""What the closed-loop what-if model needs, recovered from a recording (a pure function of it).

How it works. Routers that count requests send cumulative counters in their handle reports
(`HandleReport.stats`, wire.md); replicas send their admission limit on "ready" and agents report
a spawn as "starting" (lifecycle events). Per deployment, from the recorded rows:

- **Arrivals.** Each router's `arrived` counter, read at its reports' receipt times, is a
  cumulative arrival curve; the deployment's is the sum over its routers (each linear between two
  reports, flat before a router's first report: what came before it is not attributed to any
  time). `arrivals_between(t0, t1)` integrates it, vectorised.
- **Burstiness.** The index of dispersion D (variance / mean of arrivals per report interval),
  estimated from successive differences so that a ramp does not read as bursts: 1 for Poisson,
  above 1 for bursty arrivals. Reported to the operator; the simulation replays each report
  interval's recorded count, so burstiness down to the report interval needs no model.
- **Service time and its growth with concurrency.** Routers sum, over completed requests, the
  service time s, the replica's concurrency c at admission (its `num_ongoing`, the request
  included) and c^2, c*s, s^2: the sufficient statistics of a least-squares line
  S(c) = base_s + slope_s * (c - 1) over every request of the recording (slope >= 0), and of
  the spread left around it (a coefficient of variation).
- **Start time and its growth with replicas starting together.** Per replica, the first
  "starting" to the first "ready" event (agents stamp the spawn, replicas their own start and
  ready; both wall clocks of the replica's host), and k, the deployment's replicas starting at
  once with it: those still starting at its spawn and those spawned within `BATCH_S` after it
  (itself included). Replicas that start together compete for their host (on two cores, five
  live starts took 2.1-2.3 s where one took 0.6 s), so a line T(k) = base + slope * (k - 1)
  is fitted through the recorded starts (slope >= 0), and each start's ratio to the line is
  kept: the simulation draws a recorded ratio and scales the line at the k it starts with.
  Starts that never vary in k give slope 0, and the draws are the recorded start times.
- **max_ongoing_requests** as the replicas announced it, and the report interval (median gap
  between one router's reports).
- **Slot use under saturation.** How much of its replicas' slots a router keeps busy while
  requests wait: near 1 for routers that hand a freed slot to their oldest waiter, less for
  older ones that let waiters race and retry after refusals. Over the report intervals in which
  a router's load (running + queued) exceeded its replicas' slots and had done so in the
  interval before (membership unchanged since), the service time it completed over the
  slot-time there is the share (no such interval: 1). The first interval of a saturation does
  not count: the requests completing in it were admitted before, at a lower concurrency and so
  with shorter service times, while those admitted at the limit are still running, which reads
  as idle slots (a share of 0.35 at one onset where the slots were full throughout).
  Per router, on its own load: with several routers a router's share rarely fills every slot,
  so the share is measured only where one router saturates the deployment.

A deployment without stats in its reports has `arrivals is None`: the closed loop cannot run
there (the caller says so and falls back to the open-loop what-if).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute

from shared.errors import UsageError, WireError
from shared.subjects import DEFAULT_NAMESPACE, Subjects, deployment_key
from shared.wire.codec import decode_as
from shared.wire.columnar import decode_handle_report_columnar, detect_format
from shared.wire.messages import HandleReport, Lifecycle, RequestStats

F64 = npt.NDArray[np.float64]
_US: Final = 1e6
MAX_DISPERSION: Final = 50.0
MAX_CV: Final = 3.0
MIN_SATURATED_SLOT_S: Final = 5.0
"""Saturated slot-seconds below which the slot share is not measured (read as 1)."""
MIN_SATURATED_USE: Final = 0.5
BATCH_S: Final = 0.5
"""Spawns this close after a replica's start with it (an agent spawns a scale event's replicas
one after another, tens of milliseconds apart)."""


def _saturated_use(routers: Iterable[_Router], max_ongoing: int | None) -> tuple[float, float]:
    """(share of slots busy while a router's load exceeded its replicas' slots, slot-seconds)."""
    if not max_ongoing:
        return 1.0, 0.0
    slot = busy = 0.0
    for r in routers:
        before = False  # the interval before was saturated, with the same members
        for n, load, dt, service, chained in r.spans:
            now = n > 0 and load > n * max_ongoing
            if now and before and chained:
                slot += n * max_ongoing * dt
                busy += service
            before = now
    if slot < MIN_SATURATED_SLOT_S:
        return 1.0, slot
    return min(max(busy / slot, MIN_SATURATED_USE), 1.0), slot


@dataclass(frozen=True, slots=True, eq=False)
class ArrivalCurve:
    """Cumulative arrivals, the sum of one piecewise-linear curve per router."""

    curves: tuple[tuple[F64, F64], ...]
    """Per router: (times s since the recording start, cumulative arrivals from its first report)."""

    def at(self, t: F64) -> F64:
        out = np.zeros_like(t, dtype=np.float64)
        for times, counts in self.curves:
            out += np.interp(t, times, counts, left=0.0, right=float(counts[-1]))
        return out

    def arrivals_between(self, edges: F64) -> F64:
        """Arrivals in each [edges[i], edges[i+1])."""
        return np.maximum(np.diff(self.at(edges)), 0.0)

    @property
    def total(self) -> float:
        return float(sum(c[-1] for _, c in self.curves))


@dataclass(frozen=True, slots=True, eq=False)
class Calibration:
    """The model inputs of one deployment (see the module docstring)."""

    key: str
    arrivals: ArrivalCurve | None
    dispersion: float
    base_s: float | None
    """Mean service time at one request per replica (None: nothing completed)."""
    slope_s: float
    """Growth of the mean service time per extra request in flight on the replica."""
    cv: float
    startup_s: float | None
    max_ongoing: int | None
    report_interval_s: float | None
    saturated_use: float
    """The share of slots busy while requests wait (see the module docstring)."""
    saturated_s: float
    """The slot-seconds that share was measured over (0: never saturated)."""
    completed: int
    rejected: int
    timed_out: int
    wait_s: float
    startups: tuple[float, ...] = ()
    """Every recorded start time (sorted)."""
    startup_base_s: float | None = None
    """The fitted start time of a replica starting alone (None: no start was recorded)."""
    startup_slope_s: float = 0.0
    """Growth of the start time per other replica of the deployment starting at once."""
    startup_spread: tuple[float, ...] = ()
    """Each recorded start over the fitted line at its k (sorted): what the simulation draws."""
    concurrency_sum: float = 0.0
    """The recorded requests' concurrency at admission, summed (the model of the recorded
    config is checked against its mean)."""

    @property
    def mean_concurrency(self) -> float | None:
        """As recorded: the requests a request found on its replica at admission, itself in."""
        return self.concurrency_sum / self.completed if self.completed else None

    @property
    def mean_wait_s(self) -> float:
        """As recorded: the time a request waited in its router's queue."""
        return self.wait_s / self.completed if self.completed else 0.0

    def startup_at(self, starting: int) -> float | None:
        """The fitted start time of a replica starting with `starting - 1` others."""
        if self.startup_base_s is None:
            return None
        return self.startup_base_s + self.startup_slope_s * max(starting - 1, 0)

    def service_s(self, concurrency: float) -> float:
        base = self.base_s if self.base_s is not None else 0.0
        return base + self.slope_s * max(concurrency - 1.0, 0.0)

    def doc(self) -> dict[str, object]:
        """Plain data for the JSON (the caller rounds)."""
        return {
            "arrivals": None if self.arrivals is None else self.arrivals.total,
            "dispersion": self.dispersion,
            "service_base_s": self.base_s,
            "service_slope_s": self.slope_s,
            "service_cv": self.cv,
            "startup_s": self.startup_s,
            "startups": len(self.startups),
            "startup_range_s": list(self.startups[:: max(len(self.startups) - 1, 1)]),
            "startup_base_s": self.startup_base_s,
            "startup_slope_s": self.startup_slope_s,
            "max_ongoing_requests": self.max_ongoing,
            "report_interval_s": self.report_interval_s,
            "saturated_use": self.saturated_use,
            "saturated_slot_s": self.saturated_s,
            "recorded": {
                "completed": self.completed,
                "rejected": self.rejected,
                "timed_out": self.timed_out,
                "mean_wait_s": self.mean_wait_s,
                "mean_concurrency": self.mean_concurrency,
            },
        }


@dataclass(slots=True)
class _Router:
    times: list[float]
    sent: list[float]
    arrived: list[int]
    first: RequestStats
    last: RequestStats
    members: frozenset[str] | None = None
    spans: list[tuple[int, float, float, float, bool]] = field(default_factory=list)
    """Per report after one with the same members: (replicas, load, seconds, service s, whether
    the report before was a span too)."""
    spanned: bool = False
    """The last report added a span."""

    def total(self, name: str) -> float:
        """Growth of a counter over the recording (from this router's first report)."""
        return float(getattr(self.last, name) - getattr(self.first, name))


def _fit_service(routers: Iterable[_Router]) -> tuple[float | None, float, float, int]:
    """(base_s, slope_s, cv, completed): a least-squares line of service time against the
    replica's concurrency at admission, over every request completed during the recording
    (the routers' sums are its sufficient statistics), and the spread left around it."""
    names = ("completed", "concurrency_sum", "concurrency_sq_sum", "service_s",
             "concurrency_service_s", "service_sq_s2")  # fmt: skip
    n, sc, scc, ss, scs, sss = (sum(r.total(k) for r in routers) for k in names)
    if n <= 0:
        return None, 0.0, 0.0, 0
    mean_s, mean_c = ss / n, sc / n
    var_c = scc / n - mean_c**2
    slope = 0.0
    if var_c > 1e-9 and sc > 0:  # concurrency varied (and the routers counted it)
        slope = max((scs / n - mean_c * mean_s) / var_c, 0.0)
    base = max(mean_s - slope * max(mean_c - 1.0, 0.0), 1e-6) if sc > 0 else mean_s
    resid = sss / n - mean_s**2 - slope**2 * max(var_c, 0.0)
    cv = min(math.sqrt(max(resid, 0.0)) / base, MAX_CV) if base > 0 else 0.0
    return base, slope, cv, round(n)


@dataclass(frozen=True, slots=True)
class StartupFit:
    """The recorded start times and the line through them (see the module docstring)."""

    times: tuple[float, ...] = ()
    """Every recorded start time, sorted."""
    base_s: float | None = None
    slope_s: float = 0.0
    spread: tuple[float, ...] = ()


def _fit_startup(spawned: dict[str, float], ready: dict[str, float]) -> StartupFit:
    """The line T(k) = base + slope * (k - 1) through the recorded start times against k, the
    replicas starting at once (see the module docstring), and each start's ratio to it."""
    ids = [r for r, at in spawned.items() if r in ready and ready[r] >= at]
    if not ids:
        return StartupFit()
    s = np.asarray([spawned[r] for r in ids])
    e = np.asarray([ready[r] for r in ids])
    d = e - s
    # started with replica i: spawned by s_i + BATCH_S and not ready by s_i (a replica ready
    # by s_i was spawned before it, so those are a subset): O(n log n), not pairs
    with_it = np.searchsorted(np.sort(s), s + BATCH_S, "right") - np.searchsorted(
        np.sort(e), s, "right"
    )
    others = np.maximum(with_it - 1, 0).astype(np.float64)  # k - 1: 0 for a start alone
    mean_d, mean_o = float(d.mean()), float(others.mean())
    var_o = float(np.mean((others - mean_o) ** 2))
    slope = (
        max(float(np.mean((others - mean_o) * (d - mean_d))) / var_o, 0.0) if var_o > 1e-9 else 0.0
    )
    times = tuple(np.sort(d).tolist())
    if not (d > 0).any():
        return StartupFit(times)  # every recorded start took no time: nothing to scale
    base = mean_d - slope * mean_o
    floor = min(float(d[d > 0].min()) / 2, mean_d)
    if base < floor:  # a steep fit: keep the line through the mean, its start time positive
        base, slope = floor, (mean_d - floor) / mean_o
    spread = np.sort(d / (base + slope * others))
    return StartupFit(times, base, slope, tuple(spread.tolist()))


def _dispersion(routers: Iterable[_Router]) -> float:
    """Index of dispersion of arrivals per report interval, from successive differences."""
    num = den = 0.0
    for r in routers:
        if len(r.times) < 3:
            continue
        n = np.diff(np.asarray(r.arrived, dtype=np.float64))
        num += float(np.sum(np.diff(n) ** 2))
        den += 2.0 * float(np.sum(n[1:]))
    if den <= 0:
        return 1.0
    return float(min(max(num / den, 1.0), MAX_DISPERSION))


def calibrate(
    rows: Iterable[tuple[int, str, bytes]], keys: Iterable[str], namespace: str = DEFAULT_NAMESPACE
) -> tuple[dict[str, Calibration], Counter[str]]:
    """Calibrations for the deployments named by `keys` ("app.deployment"), from the recording
    rows (recv_time us, subject, payload) in recv_time order; also counts of what was skipped."""
    subjects = Subjects(namespace)
    wanted = set(keys)
    routers: dict[str, dict[str, _Router]] = defaultdict(dict)
    starting: dict[str, dict[str, float]] = defaultdict(dict)
    ready: dict[str, dict[str, float]] = defaultdict(dict)
    limits: dict[str, Counter[int]] = defaultdict(Counter)
    skipped: Counter[str] = Counter()
    start_us: int | None = None
    for recv_us, subject, payload in rows:
        start_us = recv_us if start_us is None else start_us
        try:
            where = subjects.parse_report(subject)
        except UsageError:
            continue
        key = deployment_key(where.app, where.deployment)
        if key not in wanted:
            continue
        t = (recv_us - start_us) / _US
        try:
            if where.kind == "handle":
                if detect_format(payload) == "columnar":
                    c = decode_handle_report_columnar(payload)
                    if c.part == 0:  # stats are report-level, the same in every part
                        whole = c.parts == 1  # members and load only from a one-part report
                        ids = c.replica_ids.to_pylist() if whole else None
                        load = float(pa.compute.sum(c.batch.column(1)).as_py() or 0.0)
                        _add_report(routers[key], c.handle_id, c.sent_at, c.stats, t,
                                    ids, load + c.queued_requests)  # fmt: skip
                else:
                    r = decode_as(payload, HandleReport)
                    load = math.fsum(r.running.values()) + r.queued_requests
                    _add_report(routers[key], r.handle_id, r.sent_at, r.stats, t, r.running, load)
            elif where.kind == "lifecycle":
                ev = decode_as(payload, Lifecycle)
                if ev.state == "starting":
                    starting[key].setdefault(ev.replica_id, ev.at)
                elif ev.state == "ready":
                    ready[key].setdefault(ev.replica_id, ev.at)
                    if ev.max_ongoing_requests is not None:
                        limits[key][ev.max_ongoing_requests] += 1
        except WireError as exc:
            skipped["wire_" + exc.reason] += 1
    out: dict[str, Calibration] = {}
    for key in sorted(wanted):
        rs = [routers[key][h] for h in sorted(routers[key])]
        with_stats = [r for r in rs if len(r.times) >= 2]
        curve = (
            ArrivalCurve(
                tuple(
                    (np.asarray(r.times), np.asarray(r.arrived, dtype=np.float64) - r.arrived[0])
                    for r in with_stats
                )
            )
            if with_stats
            else None
        )
        base, slope, cv, completed = _fit_service(with_stats)
        starts = _fit_startup(starting[key], ready[key])
        max_ongoing = limits[key].most_common(1)[0][0] if limits[key] else None
        use, use_s = _saturated_use(with_stats, max_ongoing)
        gaps = [g for r in with_stats for g in np.diff(np.asarray(r.sent)).tolist() if g > 0]
        out[key] = Calibration(
            key=key,
            arrivals=curve,
            dispersion=_dispersion(with_stats),
            base_s=base,
            slope_s=slope,
            cv=cv,
            startup_s=statistics.median(starts.times) if starts.times else None,
            max_ongoing=max_ongoing,
            report_interval_s=statistics.median(gaps) if gaps else None,
            saturated_use=use,
            saturated_s=use_s,
            startups=starts.times,
            startup_base_s=starts.base_s,
            startup_slope_s=starts.slope_s,
            startup_spread=starts.spread,
            completed=completed,
            rejected=round(sum(r.total("rejected") for r in with_stats)),
            timed_out=round(sum(r.total("timed_out") for r in with_stats)),
            wait_s=sum(r.total("wait_s") for r in with_stats),
            concurrency_sum=sum(r.total("concurrency_sum") for r in with_stats),
        )
    return out, skipped


def _add_report(
    by_handle: dict[str, _Router],
    handle_id: str,
    sent_at: float,
    s: RequestStats | None,
    t: float,
    replicas: Iterable[str] | None = None,
    load: float = 0.0,
) -> None:
    if s is None:
        return
    cur = by_handle.get(handle_id)
    if cur is None:
        cur = by_handle[handle_id] = _Router([], [], [], s, s)
    elif s.arrived < cur.last.arrived or sent_at <= cur.sent[-1]:
        return  # a restarted router reusing its id, or a stale report: keep the first run
    members = None if replicas is None else frozenset(replicas)
    chained = cur.spanned
    cur.spanned = members is not None and members == cur.members and bool(cur.times)
    if cur.spanned:
        span = (len(members or ()), load, t - cur.times[-1], s.service_s - cur.last.service_s)
        cur.spans.append((*span, chained))
    cur.members = members
    cur.last = s
    cur.times.append(t)
    cur.sent.append(sent_at)
    cur.arrived.append(s.arrived)

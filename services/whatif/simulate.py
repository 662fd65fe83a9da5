"""Closed-loop what-if: queueing under the config under test, calibrated from a recording.

How it works. Per deployment, the recording gives the *arrivals* (calibrate.py), which do not
depend on the config: a config with fewer replicas makes the same requests wait longer. The
simulation runs on a fixed time step (`interval_s`, the controller's control interval) and
models, per step:

1. Arrivals: each report interval brings the requests the routers counted in it (so the
   recording's burstiness down to the report interval is replayed as it was), placed at random
   within it (seeded: a Poisson process given the count). The same draw serves every config
   (common random numbers), so configs differ by the config only.
2. Service: a request admitted when its replica serves c requests (itself included) takes
   S(c), the calibrated service time, spread by its variation: each admitted cohort leaves in
   `PIPE` shares at quantiles of that spread. With N others in flight on R running replicas, c
   is spread as the routers' power-of-two choice spreads it in equilibrium at N / R
   (admission.py), each share of a cohort served at its own c; N is the step's mean (its
   completions and admissions interleave) and, of the step's own admissions, the half
   admitted before it, not itself. A request that waited takes a slot the moment it frees:
   its replica serves max_ongoing_requests - 1 others.
3. Routers' queue: arrivals wait as cohorts by arrival step and are admitted, oldest first as
   routers serve their waiters, while R x max_ongoing_requests exceeds N. While requests wait,
   only the calibrated share of the slots is busy (`saturated_use`, near 1: a router knows each
   replica's limit and hands a freed slot to its oldest waiter at once). `random_order` models
   routers that let every waiter race for a freed slot (fleetpulse's before they served in
   order): each waiting request is then as likely as any other to get it, a cohort leaves in
   shares, and the oldest cohorts are merged to keep at most `MAX_COHORTS`. A queue beyond
   `max_queued` rejects; a request still queued at `timeout_s` times out.
4. Latency: each admitted cohort gets its queueing wait plus S(c) at admission, spread by the
   calibrated service-time variation (a fixed, seeded set of `NODES` gamma quantile nodes).
5. Reports and control: every report interval (at the step nearest each due time, from a
   seeded phase: where in a report interval the load changes is chance) the routers'
   time-averaged running + queued is what the controller's metrics store would hold (a cold
   start and a sharp rise report at once, at most once per `EARLY_REPORT_S`, as routers do);
   each step that demand goes into the controller's `DemandWindow` and
   `policy.decide` runs with the config under test, exactly as in the open-loop what-if.
6. Replicas: a target increase starts replicas that run a start time later: the calibrated
   start time at k, the replicas then starting at once (this scale event's and those still
   starting), scaled by a recorded start's ratio to it (drawn, seeded); or the `startup_s`
   option for all. A replica's start time is fixed when it spawns: a later batch does not slow
   it. A decrease stops first the replicas that would be ready last (still starting, then the
   newest).

The cost per step is O(1) per deployment whatever its replica count (the fluid aggregates the
replicas), so a 1,000-replica fleet costs what its deployments cost. Determinism: the seed and
the deployment key fix every draw; no clock, no I/O.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from services.controller.demand_window import DemandWindow
from services.controller.policy import PolicyInputs, decide, initial_state, needed_replicas
from services.router.config import RouterConfig
from services.router.rise import RISE_FACTOR, RISE_MIN
from shared.appconfig import AppConfig, AutoscalingConfig
from shared.errors import UsageError
from shared.subjects import deployment_key

from .calibrate import Calibration
from .fluid import FluidQueue, latencies, weighted_percentile
from .model import TimelineEntry
from .options import DEFAULT_MAX_QUEUED as DEFAULT_MAX_QUEUED
from .options import ModelOptions as ModelOptions

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
NODES: Final = 64
"""Service-time quantile nodes per admitted cohort (the latency distribution's resolution)."""
PERCENTILES: Final = (50.0, 95.0, 99.0)
P99_EVERY_S: Final = 10.0
EARLY_REPORT_S: Final = RouterConfig().cold_start_report_min_interval_s


def add_queue_order_arg(p: argparse.ArgumentParser) -> None:
    """`--queue-order`, for the CLIs that run the model (its value: `random_order`)."""
    p.add_argument(
        "--queue-order",
        choices=("fifo", "random"),
        default="random" if ModelOptions().random_order else "fifo",
        help="closed loop: how routers serve their queue: fifo (default: oldest first, as "
        "fleetpulse's do) or random (every waiter races for a freed slot, as routers did before)",
    )


@dataclass(frozen=True, slots=True, eq=False)
class ClosedRun:
    """One deployment under one config: per-step series and the request outcomes."""

    key: str
    config: AutoscalingConfig
    max_ongoing: int
    calibration: Calibration
    startup_s: float
    times: F64
    arrivals: F64
    demand: F64
    in_flight: F64
    queued: F64
    target: I64
    running: I64
    latency: F64
    """Sorted latency values (seconds) ..."""
    weight: F64
    """... and the requests each stands for."""
    arrived: float
    rejected: float
    timed_out: float
    timeline: tuple[TimelineEntry, ...]
    mean_concurrency: float | None = None
    """The requests on a replica at admission (itself included), averaged over the admitted:
    the recording has the same for the recorded config (calibration `mean_concurrency`)."""
    mean_wait_s: float | None = None
    p99_series: F64 = dataclasses.field(default_factory=lambda: np.empty(0))
    """p99 latency of the requests admitted in each `P99_EVERY_S` (NaN where none was)."""
    replications: tuple[ClosedRun, ...] = ()
    """Every replication (this one first) when there are several; latency and the request
    counts above are already pooled over them."""

    def percentile(self, q: float) -> float | None:
        return weighted_percentile(self.latency, self.weight, q)

    def completed(self) -> float:
        return float(self.weight.sum())

    def replica_seconds(self, interval_s: float) -> float:
        return float(self.running.sum()) * interval_s


def _arrival_draw(cal: Calibration, n: int, dt: float, block: int, seed: int) -> F64:
    """Arrivals per step: each report interval's recorded count (rounded so the running total
    stays exact), placed uniformly at random within it (a Poisson process, given its count)."""
    assert cal.arrivals is not None
    lam = cal.arrivals.arrivals_between(dt * np.arange(n + 1, dtype=np.float64))
    rng = np.random.default_rng([seed, zlib.crc32(cal.key.encode())])
    blocks = math.ceil(n / block)
    flat = np.zeros(blocks * block)
    flat[:n] = lam
    grid = flat.reshape(blocks, block)
    total = grid.sum(axis=1)
    counts = np.diff(np.floor(np.concatenate(([0.0], np.cumsum(total))) + 0.5)).astype(np.int64)
    out = np.zeros_like(grid)
    for b in np.flatnonzero(counts > 0).tolist():
        weights = grid[b] / total[b] if total[b] > 0 else np.full(block, 1.0 / block)
        out[b] = rng.multinomial(int(counts[b]), weights)
    return np.asarray(out.ravel()[:n], dtype=np.float64)


def _nodes(cv: float, key: str, seed: int) -> F64:
    if cv < 1e-3:
        return np.ones(NODES)
    k = 1.0 / (cv * cv)
    rng = np.random.default_rng([seed, zlib.crc32(key.encode()), 1])
    x = np.sort(rng.gamma(k, 1.0 / k, NODES))
    return np.asarray(x / x.mean(), dtype=np.float64)


class _StartTimes:
    """Start times of new replicas: the calibrated line at the number starting at once, times
    a recorded ratio (seeded); or the option's."""

    def __init__(self, cal: Calibration, opts: ModelOptions) -> None:
        self.fixed: float | None = opts.startup_s
        if self.fixed is None and not cal.startup_spread:
            self.fixed = cal.startup_s or 0.0
        self.cal = cal
        self.rng = np.random.default_rng([opts.seed, zlib.crc32(cal.key.encode()), 2])
        self.buf: list[float] = []

    def draw(self, starting: int = 1) -> float:
        """The start time of a replica spawned with `starting - 1` others starting."""
        if self.fixed is not None:
            return self.fixed
        if not self.buf:  # a batch of draws at a time: a scale event may start hundreds
            pool = np.asarray(self.cal.startup_spread)
            self.buf = pool[self.rng.integers(0, len(pool), 256)].tolist()
        return self.buf.pop() * (self.cal.startup_at(starting) or 0.0)


class _Reports:
    """What routers report (step 5): the time-weighted running + queued at their cadence, from a
    phase the load does not know (drawn); a queue at zero replicas (cold start) and a sharp rise
    that holds are reported at once, at most once per `early_s`, as routers do."""

    def __init__(self, report_s: float, phase_s: float, early_s: float) -> None:
        self.report_s = report_s
        self.early_s = early_s
        self.acc = 0.0  # integral of running + queued since the last report
        self.last = phase_s - report_s
        self.last_early = -math.inf
        self.value = 0.0
        self.rise_ticks = 0

    def step(self, now: float, dt: float, load: float, cold: bool, queued: float) -> float:
        self.acc += load * dt
        rising = load >= RISE_FACTOR * self.value + RISE_MIN
        self.rise_ticks = self.rise_ticks + 1 if rising else 0
        # the step nearest the due time: a cadence a little over a whole number of steps (a
        # recorded 1.001 s) must not wait a whole extra step each time
        due = now - self.last >= self.report_s - dt / 2
        early = ((cold and self.value < queued) or self.rise_ticks >= 2) and (
            now - self.last_early >= self.early_s - dt / 2
        )
        if due or early:
            span = now - max(self.last, 0.0)  # the first report covers the run from its start
            self.value = load if self.rise_ticks >= 2 else self.acc / span if span > 0 else load
            if cold:
                self.value = max(self.value, queued)
            if early and not due:
                self.last_early = now
            self.acc, self.last, self.rise_ticks = 0.0, now, 0
        return self.value


def run_deployment(
    key: str,
    cfg: AutoscalingConfig,
    max_ongoing: int,
    cal: Calibration,
    duration_s: float,
    opts: ModelOptions,
) -> ClosedRun:
    """Simulate one deployment over [0, duration_s] (see the module docstring), once per
    replication; several are pooled into the first."""
    if cal.arrivals is None:
        raise UsageError(f"{key}: the recording has no request stats to drive the closed loop")
    runs = [
        _run_once(key, cfg, max_ongoing, cal, duration_s, dataclasses.replace(opts, seed=seed))
        for seed in range(opts.seed, opts.seed + opts.replications)
    ]
    if len(runs) == 1:
        return runs[0]
    k = float(len(runs))
    lat = np.concatenate([r.latency for r in runs])
    order = np.argsort(lat, kind="stable")
    wts = np.concatenate([r.weight for r in runs]) / k
    return dataclasses.replace(
        runs[0],
        latency=lat[order],
        weight=wts[order],
        arrived=sum(r.arrived for r in runs) / k,
        rejected=sum(r.rejected for r in runs) / k,
        timed_out=sum(r.timed_out for r in runs) / k,
        replications=tuple(runs),
    )


def _run_once(
    key: str,
    cfg: AutoscalingConfig,
    max_ongoing: int,
    cal: Calibration,
    duration_s: float,
    opts: ModelOptions,
) -> ClosedRun:
    dt = opts.interval_s
    n = max(1, math.ceil(duration_s / dt))
    report_s = opts.report_interval_s or cal.report_interval_s or cfg.metrics_interval_s
    arrivals = _arrival_draw(cal, n, dt, max(1, round(report_s / dt)), opts.seed)
    startup = opts.startup_s if opts.startup_s is not None else (cal.startup_s or 0.0)
    starts = _StartTimes(cal, opts)
    nodes = _nodes(cal.cv, key, opts.seed)
    every = max(1, round(P99_EVERY_S / dt))
    q = FluidQueue(cal, max_ongoing, nodes, opts)
    phase = float(np.random.default_rng([opts.seed, zlib.crc32(key.encode()), 3]).uniform())
    reports = _Reports(report_s, phase * report_s, EARLY_REPORT_S)
    window = DemandWindow.for_policy(cfg)
    keep_s = max(cfg.look_back_period_s, cfg.panic_window_s)
    state = initial_state(cfg, 0.0)
    ready_at = [0.0] * state.target
    demand, in_flight, queue = np.empty(n), np.empty(n), np.empty(n)
    target = np.empty(n, dtype=np.int64)
    running = np.empty(n, dtype=np.int64)
    timeline: list[TimelineEntry] = []
    last_rule = ""
    for k, a in enumerate(arrivals.tolist()):
        now = (k + 1) * dt
        r = bisect.bisect_right(ready_at, now)
        if k // every != q.window:
            q.window_done(nodes)
            q.window = k // every
        q.step(k, a, r)
        cold = state.target == 0 and q.queued > 0
        reported = reports.step(now, dt, q.n_flight + q.queued, cold, q.queued)
        window.add(now, reported)
        mean, short, full = window.policy_demand(cfg, state.target, now)
        state, d = decide(cfg, state, PolicyInputs(mean, short, full, cold, r), now)
        if d.target > len(ready_at):
            starting = d.target - r  # this scale event's and those still starting
            for _ in range(d.target - len(ready_at)):
                bisect.insort(ready_at, now + starts.draw(starting))
        del ready_at[d.target :]
        window.trim(now, keep_s)
        r_after = bisect.bisect_right(ready_at, now)
        if d.changed or d.rule != last_rule:
            timeline.append(
                TimelineEntry(now, key, mean, d.target, d.desired, r_after, d.rule, d.reason)
            )
        last_rule = d.rule
        demand[k], in_flight[k], queue[k] = reported, q.n_flight, q.queued
        target[k], running[k] = d.target, r_after
    q.window_done(nodes)
    lat, wts = latencies(q.records(), nodes)
    p99 = np.full(math.ceil(n / every), np.nan)
    for b, x in q.p99.items():
        p99[b] = x
    timed_out = q.timed_out
    if opts.timeout_s is not None and lat.size:
        late = lat > opts.timeout_s
        timed_out += float(wts[late].sum())
        lat, wts = lat[~late], wts[~late]
    return ClosedRun(
        key=key,
        config=cfg,
        max_ongoing=max_ongoing,
        calibration=cal,
        startup_s=startup,
        times=dt * np.arange(1, n + 1, dtype=np.float64),
        arrivals=arrivals,
        demand=demand,
        in_flight=in_flight,
        queued=queue,
        target=target,
        running=running,
        latency=lat,
        weight=wts,
        arrived=float(arrivals.sum()),
        rejected=q.rejected,
        timed_out=timed_out,
        timeline=tuple(timeline),
        mean_concurrency=q.admitted_c / q.admitted if q.admitted > 0 else None,
        mean_wait_s=q.admitted_wait / q.admitted if q.admitted > 0 else None,
        p99_series=p99,
    )


def queue_given(
    cal: Calibration, max_ongoing: int, arrivals: F64, running: I64, opts: ModelOptions
) -> tuple[F64, F64]:
    """The queue alone (steps 2-4), with the replicas running each step given instead of
    decided: sorted latencies and the requests each stands for. Given a live run's replicas
    and its arrivals per step, this is the model's answer with the policy's feedback taken
    out, so its error against the live latencies is the queueing model's own."""
    if arrivals.shape != running.shape:
        raise UsageError("arrivals and running need one value per step each")
    nodes = _nodes(cal.cv, cal.key, opts.seed)
    q = FluidQueue(cal, max_ongoing, nodes, opts)
    for k, (a, r) in enumerate(zip(arrivals.tolist(), running.tolist(), strict=True)):
        q.step(k, a, r)
    return latencies(q.records(), nodes)


@dataclass(frozen=True, slots=True, eq=False)
class ClosedResult:
    options: ModelOptions
    start_us: int
    duration_s: float
    deployments: dict[str, ClosedRun]


def simulate_closed(
    calibrations: dict[str, Calibration],
    apps: Sequence[AppConfig],
    duration_s: float,
    start_us: int = 0,
    opts: ModelOptions | None = None,
) -> ClosedResult:
    """Every deployment of `apps` that has a calibration with arrivals, in sorted order."""
    opts = opts or ModelOptions()
    runs: dict[str, ClosedRun] = {}
    for app in apps:
        for d in app.deployments:
            key = deployment_key(app.name, d.name)
            cal = calibrations.get(key)
            if cal is None or cal.arrivals is None:
                continue
            # the deployment's own queue bound where it sets one, else the routers' default
            mine = (
                opts
                if d.max_queued_requests < 0
                else dataclasses.replace(opts, max_queued=d.max_queued_requests)
            )
            runs[key] = run_deployment(key, d.policy, d.max_ongoing_requests, cal, duration_s, mine)
    return ClosedResult(opts, start_us, duration_s, dict(sorted(runs.items())))


def under_provisioned_s(run: ClosedRun, interval_s: float) -> float:
    """Time with fewer replicas running than the offered load needs at the config's target."""
    need = np.fromiter(
        (needed_replicas(run.config, x) for x in (run.in_flight + run.queued).tolist()),
        dtype=np.int64,
        count=run.running.size,
    )
    return float(np.count_nonzero(run.running < need)) * interval_s

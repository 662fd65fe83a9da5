"""The routers' queue and the requests in service of one deployment, as a fluid (simulate.py
steps 2-4): arrivals wait as cohorts, are admitted first come, first served (or in random order)
while slots are free, take the calibrated service time at the concurrency they find (spread as
the routers' choice spreads it, admission.py; a request that waited finds its replica at the
limit), and leave in shares; every admitted share is a latency record, folded onto a fine grid
when a long saturation makes many."""

from __future__ import annotations

import itertools
import math
from collections import deque
from typing import Final

import numpy as np
import numpy.typing as npt

from .admission import admission_table
from .calibrate import Calibration
from .options import ModelOptions

F64 = npt.NDArray[np.float64]

PIPE: Final = 8
"""Shares a cohort is split into for its completions (NODES groups of NODES / PIPE)."""
MAX_COHORTS: Final = 32
"""Waiting cohorts kept per deployment under random-order admission (older ones are merged)."""
COMPACT_AT: Final = 1 << 16
"""Latency records held before they are folded onto a grid (a long saturation admits a share
of every waiting cohort each step, so up to MAX_COHORTS records a step)."""
FOLD_RES: Final = 0.002
"""The grid records are folded onto: waits and service times in steps of 0.2% (waits under
1 ms as 1 ms)."""


class FluidQueue:
    """The routers' queue and the requests in service of one deployment (see the header)."""

    def __init__(self, cal: Calibration, max_ongoing: int, nodes: F64, opts: ModelOptions) -> None:
        self.service = cal.service_s
        self.max_ongoing = max(1, max_ongoing)
        self.at_limit = [(self.service(float(self.max_ongoing)), 1.0)]
        self.mixes: dict[tuple[tuple[float, ...], ...], list[tuple[float, float]]] = {}
        self.max_queued = opts.max_queued
        self.dt = opts.interval_s
        self.timeout_steps = math.inf if opts.timeout_s is None else opts.timeout_s / self.dt
        self.pipe = nodes.reshape(PIPE, -1).mean(axis=1).tolist()  # coarser, for completions
        self.n_flight = self.queued = 0.0
        self.draining = 0.0  # of n_flight, on replicas stopped since: they hold no running slot
        self.running = 0
        self.cohorts: deque[list[float]] = deque()  # [arrival step, count], FIFO
        self.done_at: dict[int, float] = {}  # step -> requests completing then
        self.rejected = self.timed_out = 0.0
        self.admitted = self.admitted_c = self.admitted_wait = 0.0  # for the means at admission
        self.lat_wait: list[float] = []
        self.lat_s: list[float] = []
        self.lat_w: list[float] = []
        self.window = 0  # the p99 window the records above were admitted in
        self.p99: dict[int, float] = {}
        self.pool: list[tuple[F64, F64, F64]] = []  # closed windows' records, maybe folded
        self.pooled = 0
        self.random_order = opts.random_order
        self.saturated_use = cal.saturated_use

    def step(self, k: int, arrivals: float, running: int) -> None:
        done = self.done_at.pop(k, 0.0)
        if done:
            # a stopped replica's requests finish like the others (their share of each wave)
            off = done * self.draining / self.n_flight if self.n_flight > 0 else 0.0
            self.draining = max(0.0, self.draining - off)
            self.n_flight = max(0.0, self.n_flight - done)
            done -= off
        if running < self.running:  # a scale-down: the stopped replicas' share drains there
            self.draining += (self.n_flight - self.draining) * (1 - running / self.running)
        self.running = running
        if arrivals > 0:
            self.cohorts.append([k, arrivals])
            self._merge()
            self.queued += arrivals
            if self.queued > self.max_queued:  # the newest are refused
                over = self.queued - self.max_queued
                self.cohorts[-1][1] -= over
                self.queued -= over
                self.rejected += over
        full = running * self.max_ongoing
        busy = self.n_flight - self.draining
        free = full - busy
        if self.queued > free:  # saturated: the routers keep only a share of the slots busy
            free = full * self.saturated_use - busy
        if free > 0 and self.queued > 0:
            self._admit(k, free, running, done)
        while self.cohorts and k - self.cohorts[0][0] >= self.timeout_steps:
            self.timed_out += self.cohorts[0][1]
            self.queued = max(0.0, self.queued - self.cohorts.popleft()[1])

    def _admit(self, k: int, free: float, running: int, done: float) -> None:
        cohorts = self.cohorts
        if self.random_order and free < self.queued:
            # every waiter is as likely to win a freed slot, whatever its age (routers whose
            # waiters all wake on a finish and race, newcomers joining the race)
            frac = free / self.queued
            waits = [((k - h[0]) * self.dt, h[1] * frac) for h in cohorts]
            for h in cohorts:
                h[1] -= h[1] * frac
            admitted = free
        else:
            admitted = 0.0
            waits = []
            while cohorts and free > 1e-12:
                head = cohorts[0]
                take = min(head[1], free)
                waits.append(((k - head[0]) * self.dt, take))
                head[1] -= take
                free -= take
                admitted += take
                if head[1] <= 1e-12:
                    cohorts.popleft()
        self.queued = max(0.0, self.queued - admitted)
        # what the step's requests find on average: its completions and admissions interleave
        # (each a freed slot taken at once while requests wait), so in flight moves from its
        # value before the step to its value after it; taking every completion first would
        # admit a saturated queue at a concurrency it never sees. A request finds the others
        # admitted before it, half of the rest of the step's on average, not itself
        others = self.n_flight - self.draining + done / 2 + max(admitted - 1.0, 0.0) / 2
        table = admission_table(self.max_ongoing, max(running, 1))
        found, chances, c_new = table.spread(others / max(running, 1))
        mix = self.mixes.get((found, chances))
        if mix is None:  # (service time, chance) per concurrency found; few distinct per run
            mix = self.mixes[found, chances] = [
                (self.service(x), p) for x, p in zip(found, chances, strict=True)
            ]
        # a request that waited takes a slot the moment it frees, on a replica serving max - 1
        # others; one that came this step finds what the routers' choice finds
        limit, at_limit = float(self.max_ongoing), self.at_limit
        c_sum = 0.0
        for w, n in waits:
            self.admitted_wait += w * n
            for s_c, p in at_limit if w > 0 else mix:
                self.lat_wait.append(w)
                self.lat_s.append(s_c)
                self.lat_w.append(n * p)
            c_sum += (limit if w > 0 else c_new) * n
        c = c_sum / admitted if admitted > 0 else c_new
        s_now = self.service(c)  # the mean: S is linear in c
        self.n_flight += admitted
        self.admitted += admitted
        self.admitted_c += c_sum
        share = admitted / PIPE
        for q in self.pipe:  # each share leaves after its service time
            at = k + max(1, round(s_now * q / self.dt))
            self.done_at[at] = self.done_at.get(at, 0.0) + share

    def window_done(self, nodes: F64) -> None:
        """Close the current p99 window: its p99 from its own records, which then join the
        pool (where the window no longer matters, so they may be folded)."""
        if not self.lat_w:
            return
        mine = self._buffer()
        self.p99[self.window] = p99_of(mine, nodes)
        self.pool.append(mine)
        self.pooled += len(self.lat_w)
        self.lat_wait, self.lat_s, self.lat_w = [], [], []
        if self.pooled >= COMPACT_AT:
            self.pool = [fold(self.records())]
            self.pooled = self.pool[0][0].size

    def records(self) -> tuple[F64, F64, F64]:
        """Every admitted share so far: (wait s, service s, requests)."""
        wait, svc, wts = (np.concatenate(x) for x in zip(*self.pool, self._buffer(), strict=True))
        return wait, svc, wts

    def _buffer(self) -> tuple[F64, F64, F64]:
        return (np.asarray(self.lat_wait, dtype=np.float64), np.asarray(self.lat_s, dtype=np.float64),
                np.asarray(self.lat_w, dtype=np.float64))  # fmt: skip

    def _merge(self) -> None:
        """Keep at most MAX_COHORTS waiting cohorts: fold the adjacent pair holding the fewest
        requests into one at their mean arrival step (the cost per step stays bounded)."""
        cohorts = self.cohorts
        while len(cohorts) > MAX_COHORTS:
            sizes = [a[1] + b[1] for a, b in itertools.pairwise(cohorts)]
            i = sizes.index(min(sizes))
            a, b = cohorts[i], cohorts[i + 1]
            n = a[1] + b[1]
            a[0] = (a[0] * a[1] + b[0] * b[1]) / n if n > 0 else b[0]
            a[1] = n
            del cohorts[i + 1]


def p99_of(rec: tuple[F64, F64, F64], nodes: F64) -> float:
    """The p99 latency of some records (NaN: no request)."""
    x, y = latencies(rec, nodes)
    p99 = weighted_percentile(x, y, 99.0) if y.sum() > 0 else None
    return math.nan if p99 is None else p99


def weighted_percentile(values: F64, weights: F64, q: float) -> float | None:
    """The q-th percentile of sorted `values` each standing for `weights` requests (None:
    no request)."""
    if weights.size == 0:
        return None
    cum = np.cumsum(weights)
    i = int(np.searchsorted(cum, cum[-1] * q / 100.0, side="left"))
    return float(values[min(i, values.size - 1)])


def fold(rec: tuple[F64, F64, F64]) -> tuple[F64, F64, F64]:
    """Records folded onto a (wait, service) grid of `FOLD_RES` relative steps, each cell's
    weighted means kept: memory stays bounded however long requests wait, at a resolution far
    below the service-time spread."""
    wait, svc, wts = rec
    grid = np.stack(
        [np.rint(np.log(np.maximum(wait, 1e-3) / 1e-3) / FOLD_RES),
         np.rint(np.log(np.maximum(svc, 1e-9)) / FOLD_RES)], axis=1,
    ).astype(np.int64)  # fmt: skip
    uniq, inv = np.unique(grid, axis=0, return_inverse=True)
    inv = inv.ravel()
    mass = np.asarray(np.bincount(inv, weights=wts, minlength=len(uniq)), dtype=np.float64)
    safe = np.where(mass > 0, mass, 1.0)
    return (
        np.bincount(inv, weights=wts * wait, minlength=len(uniq)) / safe,
        np.bincount(inv, weights=wts * svc, minlength=len(uniq)) / safe,
        mass,
    )


def latencies(rec: tuple[F64, F64, F64], nodes: F64) -> tuple[F64, F64]:
    wait, svc, wts = rec
    if not wait.size:
        return np.empty(0), np.empty(0)
    w = wait[:, None] + svc[:, None] * nodes[None, :]
    c = np.repeat(wts / nodes.size, nodes.size)
    flat = w.ravel()
    order = np.argsort(flat, kind="stable")
    return flat[order], c[order]

"""What a new request finds on the replica the router picks: the concurrency it is served at.

How it works. Routers pick two distinct replicas at random among those not full and send to
the less busy (services/router/choice.py). With m requests in flight per replica on average,
a new request finds c, itself included, on the one picked: not m + 1, since the second pick
often finds an emptier replica, and not what replicas balanced to within one request would
give either, since requests leave at random and leave some replicas emptier than others (at
about one request per replica the balanced rule says 2.0 where a simulation of the router
finds 1.7). Nor is c the same for every request: it is 1, 2, ... with the chances of finding
0, 1, ... others, and the latency percentiles are those of the mixture (a live p50 of 0.30 s is
the requests that found one other, not the mean concurrency's 0.28 s). `admission_table`
solves the equilibrium of that process once per (limit, replicas), over loads from idle to
three times the slots, as the distribution of what an admitted request finds:

- few replicas (at most `EXACT_STATES` occupancy states): exactly, as a Markov chain over the
  sorted requests per replica, each request leaving on its own;
- more: the mean-field limit (the supermarket model of the power of two choices), with s_i the
  share of replicas serving at least i and q_k the chance that both picks serve at least k:
  the flow up across level i (arrivals at rate rho per replica on a pick serving i - 1) equals
  the flow down (one of the i leaving), rho (q_{i-1} - q_i) = i (s_i - s_{i+1}), solved from
  the top level down and bisected on s_top until q_0 = 1.

Both take exponential service; against a simulation of the router with the example model's
(constant, growing with concurrency) service they agree within 0.03 request below two in flight
per replica and within 0.11 near the limit, where requests admitted from a queue take a freed
slot at the limit (the queue model counts those, fluid.py). Pure and cached.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]

LOADS: Final = 128
"""Loads per replica the equilibrium is solved at, up to three times the replica's limit."""
EXACT_STATES: Final = 400
"""Occupancy states up to which the chain is solved exactly (1-7 replicas of limit 4)."""
STEP: Final = 0.01
"""The lookup by m is to the nearest hundredth of a request per replica."""
SPREAD_MIN: Final = 1e-3
"""Chances below this are left out of a request's spread (the rest scaled up to 1)."""


@dataclass(frozen=True, slots=True, eq=False)
class AdmissionTable:
    """What an admitted request finds, by m (requests in flight per replica, on average)."""

    m: F64
    """Mean requests in flight per replica at each load solved (non-decreasing) ..."""
    found: F64
    """... and the chances (one row per load) that an admitted request finds 0, 1, ... others
    on the replica it goes to."""
    _memo: dict[int, tuple[tuple[float, ...], tuple[float, ...], float]] = field(
        default_factory=dict
    )

    def mean(self, m: float) -> float:
        """The mean concurrency found, itself included."""
        return self.spread(m)[2]

    def spread(self, m: float) -> tuple[tuple[float, ...], tuple[float, ...], float]:
        """(concurrencies found, itself included; their chances; their mean) at m, to the
        nearest `STEP` (memoised: the queue asks once per step)."""
        i = max(0, round(min(m, float(self.m[-1])) / STEP))
        hit = self._memo.get(i)
        if hit is None:
            row = self._row(i * STEP)
            keep = np.flatnonzero(row >= SPREAD_MIN)
            p = row[keep] / row[keep].sum()
            c = keep + 1.0
            hit = self._memo[i] = (tuple(c.tolist()), tuple(p.tolist()), float(c @ p))
        return hit

    def _row(self, m: float) -> F64:
        j = int(np.searchsorted(self.m, m))
        if j <= 0:
            return np.asarray(self.found[0])
        if j >= self.m.size:
            return np.asarray(self.found[-1])
        lo, hi = float(self.m[j - 1]), float(self.m[j])
        w = (m - lo) / (hi - lo) if hi > lo else 1.0
        return np.asarray((1.0 - w) * self.found[j - 1] + w * self.found[j])


def joined(m: float, replicas: int, max_ongoing: int) -> float:
    """The mean requests a new request finds on its replica, itself included, when m others
    are in flight per replica."""
    return admission_table(max(1, max_ongoing), max(1, replicas)).mean(m)


@functools.cache
def admission_table(max_ongoing: int, replicas: int) -> AdmissionTable:
    """The equilibrium over loads from idle to three slots' worth per replica (the header);
    past `EXACT_STATES` one mean-field table serves every replica count of a limit."""
    if math.comb(max_ongoing + replicas, replicas) <= EXACT_STATES:
        return _table(max_ongoing, replicas)
    return _table(max_ongoing, 0)


@functools.cache
def _table(max_ongoing: int, replicas: int) -> AdmissionTable:
    """The exact chain for `replicas`, or (0) the mean field."""
    # denser at light load, where what is found changes most
    rho = 3.0 * max_ongoing * np.linspace(0.0, 1.0, LOADS + 1)[1:] ** 2
    if replicas:
        m, found = _exact(rho, max_ongoing, replicas)
    else:
        m, found = _mean_field(rho, max_ongoing)
    idle = np.zeros((1, max_ongoing))
    idle[0, 0] = 1.0
    found = np.clip(np.concatenate((idle, found)), 0.0, None)
    found /= found.sum(axis=1, keepdims=True)
    return AdmissionTable(np.maximum.accumulate(np.concatenate(([0.0], m))), found)


def _exact(rho: F64, top: int, replicas: int) -> tuple[F64, F64]:
    """The chain over sorted occupancies: arrivals at rate replicas x rho to the less busy of
    two distinct picks among the replicas not full (none when all are), each request leaving
    at rate 1; per load, the mean per replica and what an admitted arrival finds."""
    states = list(itertools.combinations_with_replacement(range(top + 1), replicas))
    index = {s: i for i, s in enumerate(states)}
    n = len(states)
    up = np.zeros((n, n))
    down = np.zeros((n, n))
    found = np.zeros((n, top))  # the chances an arrival finds 0, 1, ... on its replica
    for s in states:
        i = index[s]
        free = [j for j in range(replicas) if s[j] < top]
        for j, p in _pick(s, free).items():
            t = list(s)
            t[j] += 1
            up[i, index[tuple(sorted(t))]] += p
            found[i, s[j]] += p
        for j in range(replicas):
            if s[j]:
                t = list(s)
                t[j] -= 1
                down[i, index[tuple(sorted(t))]] += s[j]
    up -= np.diag(up.sum(axis=1))
    down -= np.diag(down.sum(axis=1))
    per_replica = np.asarray([sum(s) for s in states], dtype=np.float64) / replicas
    ms, dist = np.empty(rho.size), np.empty((rho.size, top))
    rhs = np.zeros(n)
    rhs[-1] = 1.0
    for k, r in enumerate(rho.tolist()):
        balance = ((replicas * r) * up + down).T
        balance[-1] = 1.0  # one balance equation is redundant: the probabilities sum to 1
        pi = np.linalg.solve(balance, rhs)
        ms[k] = pi @ per_replica
        admitted = pi @ found  # arrivals that find every replica full wait: not in here
        dist[k] = admitted / max(admitted.sum(), 1e-300)
    return ms, dist


def _pick(s: tuple[int, ...], free: list[int]) -> dict[int, float]:
    """Where an arrival goes from occupancy s: the less busy of two distinct free picks."""
    if len(free) <= 1:
        return {free[0]: 1.0} if free else {}
    p = 1.0 / (len(free) * (len(free) - 1))
    out: dict[int, float] = {}
    for a, b in itertools.permutations(free, 2):
        j = a if s[a] <= s[b] else b
        out[j] = out.get(j, 0.0) + p
    return out


def _mean_field(rho: F64, top: int) -> tuple[F64, F64]:
    """Per load, the mean per replica and what an arrival finds (q_k - q_{k+1})."""
    # above the busiest level it holds, s falls doubly exponentially (each level about the
    # square of the one below): bisect on log(-log s_top), solve in logs
    lo = np.full(rho.size, -40.0)
    hi = np.full(rho.size, 700.0)
    for _ in range(90):
        mid = (lo + hi) / 2
        log_q0, _, _ = _levels(rho, top, mid)
        high = log_q0 > 0.0  # s_top too large
        lo = np.where(high, mid, lo)
        hi = np.where(high, hi, mid)
    _, log_s, log_q = _levels(rho, top, (lo + hi) / 2)
    q = np.exp(log_q[:, : top + 1])  # q_0 = 1 ... q_top = 0: both picks serve at least k
    return np.exp(log_s[:, 1 : top + 1]).sum(axis=1), q[:, :-1] - q[:, 1:]


def _levels(rho: F64, top: int, u: F64) -> tuple[F64, F64, F64]:
    """From s_top = exp(-exp(u)) down, in logs: (log q_0, log s, log q)."""
    n = rho.size
    log_s = np.full((n, top + 2), -np.inf)  # s_{top + 1} = 0
    log_q = np.full((n, top + 2), -np.inf)  # q_top = 0: no pick lands on a full replica
    log_full = -np.exp(u)
    log_s[:, top] = log_full
    with np.errstate(divide="ignore", invalid="ignore"):
        log_free = np.log1p(-np.exp(log_full))
        for i in range(top - 1, -1, -1):
            # q_i = q_{i+1} + (i + 1) (s_{i+1} - s_{i+2}) / rho
            gap = log_s[:, i + 2] - log_s[:, i + 1]
            log_diff = np.where(gap < 0, log_s[:, i + 1] + np.log1p(-np.exp(gap)), -np.inf)
            log_q[:, i] = np.logaddexp(log_q[:, i + 1], np.log((i + 1) / rho) + log_diff)
            if i > 0:  # the picks are among the replicas not full
                log_s[:, i] = np.logaddexp(log_full, 0.5 * log_q[:, i] + log_free)
    return log_q[:, 0], log_s, log_q

"""The closed-loop model against what live routers and replicas do, one rule at a time: the
concurrency a request finds, and when routers report."""

from __future__ import annotations

import numpy as np
import pytest

from services.recorder.fluid import FluidQueue
from services.recorder.simulate import EARLY_REPORT_S, ModelOptions, _Reports
from tests.unit.test_closed_loop_effects import BURST, cal


def admitted_service(arrivals: list[float], running: int) -> list[float]:
    queue = FluidQueue(cal(BURST), 4, np.ones(64), ModelOptions())
    for k, a in enumerate(arrivals):
        queue.step(k, a, running)
    return queue.lat_s


def test_a_request_does_not_find_itself_among_the_others_on_its_replica() -> None:
    """Alone on an idle replica it is served at concurrency 1 (0.2 s); two arriving in one
    step on one replica find each other half the time (a 1.5 average: 0.25 s). Counting half
    of itself made every request at light load look 0.25 busier (live, A's recording: 2.21
    requests at admission, the model 2.45-2.64)."""
    assert admitted_service([1.0], 1) == [pytest.approx(0.2)]
    assert admitted_service([2.0], 1) == [pytest.approx(0.25)]
    assert admitted_service([1.0], 3) == [pytest.approx(0.2)]


def test_a_saturated_queue_is_still_admitted_at_the_limit() -> None:
    """A waiter takes a slot the moment it frees, on a replica serving max - 1 others."""
    s = admitted_service([8.0] + [0.0] * 40, 1)  # 8 waiting on one replica of 4 slots
    assert s[0] == pytest.approx(0.2 + 0.1 * 1.5)  # the first four admitted together
    assert s[1:] and all(x == pytest.approx(0.5) for x in s[1:])


def report_times(r: _Reports, loads: list[float], dt: float = 0.1) -> list[float]:
    out, last = [], r.last
    for k, load in enumerate(loads):
        now = (k + 1) * dt
        r.step(now, dt, load, False, 0.0)
        if r.last != last:
            out.append(round(now, 6))
            last = r.last
    return out


def test_reports_keep_the_recorded_cadence_on_the_step_grid() -> None:
    """A recorded cadence of 1.001 s on a 0.1 s step is a report every 10 steps, not 11 (the
    model's reports came 10% less often than the routers' did)."""
    times = report_times(_Reports(1.001, 0.0, EARLY_REPORT_S), [1.0] * 1000)
    assert len(times) == 100
    assert set(np.round(np.diff(times), 6).tolist()) == {1.0}


def test_reports_start_at_the_drawn_phase() -> None:
    times = report_times(_Reports(1.0, 0.3, EARLY_REPORT_S), [1.0] * 30)
    assert times == [0.3, 1.3, 2.3]


def test_an_early_report_comes_at_most_once_per_interval() -> None:
    """A load that keeps rising sharply costs one early report a second, as routers send."""
    loads = [3.0 * 2**k for k in range(20)]  # 0.1 s apart: a rise every step
    times = report_times(_Reports(10.0, 5.0, EARLY_REPORT_S), loads)
    assert times == [0.2, 1.2]  # held two steps, then once more a second later


def test_a_stopped_replica_s_requests_do_not_hold_the_running_replicas_slots() -> None:
    """Four replicas serve 12; three stop: their 9 finish where they are, and the one left,
    serving its 3, takes one of 4 waiters at once (counting all 12 against its 4 slots held
    every waiter until 8 had finished elsewhere)."""
    queue = FluidQueue(cal(BURST), 4, np.ones(64), ModelOptions())
    queue.step(0, 12.0, 4)
    assert queue.n_flight == pytest.approx(12.0) and queue.queued == 0.0
    queue.step(1, 4.0, 1)
    assert queue.draining == pytest.approx(9.0)
    assert queue.queued == pytest.approx(3.0)
    for k in range(2, 40):  # the drained requests finish; the left replica serves the rest
        queue.step(k, 0.0, 1)
    assert queue.draining == pytest.approx(0.0) and queue.queued == pytest.approx(0.0)
    assert queue.n_flight == pytest.approx(0.0)

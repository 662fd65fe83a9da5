"""Pure replica pieces: health counting, suppression rules, admission, window average."""

import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.replica.admission import Admission
from services.replica.health import HealthTracker, next_check_delay
from services.replica.suppression import HealthCarriage, Via
from services.replica.window import LevelAverage
from shared.freshness import freshness_window
from shared.wire.messages import HealthStatus


def hs(t: float, healthy: bool = True, failures: int | None = None) -> HealthStatus:
    return HealthStatus("r1", healthy, t, (0 if healthy else 1) if failures is None else failures)


# -- health ------------------------------------------------------------------------------------


def test_failures_count_up_and_a_success_resets() -> None:
    t = HealthTracker("r1")
    assert t.record(False, 10.0).consecutive_failures == 1
    assert t.record(False, 11.0).consecutive_failures == 2
    s = t.record(False, 12.0)
    assert (s.healthy, s.consecutive_failures) == (False, 3)
    s = t.record(True, 13.0)
    assert (s.healthy, s.consecutive_failures) == (True, 0)


@given(st.lists(st.tuples(st.booleans(), st.floats(0, 1e9)), min_size=1, max_size=50))
def test_checked_at_strictly_increases_even_if_the_wall_clock_steps_back(
    outcomes: list[tuple[bool, float]],
) -> None:
    t = HealthTracker("r1")
    stamps = [t.record(ok, wall).checked_at for ok, wall in outcomes]
    assert all(b > a for a, b in itertools.pairwise(stamps))


def test_jitter_stays_within_ten_percent() -> None:
    rng = random.Random(7)
    delays = [next_check_delay(10.0, rng) for _ in range(1000)]
    assert 9.0 <= min(delays) < 9.2 and 10.8 < max(delays) <= 11.0


# -- suppression -------------------------------------------------------------------------------


def test_freshness_window_is_one_and_a_half_periods_at_least_one_second() -> None:
    assert freshness_window(10) == 15
    assert freshness_window(0.2) == 1.0


def test_heartbeat_only_when_nothing_carried_health_within_the_window() -> None:
    c = HealthCarriage(15.0)
    assert not c.heartbeat_due(0.0)  # nothing checked yet: nothing to say
    c.on_check(hs(100.0))
    assert c.heartbeat_due(0.0)  # fail-open: never carried
    c.carried(hs(100.0), 0.0, Via.ADMISSION)  # an admission took it
    assert not c.heartbeat_due(14.9)
    assert c.heartbeat_due(15.0)  # traffic stopped: heartbeats resume on their own
    c.carried(hs(100.0), 20.0, Via.ADMISSION)  # traffic again: they stop
    assert not c.heartbeat_due(30.0)


def test_a_verdict_flip_goes_out_at_once() -> None:
    c = HealthCarriage(15.0)
    c.on_check(hs(100.0))
    c.carried(hs(100.0), 0.0, Via.ADMISSION)
    c.on_check(hs(110.0, healthy=False))
    assert c.heartbeat_due(1.0)
    c.carried(hs(110.0, healthy=False), 1.0, Via.HEARTBEAT)
    assert not c.heartbeat_due(2.0)
    c.on_check(hs(120.0, healthy=True))  # recovered: good news that nothing carried goes too
    assert c.heartbeat_due(3.0)
    c.carried(hs(120.0), 3.0, Via.ADMISSION)
    c.on_check(hs(130.0))  # still healthy and carried recently: suppressed
    assert not c.heartbeat_due(4.0)


def test_a_failed_check_goes_out_at_once_even_after_an_admission_carried_it() -> None:
    """Issue 14 item 4: suppression is for good news only. An admission takes a failure to a
    router, which tells the controller at its next report (up to a metrics interval later)."""
    c = HealthCarriage(15.0)
    c.on_check(hs(100.0))
    c.carried(hs(100.0), 0.0, Via.ADMISSION)
    for n, at in ((1, 110.0), (2, 120.0), (3, 130.0)):
        failed = hs(at, healthy=False, failures=n)
        c.on_check(failed)
        c.carried(failed, at - 100.0, Via.ADMISSION)  # traffic flows and carries it
        assert c.heartbeat_due(at - 100.0), n  # ... but only as far as a router
        c.carried(failed, at - 100.0, Via.HEARTBEAT)
        assert not c.heartbeat_due(at - 100.0)  # sent once per failed check
    c.on_check(hs(140.0, healthy=False, failures=4))
    c.carried(hs(140.0, healthy=False, failures=4), 40.0, Via.HOST)  # direct: in a report now
    assert not c.heartbeat_due(40.0)


def test_frames_only_for_news_that_no_other_channel_carried() -> None:
    c = HealthCarriage(15.0)
    c.on_check(hs(100.0))
    c.carried(hs(100.0), 0.0, Via.ADMISSION)  # admission of the held request carried it
    assert c.frame_due(100.0, 15.0) is None  # nothing newer
    c.on_check(hs(110.0))
    assert c.frame_due(100.0, 15.0) == hs(110.0)  # newer check, uncarried: frame
    c.carried(hs(110.0), 15.0, Via.FRAME)  # ... the first held request sent it
    assert c.frame_due(100.0, 15.0) is None  # a second held request stays quiet
    c.on_check(hs(120.0))
    c.carried(hs(120.0), 20.0, Via.ADMISSION)  # a new admission carried the next one first
    assert c.frame_due(110.0, 20.0) is None  # frames stop the moment health rides elsewhere


@pytest.mark.parametrize("via", [Via.HOST, Via.ADMISSION, Via.REPORT])
def test_no_frame_while_a_riding_channel_carried_health_within_the_window(via: Via) -> None:
    """Issue 14 item 3: the in-process router consumed the host's health 0.3 s ago (0.2 s
    period, 1 s window); the check that just ran is news to nobody yet, but health rides."""
    c = HealthCarriage(1.0)
    c.on_check(hs(100.0))
    c.carried(hs(100.0), 0.0, Via.ADMISSION)
    for k in range(1, 20):
        now = 0.2 * k
        c.on_check(hs(100.0 + now))
        assert c.frame_due(100.0, now) is None, now
        if k % 3 == 0:
            c.carried(hs(100.0 + now), now, via)
    c.on_check(hs(105.0))
    assert c.frame_due(100.0, 4.7) == hs(105.0)  # the channel went quiet: frames resume


def test_frames_take_over_before_a_heartbeat_is_due() -> None:
    """The shell ticks frames before heartbeats: at the end of the window the frame carries."""
    c = HealthCarriage(1.0)
    c.on_check(hs(100.0))
    c.carried(hs(100.0), 0.0, Via.ADMISSION)
    c.on_check(hs(100.2))
    frame = c.frame_due(100.0, 1.0)
    assert frame == hs(100.2)
    c.carried(frame, 1.0, Via.FRAME)
    assert not c.heartbeat_due(1.0)


def test_self_reporting_replica_never_needs_frames() -> None:
    c = HealthCarriage(15.0, reports_carry_health=True)
    c.on_check(hs(100.0))
    assert c.frame_due(0.0, 100.0) is None


def test_out_of_order_checks_do_not_regress_latest() -> None:
    c = HealthCarriage(15.0)
    c.on_check(hs(110.0))
    c.on_check(hs(100.0, healthy=False))
    assert c.latest == hs(110.0)


# -- admission ---------------------------------------------------------------------------------


def test_admission_bounds_ongoing_and_refuses_while_draining() -> None:
    a = Admission(2)
    assert a.try_admit() and a.try_admit()
    assert not a.try_admit()
    a.release()
    assert a.try_admit()
    a.draining = True
    a.release()
    assert not a.try_admit()
    with pytest.raises(ValueError):
        Admission(0)
    b = Admission(1)
    with pytest.raises(RuntimeError):
        b.release()


# -- window ------------------------------------------------------------------------------------


def test_level_average_is_time_weighted() -> None:
    w = LevelAverage(now=0.0)
    w.set(4.0, now=0.0)
    w.set(0.0, now=2.5)  # 4 for 2.5 s, then 0 for 7.5 s
    assert w.take(now=10.0) == pytest.approx(1.0)
    assert w.take(now=20.0) == 0.0
    w.set(3.0, now=20.0)
    assert w.take(now=20.0) == 3.0  # zero-length window: the current level

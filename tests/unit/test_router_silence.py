"""The router's liveness decisions, pure (services/router/silence.py): when a silent reader probes
and what a probe reply says. A fake clock is a float; no bus, no sockets."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from services.router.silence import (
    ALIVE,
    ASK_FIRST,
    ASK_MAX_GAP,
    GONE,
    INTERRUPTED_PROBES,
    After,
    SilentRead,
    Step,
    probe_reply,
)
from shared.probes import NOT_HELD
from shared.wire import reasons
from shared.wire.codec import encode
from shared.wire.messages import End, ErrorReply, HealthStatus

DEADLINE = 100.0


def _read(seen: int = 0, interruptions: int = 0) -> SilentRead:
    return SilentRead(deadline=DEADLINE, seen=seen, interruptions_seen=interruptions)


def test_a_silent_replica_is_probed_and_one_heard_elsewhere_is_not() -> None:
    s = _read(seen=5)
    assert s.timed_out(1.0, mark=5) is Step.PROBE  # nothing heard from it at all
    assert s.answered(False, 5, 0) is After.READ_ON
    assert s.timed_out(2.0, mark=6) is Step.SPOKE  # it spoke on another request: no probe
    assert s.answered(False, 6, 0) is After.READ_ON
    assert s.timed_out(3.0, mark=6) is Step.ASK  # ASK_FIRST silent intervals


def test_the_mark_after_the_probe_is_the_next_baseline() -> None:
    s = _read(seen=0)
    assert s.timed_out(1.0, mark=0) is Step.PROBE
    s.answered(False, 1, 0)  # the probe's own answer counted one
    assert s.timed_out(2.0, mark=1) is Step.PROBE  # no change since: probe again


def test_asks_come_at_3_6_12_24_then_at_most_30_intervals_apart() -> None:
    s = _read()
    asks = []
    for i in range(1, 200):
        step = s.timed_out(float(i) * 0.1, mark=0)
        if step is Step.ASK:
            asks.append(i)
        s.answered(False, 0, 0)
    assert asks[:6] == [ASK_FIRST, 6, 12, 24, 48, 78]
    assert all(b - a <= ASK_MAX_GAP for a, b in itertools.pairwise(asks))


def test_the_deadline_ends_the_wait_without_counting_a_silent_interval() -> None:
    s = _read()
    assert s.timed_out(DEADLINE, mark=0) is Step.DEADLINE
    assert s.silent == 0
    assert s.timed_out(DEADLINE - 1, mark=0) is Step.PROBE


def test_a_probe_that_finds_it_gone_ends_the_wait() -> None:
    s = _read()
    assert s.timed_out(1.0, mark=0) is Step.PROBE
    assert s.answered(True, 0, 0) is After.GONE


def test_answered_probes_after_our_connection_dropped_take_the_reply_for_lost() -> None:
    s = _read(interruptions=1)
    for _ in range(INTERRUPTED_PROBES - 1):
        s.timed_out(1.0, mark=0)
        assert s.answered(False, 0, 2) is After.READ_ON
    s.timed_out(1.0, mark=0)
    assert s.answered(False, 0, 2) is After.INTERRUPTED


def test_answered_probes_without_an_interruption_read_on_for_ever() -> None:
    s = _read(interruptions=2)
    for i in range(50):
        s.timed_out(float(i), mark=0)
        assert s.answered(False, 0, 2) is After.READ_ON


@given(st.lists(st.tuples(st.integers(0, 3), st.booleans()), max_size=60))
def test_only_an_ask_or_a_probe_can_find_it_gone(looks: list[tuple[int, bool]]) -> None:
    """Whatever the marks, a step is PROBE exactly when the mark did not move, and SPOKE never
    sends a probe (the shell passes lost=False), so it never ends the request."""
    s = _read()
    for mark, _ in looks:
        before = s.seen
        step = s.timed_out(1.0, mark)
        if step is not Step.ASK:
            assert (step is Step.PROBE) == (mark == before)
        assert s.answered(False, mark, 0) is After.READ_ON


def _health() -> HealthStatus:
    return HealthStatus("r1", True, 1.0, 0)


def test_a_health_answer_is_alive_and_folded() -> None:
    v = probe_reply(encode(_health()), None)
    assert not v.gone and v.health == _health() and v.bad is None
    assert probe_reply(encode(_health()), "req-1").health == _health()


def test_not_held_means_gone_only_when_a_request_was_named() -> None:
    data = encode(ErrorReply(NOT_HELD, "no", True))
    assert probe_reply(data, "req-1") is GONE
    assert probe_reply(data, None) is ALIVE


def test_another_error_or_kind_is_bad_input_and_alive() -> None:
    other = probe_reply(encode(ErrorReply("boom", "no", True)), "req-1")
    assert not other.gone and other.bad is not None
    assert other.bad.reason == reasons.UNEXPECTED_KIND
    end = probe_reply(encode(End()), None)
    assert not end.gone and end.bad is not None and end.health is None


def test_garbage_is_bad_input_and_alive() -> None:
    v = probe_reply(b"\x00not msgpack", "req-1")
    assert not v.gone and v.bad is not None and v.health is None

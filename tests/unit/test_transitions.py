"""shared.transitions: a machine steps through its table, refuses the rest, and the shell's
refusal log counts every refusal and logs it rate-limited."""

from __future__ import annotations

import enum
import logging

import pytest

from shared.clock import FakeClock
from shared.transitions import Machine, RefusalLog, Refused


class St(enum.Enum):
    A = "a"
    B = "b"


class Ev(enum.Enum):
    GO = "go"
    BACK = "back"


M = Machine("m", tuple(St), tuple(Ev), St.A, {(St.A, Ev.GO): St.B, (St.B, Ev.BACK): St.A})


def test_a_pair_in_the_table_moves_and_any_other_is_refused_with_the_state_kept() -> None:
    assert M.step(St.A, Ev.GO) == (St.B, None)
    assert M.step(St.B, Ev.BACK) == (St.A, None)
    assert M.step(St.A, Ev.BACK) == (St.A, Refused("m", "a", "back"))
    assert M.step(St.B, Ev.GO) == (St.B, Refused("m", "b", "go"))
    assert str(Refused("m", "b", "go")) == "m: go refused in state b"


def test_a_table_naming_an_undeclared_state_or_event_fails_when_built() -> None:
    with pytest.raises(ValueError, match="not declared"):
        Machine("m", (St.A,), tuple(Ev), St.A, {(St.A, Ev.GO): St.B})
    with pytest.raises(ValueError, match="not declared"):
        Machine("m", tuple(St), (Ev.GO,), St.A, {(St.B, Ev.BACK): St.A})
    with pytest.raises(ValueError, match="initial"):
        Machine("m", (St.A,), tuple(Ev), St.B, {})


def test_every_refusal_is_counted_and_logged_at_most_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    counted: list[Refused] = []
    log = RefusalLog("svc", logging.getLogger("t"), counted.append, clock=clock, interval_s=10.0)
    r, other = Refused("m", "a", "back"), Refused("m", "b", "go")
    with caplog.at_level(logging.WARNING, logger="t"):
        for _ in range(3):
            log.refused(r, "x=1")
        log.refused(other)
        clock.advance(10.0)
        log.refused(r)
    assert counted == [r, r, r, other, r]
    lines = [rec.getMessage() for rec in caplog.records]
    assert lines == [
        "svc: m: back refused in state a x=1",
        "svc: m: go refused in state b ",
        "svc: m: back refused in state a  (2 more since last report)",
    ]

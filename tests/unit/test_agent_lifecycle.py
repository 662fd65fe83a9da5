"""A replica process as the agent sees it (services/agent/core.py CHILD_LIFECYCLE): every legal
transition of the table, the illegal ones refused (child unchanged) and counted by the shell, and
sequences of events that never leave the declared phases."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from services.agent.config import AgentConfig
from services.agent.core import (
    CHILD_LIFECYCLE,
    CHILD_TABLE,
    ChildEvent,
    ChildState,
    Phase,
    advance,
)
from services.agent.service import AgentService
from shared.bus import Msg
from shared.fakebus import FakeServer
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.transitions import Refused
from shared.wire import decode_as
from shared.wire.messages import Lifecycle

from .test_agent_core import target

BUILD = {
    Phase.RUNNING: lambda c: c,
    Phase.STOPPING: lambda c: c.stopping(10.0),
    Phase.KILLED: lambda c: c.stopping(10.0).killed(),
    Phase.EXITED: lambda c: c.exited_with(0),
}


def child_in(phase: Phase) -> ChildState:
    child: ChildState = BUILD[phase](ChildState(target("r1")))
    assert child.phase is phase
    return child


@pytest.mark.parametrize(("phase", "event"), sorted(CHILD_TABLE, key=str), ids=str)
def test_every_legal_transition_of_the_table(phase: Phase, event: ChildEvent) -> None:
    child, refused = advance(child_in(phase), event, deadline=42.0, code=-9)
    assert refused is None and child.phase is CHILD_TABLE[(phase, event)]
    assert child.exited == (child.phase is Phase.EXITED)
    if event is ChildEvent.STOP:
        assert child.stop_deadline == 42.0
    if event is ChildEvent.REAPED:
        assert child.exit_code == -9


ILLEGAL = [p for p in itertools.product(Phase, ChildEvent) if p not in CHILD_TABLE]


@pytest.mark.parametrize(("phase", "event"), ILLEGAL, ids=str)
def test_an_illegal_event_is_refused_and_the_child_kept(phase: Phase, event: ChildEvent) -> None:
    before = child_in(phase)
    child, refused = advance(before, event, deadline=99.0, code=3)
    assert child is before
    assert refused == Refused("agent_child", phase.value, event.value)


def test_the_table_is_total_or_explicitly_refuses() -> None:
    assert set(ILLEGAL) == {
        (Phase.STOPPING, ChildEvent.STOP),
        (Phase.KILLED, ChildEvent.STOP),
        (Phase.KILLED, ChildEvent.KILL),
        (Phase.EXITED, ChildEvent.STOP),
        (Phase.EXITED, ChildEvent.KILL),
        (Phase.EXITED, ChildEvent.REAPED),
    }
    assert CHILD_LIFECYCLE.initial is Phase.RUNNING == ChildState(target("r1")).phase


@given(st.lists(st.tuples(st.sampled_from(ChildEvent), st.integers(-15, 3)), max_size=10))
def test_any_sequence_of_events_stays_in_declared_phases(
    events: list[tuple[ChildEvent, int]],
) -> None:
    child = ChildState(target("r1"))
    for event, code in events:
        before = child
        child, refused = advance(child, event, deadline=float(code), code=code)
        assert child.phase in CHILD_LIFECYCLE.states
        assert child.exited == (child.phase is Phase.EXITED)
        if (before.phase, event) in CHILD_TABLE:
            assert refused is None and child.phase is CHILD_TABLE[(before.phase, event)]
        else:
            assert child is before and refused is not None
    # an exit code, once set, is never overwritten (a second reap is refused)
    if child.exited:
        assert child.exit_code == next(c for e, c in events if e is ChildEvent.REAPED)


def refused_count(state: str, event: str) -> float:
    labels = {"machine": "agent_child", "state": state, "event": event}
    return REGISTRY.get_sample_value("fleetpulse_agent_transitions_refused_total", labels) or 0.0


async def test_the_shell_reports_one_exit_and_counts_a_second_reap(tmp_path: Path) -> None:
    server = FakeServer()
    bus, watcher = server.connect(), server.connect()
    exits: list[Any] = []

    async def on_life(msg: Msg) -> None:
        exits.append(decode_as(msg.data, Lifecycle))

    await watcher.subscribe(S.report("lifecycle", "app", "dep"), on_life)
    svc = AgentService(
        AgentConfig(nats_url="nats://unused", agent_id="me", log_dir=str(tmp_path)), bus=bus
    )
    svc._children["r1"] = ChildState(target("r1"))
    before = refused_count("exited", "reaped")
    await svc._on_exit("r1", 0)
    await svc._on_exit("r1", -9)  # reaped twice: refused, nothing reported
    await bus.flush()
    await watcher.flush()
    assert [(e.state, e.exit_code) for e in exits] == [("exited", 0)]
    assert svc._children["r1"].exit_code == 0
    assert refused_count("exited", "reaped") == before + 1
    await bus.close()
    await watcher.close()

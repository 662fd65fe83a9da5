"""The replica process's own lifecycle (services/replica/lifecycle.py): every legal step of the
table, the illegal ones refused (state kept, nothing announced) and counted by the runtime, and
sequences of steps that never leave the declared states."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from services.replica.lifecycle import (
    PROCESS_LIFECYCLE,
    PROCESS_TABLE,
    Fresh,
    ProcessState,
    Step,
)
from shared.bus import Msg
from shared.fakebus import FakeServer
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.transitions import Refused
from shared.wire import decode_as
from shared.wire.messages import Lifecycle, LifecycleState

from .test_replica_runtime import make_replica

STATES: tuple[ProcessState, ...] = PROCESS_LIFECYCLE.states


@pytest.mark.parametrize(("state", "step"), list(PROCESS_TABLE), ids=str)
def test_every_legal_step_of_the_table(state: ProcessState, step: Step) -> None:
    after, refused = PROCESS_LIFECYCLE.step(state, step)
    assert refused is None and after is PROCESS_TABLE[(state, step)]
    assert isinstance(after, LifecycleState)  # every state entered is one the bus hears of


ILLEGAL = [p for p in itertools.product(STATES, Step) if p not in PROCESS_TABLE]


@pytest.mark.parametrize(("state", "step"), ILLEGAL, ids=str)
def test_an_illegal_step_is_refused_and_the_state_kept(state: ProcessState, step: Step) -> None:
    assert PROCESS_LIFECYCLE.step(state, step) == (
        state,
        Refused("replica_process", str(state.value), step.value),
    )


def test_the_table_is_total_or_explicitly_refuses() -> None:
    assert len(PROCESS_TABLE) + len(ILLEGAL) == len(STATES) * len(Step)
    assert {s for s, _ in ILLEGAL if s is LifecycleState.EXITED} == {LifecycleState.EXITED}
    assert all((LifecycleState.EXITED, step) in ILLEGAL for step in Step)  # the end
    assert (LifecycleState.DRAINING, Step.READY) in ILLEGAL  # "ready" never follows "draining"
    assert PROCESS_LIFECYCLE.initial is Fresh.NEW


@given(st.lists(st.sampled_from(Step), max_size=12))
def test_any_sequence_of_steps_stays_in_declared_states(steps: list[Step]) -> None:
    state: ProcessState = PROCESS_LIFECYCLE.initial
    announced: list[ProcessState] = []
    for step in steps:
        before = state
        state, refused = PROCESS_LIFECYCLE.step(state, step)
        assert state in STATES
        assert (refused is None) == ((before, step) in PROCESS_TABLE)
        if refused is None:
            announced.append(state)
        else:
            assert state is before
    # what goes on the bus is a path through the contract's order, each state at most once
    order = list(LifecycleState)
    assert announced == sorted(set(announced), key=order.index)


def refused_count(state: str, step: str) -> float:
    labels = {"machine": "replica_process", "state": state, "event": step}
    return REGISTRY.get_sample_value("fleetpulse_replica_transitions_refused_total", labels) or 0.0


@pytest.fixture
async def buses() -> Any:
    server = FakeServer()
    a, b = server.connect(), server.connect()
    yield a, b
    await a.close()
    await b.close()


async def test_the_runtime_announces_each_state_once_and_counts_what_it_refuses(
    buses: Any,
) -> None:
    rbus, cbus = buses
    states: list[str] = []

    async def on_life(msg: Msg) -> None:
        states.append(decode_as(msg.data, Lifecycle).state)

    await cbus.subscribe(S.report("lifecycle", "app", "dep", "r1"), on_life)
    rt = await make_replica(rbus)
    starts = refused_count("ready", "start")
    stops, drains = refused_count("exited", "stop"), refused_count("exited", "drain")
    await rt.start()  # a second start: refused, nothing subscribes twice
    await rt.drain()
    await rt.stop()  # after the drain's own stop
    await rt.drain()
    await cbus.flush()
    assert states == ["starting", "ready", "draining", "exited"]
    assert rt.state is LifecycleState.EXITED
    assert refused_count("ready", "start") == starts + 1
    assert refused_count("exited", "stop") == stops + 1
    assert refused_count("exited", "drain") == drains + 1

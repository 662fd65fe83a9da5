"""A replica record's lifecycle (services/controller/lifecycle.py) through DeploymentState: every
legal transition of the table, the illegal ones refused (state kept) and counted, and sequences
of events that never leave the declared states."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from services.controller.actions import Event
from services.controller.deployment_state import (
    STARTUP_TIMEOUT_S,
    TRANSITION_REFUSED,
    DeploymentState,
    ReplicaState,
    StateEvent,
)
from services.controller.lifecycle import REPLICA_LIFECYCLE, REPLICA_TABLE, Decision
from services.controller.lifecycle import Event as LifeEvent
from services.controller.metrics import Exporter
from shared.transitions import Refused
from shared.wire.messages import LifecycleState

from .test_controller_core import Sim, app_with

T0 = 10.0
LIVE = (ReplicaState.PENDING, ReplicaState.STARTING, ReplicaState.RUNNING, ReplicaState.DRAINING)
EVENTS: tuple[LifeEvent, ...] = (*LifecycleState, *Decision)


def record_in(state: ReplicaState, *, placing: bool = False) -> tuple[DeploymentState, str]:
    """A deployment with one replica brought to `state` by the paths the controller takes."""
    d = DeploymentState("app", "dep", "v1", id_prefix="dep-x", placing=placing)
    d.target = 1
    d.reconcile(T0)
    (rid,) = d.replicas
    if state is not ReplicaState.PENDING:
        d.on_lifecycle(rid, "starting", T0)
    if state in (ReplicaState.RUNNING, ReplicaState.DRAINING):
        d.on_lifecycle(rid, "ready", T0)
    if state is ReplicaState.DRAINING:
        d.target = 0
        d.reconcile(T0)  # scale down: it drains
    assert d.replicas[rid].state is state
    return d, rid


def deliver(d: DeploymentState, rid: str, event: LifeEvent, now: float) -> list[StateEvent]:
    """`event` through the public entry point that makes it."""
    if isinstance(event, LifecycleState):
        return d.on_lifecycle(rid, event.value, now)
    if event is Decision.DRAIN:
        return d.verdict(rid, "failures", now)
    if event is Decision.DROP:  # no longer wanted, never placed
        d.target = 0
        return d.reconcile(now)
    if event is Decision.START_TIMEOUT:
        return d.reconcile(now + STARTUP_TIMEOUT_S)
    return d.lost_with_agent(rid, "agent a1 lost")


def refusals(events: list[StateEvent]) -> list[Refused]:
    return [e.refused for e in events if e.kind == TRANSITION_REFUSED and e.refused is not None]


LEGAL = sorted(
    ((s, e) for (s, e) in REPLICA_TABLE if s is not ReplicaState.GONE),
    key=lambda p: (p[0].value, str(p[1].value)),
)


@pytest.mark.parametrize(("state", "event"), LEGAL, ids=lambda x: str(x.value))
def test_every_legal_transition_of_the_table(state: ReplicaState, event: LifeEvent) -> None:
    d, rid = record_in(state, placing=event is Decision.DROP)
    events = deliver(d, rid, event, T0 + 1.0)
    assert refusals(events) == []
    after = REPLICA_TABLE[(state, event)]
    if after is ReplicaState.GONE:
        assert rid not in d.replicas
    else:
        assert d.replicas[rid].state is after
        # a move restarts the state's clock; a legal no-op keeps the record untouched
        assert d.replicas[rid].since == (T0 if after is state else T0 + 1.0)


ILLEGAL_MESSAGES = [
    (s, e) for s, e in itertools.product(LIVE, LifecycleState) if (s, e) not in REPLICA_TABLE
]


def test_the_illegal_messages_are_what_the_header_says() -> None:
    assert ILLEGAL_MESSAGES == [(ReplicaState.RUNNING, LifecycleState.STARTING)]


@pytest.mark.parametrize(("state", "event"), ILLEGAL_MESSAGES, ids=lambda x: str(x.value))
def test_an_illegal_message_is_refused_and_leaves_the_record_as_it_was(
    state: ReplicaState, event: LifecycleState
) -> None:
    d, rid = record_in(state)
    since, revision = d.replicas[rid].since, d.revision
    events = d.on_lifecycle(rid, event.value, T0 + 5.0)
    assert refusals(events) == [Refused("controller_replica", state.value, event.value)]
    assert events[0].replica_id == rid
    assert d.replicas[rid].state is state and d.replicas[rid].since == since
    assert d.revision == revision  # nothing about the record changed


def test_a_state_no_message_names_is_refused_not_a_crash() -> None:
    d, rid = record_in(ReplicaState.STARTING)
    events = d.on_lifecycle(rid, "paused", T0 + 1.0)
    assert refusals(events) == [Refused("controller_replica", "STARTING", "invalid")]
    assert d.replicas[rid].state is ReplicaState.STARTING


def test_the_table_is_total_or_explicitly_refuses() -> None:
    for state, event in itertools.product(REPLICA_LIFECYCLE.states, REPLICA_LIFECYCLE.events):
        after, refused = REPLICA_LIFECYCLE.step(state, event)
        if (state, event) in REPLICA_TABLE:
            assert (after, refused) == (REPLICA_TABLE[(state, event)], None)
        else:
            assert after is state
            assert refused == Refused("controller_replica", state.value, str(event.value))
    # GONE is the end: nothing leaves it
    assert not any(s is ReplicaState.GONE for s, _ in REPLICA_TABLE)


def refused_count(state: str, event: str) -> float:
    labels = {"machine": "controller_replica", "state": state, "event": event}
    return (
        REGISTRY.get_sample_value("fleetpulse_controller_transitions_refused_total", labels) or 0.0
    )


def test_a_refused_transition_reaches_the_shell_as_an_event_it_counts() -> None:
    sim = Sim(app_with(num_replicas=1))
    sim.tick()
    sim.start_all()
    (rid,) = sim.membership
    sim.actions.clear()
    sim.lifecycle(rid, "starting")  # late: the agent's "starting" after the replica's "ready"
    sim.tick()
    refused = [a for a in sim.actions if isinstance(a, Event) and a.refused is not None]
    assert [(a.kind, a.replica_id, a.refused) for a in refused] == [
        (TRANSITION_REFUSED, rid, Refused("controller_replica", "RUNNING", "starting"))
    ]
    assert sim.membership == [rid]  # still serving
    before = refused_count("RUNNING", "starting")
    Exporter.event(refused[0])
    assert refused_count("RUNNING", "starting") == before + 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(EVENTS), max_size=12), st.booleans())
def test_any_sequence_of_events_stays_in_declared_states(
    events: list[LifeEvent], placing: bool
) -> None:
    d, rid = record_in(ReplicaState.PENDING, placing=placing)
    now = T0
    for event in events:
        now += 1.0
        rec = d.replicas.get(rid)
        before = rec.state if rec is not None else ReplicaState.GONE
        out = deliver(d, rid, event, now)
        rec = d.replicas.get(rid)
        after = rec.state if rec is not None else ReplicaState.GONE
        assert after in REPLICA_LIFECYCLE.states and (rec is None or after in LIVE)
        if isinstance(event, LifecycleState):
            # a message moves the record exactly as the table says; a pair it lacks is refused
            # (and counted) with the record as it was; a removed record stays removed
            assert after is REPLICA_TABLE.get((before, event), before)
            illegal = before is not ReplicaState.GONE and (before, event) not in REPLICA_TABLE
            expected = [Refused("controller_replica", before.value, event.value)] if illegal else []
            assert refusals(out) == expected
        else:  # the controller's own decisions are always legal where it takes them
            assert refusals(out) == []

"""The inputs a controller tick acts on at once (core.tick_now): the wake from zero waits for
the decision a request queued at zero replicas asks for, and held requests wait for the member
value a replica's "ready" makes. Everything else waits for the regular tick."""

from __future__ import annotations

from tests.unit.test_controller_core import FAST, Sim, app_with


def test_a_request_queued_at_zero_asks_for_a_tick_at_once_and_is_taken_once() -> None:
    sim = Sim(app_with(FAST))
    sim.tick()
    assert not sim.core.take_tick_now()
    sim.handle_report(queued=0.0)  # an idle router at zero: nothing to decide now
    assert not sim.core.take_tick_now()
    sim.handle_report(queued=1.0)
    assert sim.core.take_tick_now()
    assert not sim.core.take_tick_now()  # taken: the flag is down again
    sim.tick()
    assert len(sim.target_ids()) == 1


def test_load_above_zero_waits_for_the_regular_tick() -> None:
    sim = Sim(app_with(FAST))
    sim.tick()
    sim.handle_report(queued=1.0)
    sim.tick()
    sim.core.take_tick_now()
    sim.handle_report(queued=5.0)  # target 1 already: the upscale delay decides, not the tick
    assert not sim.core.take_tick_now()


def test_a_lifecycle_message_asks_for_a_tick_at_once() -> None:
    sim = Sim(app_with(FAST))
    sim.tick()
    sim.handle_report(queued=1.0)
    sim.tick()
    sim.core.take_tick_now()
    (rid,) = sim.target_ids()
    sim.lifecycle(rid, "ready")
    assert sim.core.take_tick_now()
    sim.tick()
    assert sim.membership == [rid]

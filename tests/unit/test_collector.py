"""The collector policy: survivors of a full collection are frozen between ticks."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from services.controller.collector import Collector


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector(unfreeze_every_s=100.0, manual=False)
    yield c
    c.close()
    gc.unfreeze()


def test_settle_collects_then_freezes(collector: Collector) -> None:
    gc.unfreeze()
    collector.settle(0.0)
    assert gc.get_freeze_count() > 0 and collector.freezes == 1


def test_a_full_collection_is_followed_by_a_freeze_between_ticks(collector: Collector) -> None:
    gc.unfreeze()
    collector.between_ticks(1.0)
    assert collector.freezes == 0  # nothing ran: nothing to do
    gc.collect(2)  # as if the interpreter had run one on its own
    assert collector.full_collections == 1
    collector.between_ticks(2.0)
    assert collector.freezes == 1 and gc.get_freeze_count() > 0
    collector.between_ticks(3.0)
    assert collector.freezes == 1  # once per full collection


def test_unfreezes_and_settles_again_after_its_period(collector: Collector) -> None:
    collector.settle(0.0)
    collector.between_ticks(99.0)
    assert collector.freezes == 1
    collector.between_ticks(100.0)
    assert collector.freezes == 2


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_manual_runs_no_collection_inside_a_tick_and_catches_up_between_ticks() -> None:
    was = gc.isenabled()
    c = Collector(unfreeze_every_s=1e9)
    ran: list[int] = []

    def spy(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            ran.append(info["generation"])

    gc.callbacks.append(spy)
    try:
        assert not gc.isenabled()
        for _ in range(50 * gc.get_threshold()[0]):  # a tick allocating far past threshold 0
            _Cycle()
        assert ran == [] and c.due_generation() is not None
        for t in range(200):  # gaps between ticks: at most one collection each
            before = len(ran)
            c.between_ticks(float(t))
            assert len(ran) - before <= 1
            for _ in range(2 * gc.get_threshold()[0]):
                _Cycle()
        assert c.collections[0] > 0 and c.collections[1] > 0 and c.collections[2] > 0
        assert c.full_collections == c.collections[2] and c.freezes == c.collections[2]
    finally:
        gc.callbacks.remove(spy)
        c.close()
        gc.unfreeze()
    assert gc.isenabled() == was

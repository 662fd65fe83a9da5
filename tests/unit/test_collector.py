"""The collector policy: survivors of a full collection are frozen between ticks."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from services.controller.machinery.collector import Collector


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector(unfreeze_every_s=100.0)
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

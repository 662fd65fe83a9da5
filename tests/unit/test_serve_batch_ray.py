"""`@serve.batch` as Ray's batching guide uses it: shipped by value, resized by reconfigure,
measured by `batch_size_fn`."""

from __future__ import annotations

import asyncio
from typing import Any

import cloudpickle

from fleetpulse import serve


def make_model() -> type:
    class Model:  # defined in a function, so cloudpickle ships it by value (as a __main__ class)
        def __init__(self) -> None:
            self.sizes: list[int] = []

        @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.05)
        async def __call__(self, items: list[int]) -> list[int]:
            self.sizes.append(len(items))
            return [i * 2 for i in items]

        def reconfigure(self, config: dict[str, Any]) -> None:
            self.__call__.set_max_batch_size(config["max_batch_size"])
            self.__call__.set_batch_wait_timeout_s(config["batch_wait_timeout_s"])

    return Model


async def test_a_batched_class_ships_by_value_after_use_and_batches_there() -> None:
    cls = make_model()
    used = cls()
    assert await asyncio.gather(*(used(i) for i in range(3))) == [0, 2, 4]  # queues exist now
    shipped = cloudpickle.loads(cloudpickle.dumps(cls))  # was: cannot pickle weakref
    model = shipped()
    assert await asyncio.gather(*(model(i) for i in range(8))) == [i * 2 for i in range(8)]
    assert model.sizes == [8]


async def test_reconfigure_resizes_the_next_batches() -> None:
    model = make_model()()
    model.reconfigure({"max_batch_size": 3, "batch_wait_timeout_s": 0.05})
    assert await asyncio.gather(*(model(i) for i in range(7))) == [i * 2 for i in range(7)]
    assert model.sizes == [3, 3, 1]


async def test_batch_size_fn_measures_a_batch_in_its_own_unit() -> None:
    seen: list[list[str]] = []

    @serve.batch(
        max_batch_size=5,
        batch_wait_timeout_s=0.05,
        batch_size_fn=lambda texts: sum(len(t.split()) for t in texts),
    )
    async def count(texts: list[str]) -> list[int]:
        seen.append(texts)
        return [len(t.split()) for t in texts]

    texts = ["a b", "c d e", "f", "g h i j k l"]  # 2 + 3 fit; 1 alone; 6 is over but goes alone
    assert await asyncio.gather(*(count(t) for t in texts)) == [2, 3, 1, 6]
    assert seen == [["a b", "c d e"], ["f"], ["g h i j k l"]]

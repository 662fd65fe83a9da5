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


class _Counter:
    """Ray's batched-streaming shape: one list per step, StopIteration ends a caller's stream."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    @serve.batch(max_batch_size=5, batch_wait_timeout_s=0.05)
    async def numbers(self, maxes: list[int]) -> Any:
        self.batches.append(list(maxes))
        for i in range(max(maxes)):
            yield [str(i) if m > i else StopIteration for m in maxes]
            await asyncio.sleep(0)


async def test_a_batched_async_generator_streams_each_caller_its_own_items() -> None:
    counter = _Counter()

    async def drain(n: int) -> list[str]:
        stream = counter.numbers(n)  # no await: the call returns the stream, as in Ray
        return [item async for item in stream]

    got = await asyncio.gather(*(drain(n) for n in (1, 3, 0, 2)))
    assert got == [["0"], ["0", "1", "2"], [], ["0", "1"]]
    assert counter.batches == [[1, 3, 0, 2]]


async def test_a_failing_batched_generator_fails_the_streams_still_open() -> None:
    @serve.batch(max_batch_size=2, batch_wait_timeout_s=0.05)
    async def broken(items: list[int]) -> Any:
        yield [StopIteration, "a"]
        raise RuntimeError("model fell over")

    async def drain(n: int) -> list[Any]:
        got: list[Any] = []
        try:
            async for item in broken(n):
                got.append(item)
        except RuntimeError as exc:
            got.append(str(exc))
        return got

    assert list(await asyncio.gather(drain(1), drain(2))) == [[], ["a", "model fell over"]]

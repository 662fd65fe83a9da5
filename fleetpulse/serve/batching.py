"""`@serve.batch`: calls made one by one, run by the function as one list (Ray Serve's shape).

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.01)
    async def embed(self, texts: list[str]) -> list[list[float]]: ...

    vector = await self.embed("one text")   # each caller passes one item, gets one result

How it works: each instance (or the function itself) has a queue. The first call of a batch
starts a flush that waits until `max_batch_size` items are queued or `batch_wait_timeout_s` has
passed since that first call, then calls the function once with the items in arrival order; the
i-th result answers the i-th caller. An exception, or a result list of the wrong length, fails
every caller of that batch. Calls that arrive while a batch runs start the next one.

Multiplexing: as in Ray, calls for different models never share a batch (one queue per model id
of the calling request), and inside the batch `serve.get_multiplexed_model_id()` is the batch's
model (the flush runs in the first caller's context).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from .multiplex import get_multiplexed_model_id

_FUNCTION_KEY = object()


class _Queue:
    def __init__(self, max_batch_size: int, wait_s: float) -> None:
        self.max_batch_size, self.wait_s = max_batch_size, wait_s
        self.items: list[tuple[Any, asyncio.Future[Any]]] = []
        self.full = asyncio.Event()
        self.flushes: set[asyncio.Task[None]] = set()

    def _start_flush(self, call: Callable[[list[Any]], Awaitable[Any]]) -> None:
        task = asyncio.ensure_future(self._flush(call))
        self.flushes.add(task)
        task.add_done_callback(self.flushes.discard)

    async def submit(self, call: Callable[[list[Any]], Awaitable[Any]], item: Any) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.items.append((item, future))
        if len(self.items) == 1:
            self._start_flush(call)
        if len(self.items) >= self.max_batch_size:
            self.full.set()
        return await future

    async def _flush(self, call: Callable[[list[Any]], Awaitable[Any]]) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.full.wait(), self.wait_s)
        batch, self.items = self.items[: self.max_batch_size], self.items[self.max_batch_size :]
        self.full = asyncio.Event()
        if self.items:  # the overflow starts the next batch at once
            self._start_flush(call)
            if len(self.items) >= self.max_batch_size:
                self.full.set()
        try:
            results = list(await call([item for item, _ in batch]))
            if len(results) != len(batch):
                raise TypeError(
                    f"a @serve.batch function returned {len(results)} results for "
                    f"{len(batch)} inputs; return one per input, in order"
                )
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)


def batch(
    _func: Callable[..., Any] | None = None,
    /,
    *,
    max_batch_size: int = 10,
    batch_wait_timeout_s: float = 0.01,
) -> Any:
    """Ray Serve's defaults: at most 10 items, 0.01 s of waiting for more."""
    if max_batch_size < 1 or batch_wait_timeout_s < 0:
        raise ValueError("max_batch_size must be >= 1 and batch_wait_timeout_s >= 0")

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"@serve.batch needs an async function, not {fn.__qualname__}")
        # owner -> model id -> queue (a batch holds calls for one model only)
        queues: weakref.WeakKeyDictionary[Any, dict[str, _Queue]] = weakref.WeakKeyDictionary()
        plain: dict[str, _Queue] = {}

        @functools.wraps(fn)
        async def batched(*args: Any) -> Any:
            if len(args) not in (1, 2):
                raise TypeError("a @serve.batch function takes one item per call")
            owner, item = (args[0], args[1]) if len(args) == 2 else (_FUNCTION_KEY, args[0])
            if owner is _FUNCTION_KEY:
                per_model = plain
            else:
                per_model = queues.get(owner) or queues.setdefault(owner, {})
            model = get_multiplexed_model_id()
            queue = per_model.get(model)
            if queue is None:
                queue = per_model[model] = _Queue(max_batch_size, batch_wait_timeout_s)

            def call(items: list[Any]) -> Awaitable[Any]:
                pending: Awaitable[Any] = fn(items) if owner is _FUNCTION_KEY else fn(owner, items)
                return pending

            return await queue.submit(call, item)

        return batched

    return wrap if _func is None else wrap(_func)

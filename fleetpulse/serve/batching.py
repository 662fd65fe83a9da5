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

Streaming (Ray's batched generators): a batched async generator yields one list per step, an
entry per caller of the batch; each caller gets an async iterator of its own entries, which ends
at an entry that is `StopIteration` (the class or an instance) or when the generator returns.
Calling the method returns that iterator at once (no await), as Ray's does, so
`StreamingResponse(self.tokens(prompt))` works.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from .multiplex import get_multiplexed_model_id

_FUNCTION_KEY = object()
_VALUE, _END, _ERROR = "value", "end", "error"


class _Queue:
    def __init__(self, settings: BatchedFunction) -> None:
        self.settings = settings
        self.items: list[tuple[Any, Any]] = []  # (item, a Future, or a stream's asyncio.Queue)
        self.full = asyncio.Event()
        self.flushes: set[asyncio.Task[None]] = set()

    def _start_flush(self, call: Callable[[list[Any]], Awaitable[Any]]) -> None:
        task = asyncio.ensure_future(self._flush(call))
        self.flushes.add(task)
        task.add_done_callback(self.flushes.discard)

    def _take(self) -> int:
        """How many of the queued items make the next batch: as many as fit in
        `max_batch_size` (counted by `batch_size_fn` when there is one), at least one."""
        limit, n = self.settings.max_batch_size, len(self.items)
        while n > 1 and self.settings.size([item for item, _ in self.items[:n]]) > limit:
            n -= 1
        return n

    def _is_full(self) -> bool:
        items = [item for item, _ in self.items]
        return self.settings.size(items) >= self.settings.max_batch_size

    def _enqueue(self, call: Callable[[list[Any]], Any], item: Any, sink: Any) -> None:
        self.items.append((item, sink))
        if len(self.items) == 1:
            self._start_flush(call)
        if self._is_full():
            self.full.set()

    async def submit(self, call: Callable[[list[Any]], Awaitable[Any]], item: Any) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._enqueue(call, item, future)
        return await future

    async def submit_stream(
        self, call: Callable[[list[Any]], AsyncIterator[Any]], item: Any
    ) -> AsyncIterator[Any]:
        chunks: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._enqueue(call, item, chunks)
        while True:
            kind, value = await chunks.get()
            if kind == _END:
                return
            if kind == _ERROR:
                raise value
            yield value

    async def _flush(self, call: Callable[[list[Any]], Awaitable[Any]]) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.full.wait(), self.settings.batch_wait_timeout_s)
        n = self._take()
        batch, self.items = self.items[:n], self.items[n:]
        self.full = asyncio.Event()
        if self.items:  # the overflow starts the next batch at once
            self._start_flush(call)
            if self._is_full():
                self.full.set()
        if self.settings.streaming:
            await _run_stream(call, batch)
            return
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


async def _run_stream(call: Callable[[list[Any]], Any], batch: list[tuple[Any, Any]]) -> None:
    """Deal each step's list out to the batch's callers; end a caller's stream at its
    StopIteration entry, everyone's when the generator returns, fail the open ones on an error."""
    sinks: list[asyncio.Queue[tuple[str, Any]]] = [sink for _, sink in batch]
    live = [True] * len(sinks)
    try:
        async for step in call([item for item, _ in batch]):
            outs = list(step)
            if len(outs) != len(sinks):
                raise TypeError(
                    f"a streaming @serve.batch function yielded {len(outs)} items for "
                    f"{len(sinks)} inputs; yield one per input, in order"
                )
            for i, out in enumerate(outs):
                if not live[i]:
                    continue
                if out is StopIteration or isinstance(out, StopIteration):
                    live[i] = False
                    sinks[i].put_nowait((_END, None))
                else:
                    sinks[i].put_nowait((_VALUE, out))
    except Exception as exc:
        for i, sink in enumerate(sinks):
            if live[i]:
                live[i] = False
                sink.put_nowait((_ERROR, exc))
        return
    for i, sink in enumerate(sinks):
        if live[i]:
            sink.put_nowait((_END, None))


def batch(
    _func: Callable[..., Any] | None = None,
    /,
    *,
    max_batch_size: int = 10,
    batch_wait_timeout_s: float = 0.01,
    batch_size_fn: Callable[[list[Any]], int] | None = None,
) -> Any:
    """Ray Serve's defaults: at most 10 items, 0.01 s of waiting for more. `batch_size_fn`
    measures a batch in its own unit (tokens, nodes) instead of counting items."""
    _check(max_batch_size, batch_wait_timeout_s)

    def wrap(fn: Callable[..., Any]) -> BatchedFunction:
        if inspect.isasyncgenfunction(fn):
            return StreamingBatchedFunction(fn, max_batch_size, batch_wait_timeout_s, batch_size_fn)
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(
                f"@serve.batch needs an async function or async generator, not {fn.__qualname__}"
            )
        return BatchedFunction(fn, max_batch_size, batch_wait_timeout_s, batch_size_fn)

    return wrap if _func is None else wrap(_func)


def _check(max_batch_size: int, batch_wait_timeout_s: float) -> None:
    if max_batch_size < 1 or batch_wait_timeout_s < 0:
        raise ValueError("max_batch_size must be >= 1 and batch_wait_timeout_s >= 0")


class BatchedFunction:
    """The decorated function: called with one item, run with a list. A method's instances each
    get their own queues (bound through `__get__`). Pickles without its queues, so a deployment
    shipped by value (serve.run from a script) carries only the function and its settings."""

    def __init__(
        self,
        fn: Callable[..., Any],
        max_batch_size: int,
        wait_s: float,
        size_fn: Callable[[list[Any]], int] | None,
    ) -> None:
        functools.update_wrapper(self, fn)
        self._fn, self._size_fn = fn, size_fn
        self.max_batch_size, self.batch_wait_timeout_s = max_batch_size, wait_s
        self._queues: weakref.WeakKeyDictionary[Any, dict[str, _Queue]] = (
            weakref.WeakKeyDictionary()
        )
        self._plain: dict[str, _Queue] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_queues"], state["_plain"] = None, {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._queues = weakref.WeakKeyDictionary()

    streaming = False

    def __get__(self, owner: Any, cls: type | None = None) -> Any:
        if owner is None:
            return self
        return _BoundStreamBatch(self, owner) if self.streaming else _BoundBatch(self, owner)

    def set_max_batch_size(self, value: int) -> None:
        _check(value, self.batch_wait_timeout_s)
        self.max_batch_size = value

    def set_batch_wait_timeout_s(self, value: float) -> None:
        _check(self.max_batch_size, value)
        self.batch_wait_timeout_s = value

    async def __call__(self, *args: Any) -> Any:
        if len(args) != 1:
            raise TypeError("a @serve.batch function takes one item per call")
        return await self.submit(_FUNCTION_KEY, args[0])

    def _queue_and_call(self, owner: Any) -> tuple[_Queue, Callable[[list[Any]], Any]]:
        if owner is _FUNCTION_KEY:
            per_model = self._plain
        else:
            per_model = self._queues.get(owner) or self._queues.setdefault(owner, {})
        model = get_multiplexed_model_id()
        queue = per_model.get(model)
        if queue is None:
            queue = per_model[model] = _Queue(self)
        fn = self._fn

        def call(items: list[Any]) -> Any:
            return fn(items) if owner is _FUNCTION_KEY else fn(owner, items)

        return queue, call

    async def submit(self, owner: Any, item: Any) -> Any:
        queue, call = self._queue_and_call(owner)
        return await queue.submit(call, item)

    def submit_stream(self, owner: Any, item: Any) -> AsyncIterator[Any]:
        queue, call = self._queue_and_call(owner)
        return queue.submit_stream(call, item)

    def size(self, items: list[Any]) -> int:
        return len(items) if self._size_fn is None else int(self._size_fn(items))


class StreamingBatchedFunction(BatchedFunction):
    """A batched async generator: each call returns the caller's own async iterator."""

    streaming = True

    async def __call__(self, *args: Any) -> AsyncIterator[Any]:  # type: ignore[override]
        if len(args) != 1:
            raise TypeError("a @serve.batch function takes one item per call")
        async for value in self.submit_stream(_FUNCTION_KEY, args[0]):
            yield value


class _BoundStreamBatch:
    """`instance.method` of a batched async generator method."""

    __slots__ = ("_batched", "_owner")

    def __init__(self, batched: BatchedFunction, owner: Any) -> None:
        self._batched, self._owner = batched, owner

    async def __call__(self, *args: Any) -> AsyncIterator[Any]:
        if len(args) != 1:
            raise TypeError("a @serve.batch function takes one item per call")
        async for value in self._batched.submit_stream(self._owner, args[0]):
            yield value

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batched, name)


class _BoundBatch:
    """`instance.method` of a batched method: Ray's `self.__call__.set_max_batch_size(...)`
    reaches the settings through it."""

    __slots__ = ("_batched", "_owner")

    def __init__(self, batched: BatchedFunction, owner: Any) -> None:
        self._batched, self._owner = batched, owner

    async def __call__(self, *args: Any) -> Any:
        if len(args) != 1:
            raise TypeError("a @serve.batch function takes one item per call")
        return await self._batched.submit(self._owner, args[0])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batched, name)

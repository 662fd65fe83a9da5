"""Handles in Ray Serve's shape, over fleetpulse's in-process router.

    result = await self.model.remote(x)                    # __call__
    result = await self.model.predict.remote(x)            # a method
    async for item in self.model.options(stream=True).tokens.remote(prompt): ...
    for item in self.model.options(stream=True).tokens.remote(prompt): ...   # sync user code
    total = await self.adder.remote(self.doubler.remote(2))  # a response as an argument
    await self.models.options(multiplexed_model_id="m7").remote(x)  # a multiplexed model

How it works: a handle wraps `services.router.handle.DeploymentHandle` (one shared router per
deployment and process). `.remote()` starts the call at once on the replica's event loop and
returns a `DeploymentResponse`; awaiting it gives the result, and `result()` blocks for it from
synchronous user code (which runs in a worker thread). With `stream=True` it returns a
`DeploymentResponseGenerator` that starts the call at once too and yields the items with
`async for` (on the loop) or `for` (from a worker thread).

Responses as arguments (Ray's semantics, its router's `_resolve_request_arguments`): a
`DeploymentResponse` passed as a top-level positional or keyword argument is awaited before the
call is sent, all of them concurrently, and the callee receives its result; when it failed, the
call fails with that error and is never sent. One nested inside a list or dict is not resolved
(Ray refuses to serialise it): the call raises TypeError naming where it is. A response
generator cannot be an argument (as in Ray). Arguments and results travel as msgpack.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import AsyncIterator, Coroutine, Generator, Iterator
from typing import TYPE_CHECKING, Any, Final

from shared.errors import UsageError

if TYPE_CHECKING:
    from services.router.handle import DeploymentHandle as RouterHandle
    from shared.bus import Bus
    from shared.subjects import Subjects

DEFAULT_METHOD = "__call__"
_NESTED_DEPTH: Final = 4
"""How deep inside list/tuple/dict arguments a nested response is looked for, to name it in the
error when msgpack refused the arguments."""


class DeploymentHandle:
    """A handle to one deployment (created by the replica for bound arguments, or by
    `serve.get_deployment_handle`)."""

    __slots__ = (
        "_inner", "_loop", "_method", "_model_id", "_stream", "_unary", "app_name",
        "deployment_name",
    )  # fmt: skip
    _inner: RouterHandle
    _unary: RouterHandle | None
    """The router's view for this handle's unary calls, made at the first."""
    _loop: asyncio.AbstractEventLoop
    _method: str
    _model_id: str | None
    _stream: bool
    app_name: str
    deployment_name: str

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            "handles are made by fleetpulse: bind the deployment and pass it to the constructor, "
            "or call serve.get_deployment_handle() inside a replica"
        )

    @classmethod
    def _connect(
        cls,
        app: str,
        deployment: str,
        bus: Bus,
        loop: asyncio.AbstractEventLoop,
        subjects: Subjects | None = None,
    ) -> DeploymentHandle:
        from services.router.handle import DeploymentHandle as RouterHandle
        from shared.subjects import DEFAULT_SUBJECTS

        inner = RouterHandle(app, deployment, bus=bus, subjects=subjects or DEFAULT_SUBJECTS)
        return cls._make(inner, loop, DEFAULT_METHOD, False, None)

    @classmethod
    def _make(
        cls,
        inner: RouterHandle,
        loop: asyncio.AbstractEventLoop,
        method: str,
        stream: bool,
        model_id: str | None,
    ) -> DeploymentHandle:
        h = object.__new__(cls)
        h._inner, h._loop, h._method, h._stream = inner, loop, method, stream
        h._model_id, h._unary = model_id, None
        h.app_name, h.deployment_name = inner.app, inner.deployment
        return h

    def options(
        self,
        *,
        method_name: str | None = None,
        stream: bool | None = None,
        multiplexed_model_id: str | None = None,
        **ignored: Any,
    ) -> DeploymentHandle:
        """Another method, streaming, or a multiplexed model (its requests go to a replica
        holding it; `serve.get_multiplexed_model_id()` there returns it). Ray's other handle
        options (use_new_handle_api, ...) are accepted and have no effect."""
        if multiplexed_model_id is not None and type(multiplexed_model_id) is not str:
            raise TypeError(
                f"multiplexed_model_id is a str, got {type(multiplexed_model_id).__name__}"
            )
        return DeploymentHandle._make(
            self._inner,
            self._loop,
            self._method if method_name is None else method_name,
            self._stream if stream is None else stream,
            self._model_id if multiplexed_model_id is None else (multiplexed_model_id or None),
        )

    def __getattr__(self, name: str) -> DeploymentHandle:
        if name.startswith("_"):
            raise AttributeError(name)
        return self.options(method_name=name)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Start the call: a `DeploymentResponse`, or with `stream=True` a
        `DeploymentResponseGenerator` to iterate with `async for` or `for`."""
        _check_arguments(args, kwargs)
        if self._stream:
            return DeploymentResponseGenerator(self, args, kwargs)
        return DeploymentResponse(self._start(self._call(args, kwargs)))

    def _start(self, coro: Coroutine[Any, Any, Any]) -> _Future:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            return running.create_task(coro)  # not ensure_future: it is always a coroutine
        # synchronous user code runs in a worker thread: the call runs on the replica's loop
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _router(self) -> RouterHandle:
        return self._inner.options(method=self._method, model_id=self._model_id or "")

    async def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if _any_response(args, kwargs):
            args, kwargs = await _resolve(args, kwargs)
        view = self._unary
        if view is None:  # a handle's options do not change: one view serves every call
            view = self._unary = self._router().options(stream=False)
        try:
            return await view.remote(*args, **kwargs)
        except (TypeError, UsageError) as exc:  # raised here only by encoding the arguments
            raise _nested_error(args, kwargs) or exc from exc

    async def _stream_items(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> AsyncIterator[Any]:
        args, kwargs = await _resolve(args, kwargs)
        try:
            items = self._router().stream(*args, **kwargs)
            first = await anext(items, _END)
        except (TypeError, UsageError) as exc:
            raise _nested_error(args, kwargs) or exc from exc
        if first is _END:
            return
        yield first
        async for item in items:
            yield item

    def __repr__(self) -> str:
        return f"DeploymentHandle({self.app_name!r}, {self.deployment_name!r}, {self._method!r})"


_Future = asyncio.Future[Any] | concurrent.futures.Future[Any]


class DeploymentResponse:
    """The result of a call in flight: `await` it (or `result()` from synchronous code)."""

    __slots__ = ("_future",)

    def __init__(self, future: _Future) -> None:
        self._future = future

    def __await__(self) -> Generator[Any, None, Any]:
        future = self._future
        if isinstance(future, concurrent.futures.Future):
            return asyncio.wrap_future(future).__await__()
        return future.__await__()

    def result(self, timeout_s: float | None = None) -> Any:
        """Block until the result is there (only from synchronous code: a worker thread)."""
        future = self._future
        if not isinstance(future, concurrent.futures.Future):
            raise RuntimeError("result() would block the event loop; use `await response`")
        return future.result(timeout_s)

    def cancel(self) -> None:
        self._future.cancel()

    def __reduce__(self) -> Any:
        # as Ray: a response is resolved only as a top-level argument, never serialised
        raise TypeError(
            "a DeploymentResponse cannot be serialised: pass it as a top-level argument of a "
            "handle call (it is resolved first), or await it"
        )


_END: Final = object()


class DeploymentResponseGenerator:
    """The items of a streaming call (`options(stream=True)` on a generator method): `async for`
    on the event loop, `for` from synchronous user code (a worker thread). The call starts when
    `.remote()` returns, as in Ray; `cancel()` stops it."""

    __slots__ = ("_done", "_handle", "_items", "_started")

    def __init__(
        self, handle: DeploymentHandle, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self._handle = handle
        # bounded: a slow reader holds the stream (the replica's backpressure reaches it)
        self._items: asyncio.Queue[Any] = asyncio.Queue(maxsize=1)
        self._done = False
        # the call runs in its own task that fills the queue, so it starts now and either kind
        # of iteration (on the loop or from a thread) reads the same items in order; the task
        # holds the queue, not this object, so a dropped generator is collected (and cancels)
        self._started = handle._start(_pump(handle, args, kwargs, self._items))

    async def _next(self) -> Any:
        if self._done:
            raise StopAsyncIteration
        item = await self._items.get()
        if item is _END:
            self._done = True
            raise StopAsyncIteration
        if isinstance(item, _Failure):
            self._done = True
            raise item.exc
        return item

    # -- async iteration, on the event loop ----------------------------------------------------
    def __aiter__(self) -> DeploymentResponseGenerator:
        return self

    async def __anext__(self) -> Any:
        loop = self._handle._loop
        if asyncio.get_running_loop() is loop:
            return await self._next()
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._next(), loop))

    # -- sync iteration, from a worker thread ----------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        loop = self._handle._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError("`for` would block the event loop; use `async for`")
        try:
            return asyncio.run_coroutine_threadsafe(self._next(), loop).result()
        except StopAsyncIteration:
            raise StopIteration from None

    def cancel(self) -> None:
        """Stop the call (from any thread); iterating afterwards ends or raises CancelledError."""
        started = self._started
        if isinstance(started, concurrent.futures.Future):
            started.cancel()
        elif not started.done():
            started.get_loop().call_soon_threadsafe(started.cancel)

    def __del__(self) -> None:
        # a caller that stopped iterating early must not leave the call held open (in flight)
        started = getattr(self, "_started", None)
        if started is not None and not started.done():
            with contextlib.suppress(RuntimeError):  # a closed loop: nothing runs any more
                self.cancel()


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_PUMPS: set[asyncio.Task[Any]] = set()
"""Running stream pumps: the loop keeps only weak references to tasks."""


async def _pump(
    handle: DeploymentHandle,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    queue: asyncio.Queue[Any],
) -> None:
    task = asyncio.current_task()
    assert task is not None
    _PUMPS.add(task)
    try:
        async for item in handle._stream_items(args, kwargs):
            await queue.put(item)
    except asyncio.CancelledError:
        # cancelled: a reader waiting for the next item gets the cancellation, not a hang
        while queue.full():
            queue.get_nowait()
        queue.put_nowait(_Failure(asyncio.CancelledError()))
        raise
    except Exception as exc:
        await queue.put(_Failure(exc))
    else:
        await queue.put(_END)
    finally:
        _PUMPS.discard(task)


def _check_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse a response generator as an argument at the call, as Ray does (cheap: top level)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, DeploymentResponseGenerator):
            raise TypeError(
                "a DeploymentResponseGenerator cannot be passed to another call (a streaming "
                "response: iterate it and pass the items)"
            )


def _nested_error(args: tuple[Any, ...], kwargs: dict[str, Any]) -> TypeError | None:
    """Why the arguments could not be encoded, when a response is nested in one: only
    responses passed as top-level arguments are resolved (Ray refuses nested ones too). Looked
    for only once encoding failed, so a call pays nothing for it."""
    named = [*((f"argument {i}", a) for i, a in enumerate(args)),
             *((f"argument {k!r}", v) for k, v in kwargs.items())]  # fmt: skip
    for where, value in named:
        if _holds_response(value, _NESTED_DEPTH):
            return TypeError(
                f"{where} holds a DeploymentResponse inside a {type(value).__name__}: only "
                "responses passed as top-level arguments are resolved (as in Ray); await it "
                "first, or pass it as an argument of its own"
            )
    return None


def _holds_response(value: Any, depth: int) -> bool:
    if depth <= 0:
        return False
    if isinstance(value, list | tuple | set | frozenset):
        items: Any = value
    elif isinstance(value, dict):
        items = value.values()
    else:
        return False
    return any(
        isinstance(item, DeploymentResponse | DeploymentResponseGenerator)
        or _holds_response(item, depth - 1)
        for item in items
    )


def _any_response(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """A top-level argument is a response to resolve first (`_resolve`)."""
    for value in args:
        if isinstance(value, DeploymentResponse):
            return True
    if kwargs:
        for value in kwargs.values():
            if isinstance(value, DeploymentResponse):
                return True
    return False


async def _resolve(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Top-level responses among the arguments are awaited, concurrently (as in Ray); the first
    failure fails the call."""
    pending = [a for a in args if isinstance(a, DeploymentResponse)]
    pending += [v for v in kwargs.values() if isinstance(v, DeploymentResponse)]
    if not pending:
        return args, kwargs
    results = iter(await asyncio.gather(*(_awaited(r) for r in pending)))
    out_args = tuple(next(results) if isinstance(a, DeploymentResponse) else a for a in args)
    out_kwargs = {
        k: next(results) if isinstance(v, DeploymentResponse) else v for k, v in kwargs.items()
    }
    return out_args, out_kwargs


async def _awaited(response: DeploymentResponse) -> Any:
    return await response

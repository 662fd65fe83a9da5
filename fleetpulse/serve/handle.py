"""Handles in Ray Serve's shape, over fleetpulse's in-process router.

    result = await self.model.remote(x)                    # __call__
    result = await self.model.predict.remote(x)            # a method
    async for item in self.model.options(stream=True).tokens.remote(prompt): ...
    total = await self.adder.remote(self.doubler.remote(2))  # a response as an argument

How it works: a handle wraps `services.router.handle.DeploymentHandle` (one shared router per
deployment and process). `.remote()` starts the call at once on the replica's event loop and
returns a `DeploymentResponse`; awaiting it gives the result, and `result()` blocks for it from
synchronous user code (which runs in a worker thread). A response passed as an argument is
awaited before the call is sent, so pipelines compose without an await between stages.
Arguments and results travel as msgpack.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator, Coroutine, Generator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from services.router.handle import DeploymentHandle as RouterHandle
    from shared.bus import Bus
    from shared.subjects import Subjects

DEFAULT_METHOD = "__call__"


class DeploymentHandle:
    """A handle to one deployment (created by the replica for bound arguments, or by
    `serve.get_deployment_handle`)."""

    __slots__ = ("_inner", "_loop", "_method", "_stream", "app_name", "deployment_name")
    _inner: RouterHandle
    _loop: asyncio.AbstractEventLoop
    _method: str
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
        return cls._make(inner, loop, DEFAULT_METHOD, False)

    @classmethod
    def _make(
        cls, inner: RouterHandle, loop: asyncio.AbstractEventLoop, method: str, stream: bool
    ) -> DeploymentHandle:
        h = object.__new__(cls)
        h._inner, h._loop, h._method, h._stream = inner, loop, method, stream
        h.app_name, h.deployment_name = inner.app, inner.deployment
        return h

    def options(
        self, *, method_name: str | None = None, stream: bool | None = None, **ignored: Any
    ) -> DeploymentHandle:
        """Another method or streaming. Ray's other handle options (multiplexed_model_id,
        use_new_handle_api, ...) are accepted and have no effect."""
        return DeploymentHandle._make(
            self._inner,
            self._loop,
            self._method if method_name is None else method_name,
            self._stream if stream is None else stream,
        )

    def __getattr__(self, name: str) -> DeploymentHandle:
        if name.startswith("_"):
            raise AttributeError(name)
        return self.options(method_name=name)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Start the call: a `DeploymentResponse`, or with `stream=True` a
        `DeploymentResponseGenerator` to iterate with `async for`."""
        if self._stream:
            return DeploymentResponseGenerator(self, args, kwargs)
        return DeploymentResponse(self._start(self._call(args, kwargs)))

    def _start(self, coro: Coroutine[Any, Any, Any]) -> _Future:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            return asyncio.ensure_future(coro)
        # synchronous user code runs in a worker thread: the call runs on the replica's loop
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        args, kwargs = await _resolve(args, kwargs)
        return await self._inner.options(method=self._method, stream=False).remote(*args, **kwargs)

    async def _stream_items(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> AsyncIterator[Any]:
        args, kwargs = await _resolve(args, kwargs)
        async for item in self._inner.options(method=self._method).stream(*args, **kwargs):
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


class DeploymentResponseGenerator:
    """The items of a streaming call, with `async for` (the call starts on first iteration)."""

    __slots__ = ("_args", "_handle", "_items", "_kwargs")

    def __init__(
        self, handle: DeploymentHandle, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self._handle, self._args, self._kwargs = handle, args, kwargs
        self._items: AsyncIterator[Any] | None = None

    def __aiter__(self) -> DeploymentResponseGenerator:
        return self

    async def __anext__(self) -> Any:
        if self._items is None:
            self._items = self._handle._stream_items(self._args, self._kwargs)
        return await self._items.__anext__()


async def _resolve(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Responses passed as arguments are awaited first (top-level arguments, as in Ray)."""
    out_args = [await a if isinstance(a, DeploymentResponse) else a for a in args]
    out_kwargs = {k: await v if isinstance(v, DeploymentResponse) else v for k, v in kwargs.items()}
    return tuple(out_args), out_kwargs

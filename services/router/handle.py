"""`DeploymentHandle`: call a deployment from any Python code.

    handle = await connect_handle("shop", "cart", bus=bus)
    total = await handle.remote(items, currency="EUR")              # unary, method __call__
    async for line in handle.options(method="lines").stream(n=10):  # a generator method
        ...
    await handle.close()

How it works: handles are cheap views. Every handle of one (bus, namespace, app, deployment) in the
process shares one `Router` (router.py), which owns membership, the queue, carried health and the
reports loop; the router starts on first use and stops when the last handle that holds it is
closed. `options()` returns a view on the same router with another method, stream flag,
deadline or multiplexed model (`model_id`: its requests go to a replica holding that model); a view holds no reference of its own, so it needs no `close()`. The first handle's
`RouterConfig`, clock and providers win for a shared router.

A unary call returns the msgpack value of chunk 0; a stream yields each chunk's value. Errors are
those of services.router.errors (docs/dataplane.md).
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Final

from services.router.call import BAD_RESPONSE, ResponseReader, open_call
from services.router.config import RouterConfig, default_router_config
from services.router.errors import RequestFailed
from services.router.router import Router
from shared.bus import Bus
from shared.clock import SYSTEM_CLOCK, Clock
from shared.localhealth import DEFAULT_PROVIDERS, LocalHealthProviders
from shared.subjects import DEFAULT_SUBJECTS, Subjects, validate_name
from shared.wire import uservalues
from shared.wire.codec import encode
from shared.wire.messages import CallArgs

DEFAULT_METHOD: Final = "__call__"

_Key = tuple[int, str, str, str]


@dataclass(slots=True)
class _Lease:
    bus: Bus
    router: Router
    holders: int = field(default=0)


_ROUTERS: dict[_Key, _Lease] = {}


class _Unset:
    """Type of the `options()` default that means "keep this handle's value"."""


_UNSET: Final = _Unset()


def _acquire(
    bus: Bus,
    app: str,
    deployment: str,
    config: RouterConfig,
    clock: Clock,
    subjects: Subjects,
    rng: random.Random | None,
    providers: LocalHealthProviders,
) -> Router:
    key = (id(bus), subjects.namespace, app, deployment)
    lease = _ROUTERS.get(key)
    if lease is None or lease.router.closed or lease.bus is not bus:
        router = Router(
            app,
            deployment,
            bus=bus,
            config=config,
            clock=clock,
            subjects=subjects,
            rng=rng,
            providers=providers,
        )
        lease = _ROUTERS[key] = _Lease(bus, router)
    lease.holders += 1
    return lease.router


async def _release(router: Router) -> None:
    key = (id(router.bus), router.subjects.namespace, router.app, router.deployment)
    lease = _ROUTERS.get(key)
    if lease is None or lease.router is not router:
        await router.close()
        return
    lease.holders -= 1
    if lease.holders <= 0:
        del _ROUTERS[key]
        await router.close()


def shared_router(bus: Bus, app: str, deployment: str, **kwargs: Any) -> Router:
    """Take a reference on the process-wide router (the gateway uses this); pair with
    `release_router`. Keyword arguments are those of `DeploymentHandle`."""
    return _acquire(
        bus,
        validate_name(app, "app"),
        validate_name(deployment, "deployment"),
        kwargs.get("config") or default_router_config(),
        kwargs.get("clock", SYSTEM_CLOCK),
        kwargs.get("subjects", DEFAULT_SUBJECTS),
        kwargs.get("rng"),
        kwargs.get("providers", DEFAULT_PROVIDERS),
    )


async def release_router(router: Router) -> None:
    await _release(router)


class DeploymentHandle:
    __slots__ = ("_closed", "_owner", "deadline_s", "method", "model_id", "router", "streaming")

    def __init__(
        self,
        app: str,
        deployment: str,
        *,
        bus: Bus,
        config: RouterConfig | None = None,
        clock: Clock = SYSTEM_CLOCK,
        subjects: Subjects = DEFAULT_SUBJECTS,
        method: str = DEFAULT_METHOD,
        stream: bool = False,
        deadline_s: float | None = None,
        rng: random.Random | None = None,
        providers: LocalHealthProviders = DEFAULT_PROVIDERS,
    ) -> None:
        self.router = shared_router(
            bus,
            app,
            deployment,
            config=config,
            clock=clock,
            subjects=subjects,
            rng=rng,
            providers=providers,
        )
        self.method = method
        self.streaming = stream
        self.deadline_s = deadline_s
        self.model_id: str | None = None
        self._owner = True
        self._closed = False

    @classmethod
    def _view(
        cls,
        router: Router,
        method: str,
        stream: bool,
        deadline_s: float | None,
        model_id: str | None = None,
    ) -> DeploymentHandle:
        handle = cls.__new__(cls)
        handle.router = router
        handle.method = method
        handle.streaming = stream
        handle.deadline_s = deadline_s
        handle.model_id = model_id
        handle._owner = False
        handle._closed = False
        return handle

    @property
    def app(self) -> str:
        return self.router.app

    @property
    def deployment(self) -> str:
        return self.router.deployment

    def options(
        self,
        *,
        method: str | None = None,
        stream: bool | None = None,
        deadline_s: float | _Unset | None = _UNSET,
        model_id: str | None = None,
    ) -> DeploymentHandle:
        """A view calling another method, streaming or not, with another deadline in seconds
        (None: no deadline), or for a multiplexed model (`model_id`; "" clears it). Unset
        arguments keep this handle's values."""
        if model_id is not None and type(model_id) is not str:
            raise TypeError(f"a multiplexed model id is a str, got {type(model_id).__name__}")
        return DeploymentHandle._view(
            self.router,
            method if method is not None else self.method,
            stream if stream is not None else self.streaming,
            self.deadline_s if isinstance(deadline_s, _Unset) else deadline_s,
            self.model_id if model_id is None else (model_id or None),
        )

    async def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Call the method. Unary: its return value. With `stream=True`: an async iterator of
        its items, returned once a replica admitted the request (iterate it to the end or
        `aclose()` it, or the request stays counted as in flight)."""
        if self.streaming:
            return _iterate(await self._open(args, kwargs, True))
        reader = await open_call(  # not through _open: a coroutine less per call
            self.router,
            method=self.method,
            body=encode(CallArgs(args, kwargs)),
            body_kind="args",
            stream=False,
            deadline_s=self.deadline_s,
            model_id=self.model_id,
        )
        data = await reader.unary_result()
        if data is None:
            raise RequestFailed(BAD_RESPONSE, "the response ended without a result", False)
        return unpack_result(data)

    async def stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        """Call a generator method; yields its items as they arrive."""
        reader = await self._open(args, kwargs, True)
        async for item in _iterate(reader):
            yield item

    async def _open(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], stream: bool
    ) -> ResponseReader:
        return await open_call(
            self.router,
            method=self.method,
            body=encode(CallArgs(args, kwargs)),
            body_kind="args",
            stream=stream,
            deadline_s=self.deadline_s,
            model_id=self.model_id,
        )

    async def close(self) -> None:
        """Release this handle's reference on the shared router (views: no-op)."""
        if self._owner and not self._closed:
            self._closed = True
            await _release(self.router)

    async def __aenter__(self) -> DeploymentHandle:
        await self.router.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def unpack_result(data: bytes) -> Any:
    """A chunk's msgpack value (user data: map keys need not be strings)."""
    return uservalues.unpack(data)


async def _iterate(reader: ResponseReader) -> AsyncIterator[Any]:
    try:
        while (chunk := await reader.next_chunk()) is not None:
            yield unpack_result(chunk.data)
    finally:
        await reader.close()


async def connect_handle(
    app: str,
    deployment: str,
    *,
    bus: Bus,
    ready_timeout_s: float | None = 5.0,
    **kwargs: Any,
) -> DeploymentHandle:
    """A started handle whose router already knows the membership (or knows it is absent)."""
    handle = DeploymentHandle(app, deployment, bus=bus, **kwargs)
    try:
        await handle.router.wait_ready(ready_timeout_s)
    except BaseException:
        await handle.close()
        raise
    return handle

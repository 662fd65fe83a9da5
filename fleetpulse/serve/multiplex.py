"""Model multiplexing in Ray Serve's shape: many models over few replicas, each replica an LRU.

    @serve.deployment
    class Models:
        @serve.multiplexed(max_num_models_per_replica=3)
        async def get_model(self, model_id: str) -> Model:
            return await load(model_id)              # slow: disk, network, GPU upload

        async def __call__(self, request) -> str:
            model = await self.get_model(serve.get_multiplexed_model_id())
            return model.predict(await request.json())

    handle.options(multiplexed_model_id="m7").remote(x)     # from Python
    curl -H 'serve_multiplexed_model_id: m7' ...             # over HTTP

How it works:
- The request's model id lives in a context variable (`_MODEL_ID`), set by the replica for the
  request's task from `Request.multiplexed_model_id` (handles) or from the
  `serve_multiplexed_model_id` header (HTTP: `model_id_from_headers`, then `set_request_model_id`);
  `get_multiplexed_model_id()` reads it ("" outside a request with a model, as Ray).
- `@multiplexed` wraps the user's async loader. Each instance (or the function itself) gets one
  `ModelCache`: an LRU of at most `max_num_models_per_replica` loaded models (-1: no bound). A hit
  moves the model to the young end. A miss loads it under the cache's lock, evicting the least
  recently used first, so memory never holds more than the bound even while a load runs (as Ray:
  loads of different models take turns). Concurrent requests for one model share one load task;
  a request that gives up (cancelled) leaves the load running for the others and the cache. A
  failed load caches nothing: every waiter gets the error and the next request tries again. An
  evicted model's `__del__`, when it has one, is awaited (async) or run in a thread (sync), as
  Ray does, so resources go at once rather than at garbage collection.
- `held_models(instance)` lists, newest first, what the deployment instance's caches (and those of
  plain multiplexed functions) hold or are loading; the replica puts it on each `Admission` (docs/wire.md) so routers send a model's requests to a
  replica that already has it (services/router/choice.py).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar, overload

from shared.multiplexing import MULTIPLEXED_MODEL_ID_HEADER, model_id_from_headers
from shared.wire.messages import MAX_MODELS

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MAX_MODELS_PER_REPLICA", "MULTIPLEXED_MODEL_ID_HEADER", "ModelCache",
    "get_multiplexed_model_id", "held_models", "model_caches", "model_id_from_headers",
    "multiplexed", "reset_request_model_id", "set_request_model_id",
]  # fmt: skip

DEFAULT_MAX_MODELS_PER_REPLICA: Final = 3
"""Ray's default `max_num_models_per_replica`."""

_MODEL_ID: contextvars.ContextVar[str] = contextvars.ContextVar(
    "fleetpulse_multiplexed_model_id", default=""
)

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


# -- the request's model id -------------------------------------------------------------------


def get_multiplexed_model_id() -> str:
    """The model id of the request being served ("" when it names none)."""
    return _MODEL_ID.get()


def set_request_model_id(model_id: str | None) -> contextvars.Token[str]:
    """Set the current request's model id (the replica calls this in the request's task before
    user code runs; None or "" clears it). Returns the token for `reset_request_model_id`."""
    return _MODEL_ID.set(model_id or "")


def reset_request_model_id(token: contextvars.Token[str]) -> None:
    _MODEL_ID.reset(token)


# -- the per-replica LRU ----------------------------------------------------------------------

_FUNCTION_CACHES: list[ModelCache] = []
"""The caches of plain multiplexed functions (not methods): one per function, process-wide."""


class ModelCache:
    """An LRU of loaded models in front of one async loader (see the module docstring)."""

    __slots__ = (
        "_load", "_loading", "_lock", "evictions", "hits", "load_seconds",
        "loads", "max_models", "models", "name",
    )  # fmt: skip

    def __init__(
        self, load: Callable[[str], Awaitable[Any]], max_models: int, name: str = "model"
    ) -> None:
        self._load = load
        self.max_models = max_models
        self.name = name
        self.models: OrderedDict[str, Any] = OrderedDict()
        """Loaded models, least recently used first."""
        self._loading: dict[str, asyncio.Task[Any]] = {}
        self._lock = asyncio.Lock()
        self.hits = 0
        self.loads = 0
        self.evictions = 0
        self.load_seconds = 0.0

    def held(self) -> list[str]:
        """Model ids loaded or loading here, most recently used first."""
        out = list(self._loading)
        out.extend(m for m in reversed(self.models) if m not in self._loading)
        return out

    async def get(self, model_id: str) -> Any:
        if type(model_id) is not str:
            raise TypeError(f"a model id is a str, got {type(model_id).__name__}")
        if not model_id:
            raise ValueError(
                "the model id is empty: call with handle.options(multiplexed_model_id=...) or "
                f"the {MULTIPLEXED_MODEL_ID_HEADER!r} HTTP header"
            )
        models = self.models
        if model_id in models:
            models.move_to_end(model_id)
            self.hits += 1
            return models[model_id]
        task = self._loading.get(model_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(
                self._load_one(model_id), name=f"load-model:{model_id}"
            )
            self._loading[model_id] = task
            task.add_done_callback(functools.partial(self._load_done, model_id))
        # shield: a caller that gives up must not cancel the load the others wait for
        return await asyncio.shield(task)

    def _load_done(self, model_id: str, task: asyncio.Task[Any]) -> None:
        if self._loading.get(model_id) is task:
            del self._loading[model_id]
        if not task.cancelled() and task.exception() is not None:
            logger.warning("loading model %r failed: %r", model_id, task.exception())

    async def _load_one(self, model_id: str) -> Any:
        async with self._lock:
            if model_id in self.models:  # loaded while this one waited for its turn
                self.models.move_to_end(model_id)
                return self.models[model_id]
            while self.max_models > 0 and len(self.models) >= self.max_models:
                await self._evict_lru()
            started = time.monotonic()
            model = await self._load(model_id)
            self.load_seconds += time.monotonic() - started
            self.loads += 1
            self.models[model_id] = model
            logger.info("loaded model %r in %.3f s", model_id, time.monotonic() - started)
            return model

    async def _evict_lru(self) -> None:
        model_id, model = self.models.popitem(last=False)
        self.evictions += 1
        logger.info("unloading model %r (least recently used)", model_id)
        release = getattr(model, "__del__", None)
        if release is None:
            return
        try:  # the user's cleanup failing must not fail the request that evicted it
            if inspect.iscoroutinefunction(release):
                await release()
            else:
                await asyncio.get_running_loop().run_in_executor(None, release)
        except Exception:
            logger.exception("unloading model %r: its __del__ raised", model_id)

    async def clear(self) -> None:
        """Unload every model (least recently used first)."""
        async with self._lock:
            while self.models:
                await self._evict_lru()


def held_models(owner: Any = None) -> tuple[str, ...] | None:
    """What the multiplexed loaders of `owner` (a deployment instance) and plain multiplexed
    functions hold or are loading, newest first (at most `MAX_MODELS`); None when none was
    called yet (the field stays off the wire)."""
    caches = list(getattr(owner, _ATTR, {}).values()) if owner is not None else []
    caches.extend(_FUNCTION_CACHES)
    if not caches:
        return None
    if len(caches) == 1:
        held = caches[0].held()
    else:
        held = list(dict.fromkeys(m for c in caches for m in c.held()))
    return tuple(held[:MAX_MODELS])


# -- the decorator ----------------------------------------------------------------------------

_ATTR: Final = "_fleetpulse_model_caches"


@overload
def multiplexed(func: F, max_num_models_per_replica: int = ...) -> F: ...
@overload
def multiplexed(func: None = None, max_num_models_per_replica: int = ...) -> Callable[[F], F]: ...


def multiplexed(
    func: F | None = None, max_num_models_per_replica: int = DEFAULT_MAX_MODELS_PER_REPLICA
) -> F | Callable[[F], F]:
    """`@serve.multiplexed` or `@serve.multiplexed(max_num_models_per_replica=N)` on an async
    loader `async def load(self, model_id: str)` (or a plain function of `model_id`): calls go
    through the replica's LRU of at most N loaded models (-1: unbounded)."""
    if type(max_num_models_per_replica) is not int:
        raise TypeError("max_num_models_per_replica must be an int")
    if max_num_models_per_replica != -1 and max_num_models_per_replica <= 0:
        raise ValueError("max_num_models_per_replica must be positive (or -1: no bound)")
    bound = max_num_models_per_replica

    def wrap(load: F) -> F:
        if not callable(load):
            raise TypeError("@serve.multiplexed decorates a function or a method")
        if not inspect.iscoroutinefunction(load):
            raise TypeError("@serve.multiplexed decorates an async function (async def)")
        params = len(inspect.signature(load).parameters)
        if params not in (1, 2):
            raise TypeError(
                "@serve.multiplexed decorates `async def f(model_id)` or "
                "`async def method(self, model_id)`"
            )
        method = params == 2
        key = getattr(load, "__qualname__", "loader")
        shared: list[ModelCache] = []  # a plain function's one cache

        @functools.wraps(load)
        async def loader(*args: Any) -> Any:
            if len(args) != params:
                raise TypeError(
                    f"{key}() takes the model id only (got {len(args) - (params - 1)} arguments)"
                )
            if method:
                owner, model_id = args
                cache = _cache_of(owner, key, functools.partial(load, owner), bound)
            else:
                (model_id,) = args
                if not shared:
                    shared.append(ModelCache(load, bound, key))
                    _FUNCTION_CACHES.append(shared[0])
                cache = shared[0]
            return await cache.get(model_id)

        return loader  # type: ignore[return-value]

    return wrap(func) if func is not None else wrap


def _cache_of(
    owner: Any, key: str, load: Callable[[str], Awaitable[Any]], bound: int
) -> ModelCache:
    caches: dict[str, ModelCache] | None = getattr(owner, _ATTR, None)
    if caches is None:
        caches = {}
        setattr(owner, _ATTR, caches)  # raises for a __slots__ class without room: clear enough
    cache = caches.get(key)
    if cache is None:
        cache = caches[key] = ModelCache(load, bound, key)
    return cache


def model_caches(owner: Any) -> dict[str, ModelCache]:
    """The caches a deployment instance's multiplexed loaders made (tests and benchmarks)."""
    caches: dict[str, ModelCache] = getattr(owner, _ATTR, {})
    return caches

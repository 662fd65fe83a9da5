"""Loading and invoking user code given as `module:attribute`.

A class is instantiated once with the init args; a plain function is the deployment's `__call__`.
A deployment declared with `fleetpulse.serve.deployment` is unwrapped to its class or function;
handle markers among the init args (shared/appgraph.py) become handles to those deployments, and
a class's `reconfigure(user_config)` is called once constructed, when a user_config is given.
Sync callables run in a thread pool so they cannot stall the event loop (and with it admissions
and health); async ones run on the loop. Generators (sync or async) stream their items.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from shared.appgraph import referenced, replace_refs
from shared.errors import ConfigError

from .custom_stats import stats_method


class MethodNotFound(Exception):
    pass


def load_target(import_path: str) -> Any:
    module_name, sep, attr = import_path.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"import_path {import_path!r} must look like 'package.module:Attribute'",
            field="import_path",
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"cannot import module {module_name!r} ({exc}); is it on PYTHONPATH or in the working dir?",
            field="import_path",
        ) from exc
    try:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise ConfigError(
            f"module {module_name!r} has no attribute {attr!r}", field="import_path"
        ) from None
    return getattr(obj, "__fleetpulse_target__", obj)  # a fleetpulse.serve Deployment


class UserDeployment:
    """The user's object, with the calls the runtime needs."""

    def __init__(self, instance: Any, *, is_function: bool) -> None:
        self._instance = instance
        self._is_function = is_function
        check = None if is_function else getattr(instance, "check_health", None)
        self._check_health: Callable[[], Any] | None = check if callable(check) else None
        self.autoscaling_stats = None if is_function else stats_method(instance)
        """The class's `record_autoscaling_stats` (custom_stats.py), or None."""
        found = None if is_function else getattr(instance, "reconfigure", None)
        self._reconfigure: Callable[[Any], Any] | None = found if callable(found) else None
        self.reconfigure_error: str | None = None
        """Why the last reconfigure() failed (health checks fail meanwhile), or None."""
        self._asgi: Any = None
        """The replica's ASGI app once built (asgi.build_asgi_app caches it here)."""

    @property
    def instance(self) -> Any:
        return self._instance

    @classmethod
    async def create(
        cls,
        import_path: str,
        init_args: tuple[Any, ...],
        init_kwargs: dict[str, Any],
        *,
        target: Any = None,
        handles: Callable[[str], Any] | None = None,
        user_config: Mapping[str, Any] | None = None,
    ) -> UserDeployment:
        """`target`: the object `import_path` names, when already imported; `handles` makes the
        handle a marker names (needed when the init args hold one)."""
        target = load_target(import_path) if target is None else target
        names = referenced([init_args, init_kwargs])
        if names:
            if handles is None:
                raise ConfigError(
                    f"init args hold handles to {sorted(names)}, and no bus to reach them",
                    field="init_kwargs",
                )
            init_args = tuple(replace_refs(list(init_args), handles))
            init_kwargs = replace_refs(dict(init_kwargs), handles)
        if inspect.isclass(target):
            instance = await asyncio.to_thread(target, *init_args, **init_kwargs)
            user = cls(instance, is_function=False)
            if user_config is not None:
                if not user.has_reconfigure:
                    raise ConfigError(
                        f"{import_path} has no reconfigure(config) method for its user_config",
                        field="user_config",
                    )
                await user.reconfigure(user_config)
            return user
        if callable(target):
            if user_config is not None:
                raise ConfigError(
                    f"{import_path} is a function; user_config needs a class with reconfigure()",
                    field="user_config",
                )
            if init_args or init_kwargs:
                raise ConfigError(
                    f"{import_path} is a function; init_args/init_kwargs need a class",
                    field="init_kwargs",
                )
            return cls(target, is_function=True)
        raise ConfigError(f"{import_path} is neither a class nor a function", field="import_path")

    @property
    def has_health_check(self) -> bool:
        return self._check_health is not None

    @property
    def has_reconfigure(self) -> bool:
        return self._reconfigure is not None

    async def reconfigure(self, user_config: Mapping[str, Any]) -> None:
        """Hand the class its user_config (sync methods run in a worker thread); raises what
        the method raised, after noting it in `reconfigure_error`."""
        fn = self._reconfigure
        assert fn is not None
        try:
            if inspect.iscoroutinefunction(fn):
                await fn(dict(user_config))
            else:
                await asyncio.to_thread(fn, dict(user_config))
        except Exception as exc:
            self.reconfigure_error = f"{type(exc).__name__}: {exc}"
            raise
        self.reconfigure_error = None

    async def check_health(self, timeout_s: float) -> bool:
        """True when the user check returned in time; False when it raised or timed out, or
        while the last user_config was refused by reconfigure()."""
        if self.reconfigure_error is not None:
            return False
        fn = self._check_health
        if fn is None:
            return True
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation that
        # races with the check finishing, and the health loop would then never stop
        try:
            async with asyncio.timeout(timeout_s):
                if inspect.iscoroutinefunction(fn):
                    await fn()
                else:
                    await asyncio.to_thread(fn)
        except Exception:
            return False
        return True

    def resolve(self, method: str) -> Callable[..., Any]:
        if self._is_function:
            if method != "__call__":
                raise MethodNotFound(f"a function deployment only has __call__, not {method!r}")
            fn: Callable[..., Any] = self._instance
            return fn
        if method.startswith("_") and method != "__call__":
            raise MethodNotFound(f"method {method!r} is private")
        found = getattr(self._instance, method, None)
        if found is None or not callable(found):
            raise MethodNotFound(f"deployment has no method {method!r}")
        return found  # type: ignore[no-any-return]


_COROUTINE, _ASYNC_GEN, _GEN, _PLAIN = range(4)
_KINDS: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def _kind_of(fn: Callable[..., Any]) -> int:
    """What calling `fn` gives, remembered per underlying function (inspect's checks were a
    tenth of a fast call's own cost, and a method's kind does not change)."""
    key = getattr(fn, "__func__", fn)
    try:
        return _KINDS[key]
    except (KeyError, TypeError):  # TypeError: not weak-referenceable, so not remembered
        pass
    if inspect.iscoroutinefunction(fn):
        kind = _COROUTINE
    elif inspect.isasyncgenfunction(fn):
        kind = _ASYNC_GEN
    elif inspect.isgeneratorfunction(fn):
        kind = _GEN
    else:
        kind = _PLAIN
    with contextlib.suppress(TypeError):
        _KINDS[key] = kind
    return kind


async def invoke(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Call `fn`; returns a value, or an async iterator when `fn` is a generator."""
    kind = _kind_of(fn)
    if kind == _COROUTINE:
        return await fn(*args, **kwargs)
    if kind == _ASYNC_GEN:
        return fn(*args, **kwargs)
    if kind == _GEN:
        return thread_iter(fn(*args, **kwargs))
    result = await asyncio.to_thread(fn, *args, **kwargs)
    if inspect.isawaitable(result):  # a sync wrapper around a coroutine
        result = await result
    return result


_DONE = object()


async def thread_iter(gen: Any) -> AsyncIterator[Any]:
    """Drive a sync generator in the thread pool, one item at a time."""
    try:
        while True:
            item = await asyncio.to_thread(next, gen, _DONE)
            if item is _DONE:
                return
            yield item
    finally:
        gen.close()


def is_stream(value: Any) -> bool:
    return inspect.isasyncgen(value) or hasattr(value, "__anext__")

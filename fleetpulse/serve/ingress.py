"""`@serve.ingress(app)`: a deployment class that serves a FastAPI or Starlette app over HTTP.

    app = FastAPI()

    @serve.deployment
    @serve.ingress(app)
    class Api:
        def __init__(self) -> None:
            self.greeting = "hello"

        @app.get("/hi/{name}")
        def hi(self, name: str) -> str:
            return f"{self.greeting} {name}"

How it works: the decorator only marks the class (`INGRESS_ATTR` holds the app, a builder
function returning one, or None for a class with `__serve_build_asgi_app__`) and, for a FastAPI
app, turns the routes whose endpoints are this class's methods into class-based views: each such
route is rebuilt with `self` declared as a FastAPI dependency that yields the replica's instance
(read from a context variable the replica's ASGI wrapper sets for every connection,
services/replica/asgi.py), and the other parameters keyword-only, so FastAPI validates and
documents them as usual. FastAPI stays the user's dependency: it is imported only when the app is
one. Nothing else runs here; the replica builds and serves the app.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

INGRESS_ATTR = "__fleetpulse_ingress__"
"""Set on a class decorated with `serve.ingress`: the app, a builder function, or None."""
LATE_BUILDER = "__serve_build_asgi_app__"
"""A method of an ingress class decorated without an app: returns the app, called once the
instance exists (Ray Serve's name)."""

_SERVABLE: contextvars.ContextVar[Any] = contextvars.ContextVar("fleetpulse_servable")
_ROUTE_OWNER = "_fleetpulse_ingress_cls"

C = TypeVar("C", bound=type)


def ingress(app: Any = None) -> Callable[[C], C]:
    """Mark a deployment class as serving `app` (a FastAPI/Starlette app or any ASGI callable, or
    a function that builds one when the replica starts)."""

    def mark(cls: C) -> C:
        if not inspect.isclass(cls):
            raise TypeError("@serve.ingress decorates a class")
        if "__call__" in vars(cls):
            raise TypeError(
                f"{cls.__name__}: a class with @serve.ingress serves its app's routes and may not "
                "define __call__"
            )
        if app is None and not callable(getattr(cls, LATE_BUILDER, None)):
            raise TypeError(
                f"{cls.__name__}: @serve.ingress() without an app needs a {LATE_BUILDER}(self) "
                "method that returns one"
            )
        if _is_fastapi(app):
            bind_class_routes(app, cls)
        setattr(cls, INGRESS_ATTR, app)
        return cls

    return mark


def is_ingress(cls: type) -> bool:
    return hasattr(cls, INGRESS_ATTR)


def enter_servable(instance: Any) -> contextvars.Token[Any]:
    """Make `instance` the `self` of class-based routes in this context (the ASGI wrapper)."""
    return _SERVABLE.set(instance)


def leave_servable(token: contextvars.Token[Any]) -> None:
    _SERVABLE.reset(token)


async def _current_servable() -> Any:
    try:
        return _SERVABLE.get()
    except LookupError:
        raise RuntimeError(
            "a @serve.ingress route method was called outside a replica: fleetpulse binds `self` "
            "to the replica's instance when it serves the app"
        ) from None


def _is_fastapi(app: Any) -> bool:
    try:
        from fastapi import APIRouter, FastAPI
    except ImportError:  # the app cannot be a FastAPI one
        return False
    return isinstance(app, FastAPI | APIRouter)


def _walk(router: Any) -> Iterator[tuple[Any, int, Any]]:
    """(parent router, index, route) for every API route, into included routers too (FastAPI
    keeps those as nodes of their own since 0.137, older versions flatten them)."""
    from fastapi.routing import APIRoute, APIWebSocketRoute

    for index, route in enumerate(list(router.routes)):
        if isinstance(route, APIRoute | APIWebSocketRoute):
            yield router, index, route
        elif hasattr(route, "original_router"):
            yield from _walk(route.original_router)


def _defined_in(fn: Any, cls: type) -> bool:
    # a method's qualified name starts with the class that defined it ("Api.hi"), also when
    # inherited; matching the whole class name keeps class "A" from claiming "AB.hi"
    qualname = getattr(fn, "__qualname__", "")
    return any(
        qualname.startswith(base.__qualname__ + ".") for base in cls.__mro__ if base is not object
    )


def bind_class_routes(app: Any, cls: type) -> int:
    """Rebuild the routes whose endpoints are methods of `cls` as class-based views; returns how
    many. Each is rebuilt (not patched) so FastAPI analyses the new signature itself."""
    from fastapi import Depends

    count = 0
    for parent, index, route in list(_walk(app)):
        endpoint = route.endpoint
        if getattr(endpoint, _ROUTE_OWNER, None) is not None or not _defined_in(endpoint, cls):
            continue
        sig = inspect.signature(endpoint)
        params = list(sig.parameters.values())
        if not params:
            raise TypeError(
                f"{cls.__name__}.{endpoint.__name__}: a route method takes `self` first"
            )
        first = params[0].replace(default=Depends(_current_servable))
        rest = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params[1:]]
        # FastAPI passes every parameter by keyword, `self` included: the function itself is
        # called, with the signature FastAPI reads from __signature__
        endpoint.__signature__ = sig.replace(parameters=[first, *rest])
        setattr(endpoint, _ROUTE_OWNER, cls)
        parent.routes[index] = _rebuilt(route, endpoint)
        changed = getattr(parent, "_mark_routes_changed", None)
        if callable(changed):
            changed()
        count += 1
    return count


def _rebuilt(route: Any, endpoint: Any) -> Any:
    kind = type(route)
    kwargs: dict[str, Any] = {}
    for name, param in inspect.signature(kind.__init__).parameters.items():
        if name in ("self", "endpoint") or param.kind is inspect.Parameter.VAR_KEYWORD:
            continue
        if hasattr(route, name):
            kwargs[name] = getattr(route, name)
    return kind(endpoint=endpoint, **kwargs)

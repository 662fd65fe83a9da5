"""Ray Serve's code-first application model under fleetpulse's names.

    from fleetpulse import serve

    @serve.deployment(num_replicas="auto", user_config={"threshold": 0.5})
    class Model:
        def reconfigure(self, config: dict) -> None: ...
        async def __call__(self, request: serve.Request) -> str: ...

    @serve.deployment
    class Ingress:
        def __init__(self, model: serve.DeploymentHandle) -> None:
            self.model = model
        async def __call__(self, request: serve.Request) -> str:
            return await self.model.remote(await request.json())

    app = Ingress.bind(Model.bind())

How it works: `deployment` wraps a class or function in a `Deployment` that holds its options
(the deployment keys of an app file: docs/deploy.md); `.options()` copies it with some changed,
`.bind()` records constructor arguments and returns an `Application`. Nothing runs here:
`fleetpulse deploy` imports the module named by an app's `import_path`, walks the graph from the
ingress (shared/appmodel.py, where `Deployment` and `Application` live) and writes one deployment config per bound deployment to
`fp_apps`; a bound deployment among the arguments becomes a handle in the replica that
receives it. A replica imports the class by its own module path, so the decorated object must
be reachable at module level.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, overload

from shared.appmodel import OPTION_NAMES, Application, Deployment, check_options

from .api import Request, Response
from .batching import batch
from .context import ReplicaContext, get_replica_context
from .handle import DeploymentHandle, DeploymentResponse, DeploymentResponseGenerator
from .ingress import ingress
from .multiplex import get_multiplexed_model_id, multiplexed
from .run import (
    RayServeException,
    ServeStatus,
    delete,
    get_app_handle,
    get_deployment_handle,
    run,
    shutdown,
    start,
    status,
)


@overload
def deployment(_func_or_class: Callable[..., Any], /) -> Deployment: ...
@overload
def deployment(
    _func_or_class: None = None, /, *, name: str | None = None, **options: Any
) -> Callable[[Callable[..., Any]], Deployment]: ...


def deployment(
    _func_or_class: Callable[..., Any] | None = None, /, *, name: str | None = None, **options: Any
) -> Deployment | Callable[[Callable[..., Any]], Deployment]:
    """`@serve.deployment` or `@serve.deployment(name=..., num_replicas=..., ...)`."""
    check_options(options)

    def wrap(target: Callable[..., Any]) -> Deployment:
        if isinstance(target, Deployment):
            raise TypeError(f"{target.name!r} is a deployment already")
        return Deployment(target, name or str(getattr(target, "__name__", "Deployment")), options)

    return wrap if _func_or_class is None else wrap(_func_or_class)


__all__ = [
    "OPTION_NAMES",
    "Application",
    "Deployment",
    "DeploymentHandle",
    "DeploymentResponse",
    "DeploymentResponseGenerator",
    "RayServeException",
    "ReplicaContext",
    "Request",
    "Response",
    "ServeStatus",
    "batch",
    "delete",
    "deployment",
    "get_app_handle",
    "get_deployment_handle",
    "get_multiplexed_model_id",
    "get_replica_context",
    "ingress",
    "multiplexed",
    "run",
    "shutdown",
    "start",
    "status",
]

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
            return await self.model.remote(request)

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
from .context import (
    ReplicaContext,
    get_app_handle,
    get_deployment_handle,
    get_replica_context,
)
from .handle import DeploymentHandle, DeploymentResponse, DeploymentResponseGenerator


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


def _not_offered(name: str, instead: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"serve.{name}() is not offered by fleetpulse: {instead}")

    refuse.__name__ = name
    return refuse


# Ray Serve's driver-side calls: fleetpulse's CLI does their jobs (docs/deploy.md, "Porting")
run = _not_offered("run", "deploy the app's config file with `fleetpulse deploy`")
start = _not_offered("start", "start the services with `fleetpulse up` or docker compose")
status = _not_offered("status", "use `fleetpulse status`")
delete = _not_offered("delete", "use `fleetpulse delete APP`")
shutdown = _not_offered("shutdown", "stop the services (`fleetpulse up` stops on Ctrl-C)")

__all__ = [
    "OPTION_NAMES",
    "Application",
    "Deployment",
    "DeploymentHandle",
    "DeploymentResponse",
    "DeploymentResponseGenerator",
    "ReplicaContext",
    "Request",
    "Response",
    "batch",
    "delete",
    "deployment",
    "get_app_handle",
    "get_deployment_handle",
    "get_replica_context",
    "run",
    "shutdown",
    "start",
    "status",
]

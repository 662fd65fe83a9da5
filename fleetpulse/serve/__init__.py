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
ingress (fleetpulse/serve/graph.py) and writes one deployment config per bound deployment to
`fp_apps`; a bound deployment among the arguments becomes a handle in the replica that
receives it. A replica imports the class by its own module path, so the decorated object must
be reachable at module level.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, overload

from .api import Request, Response
from .batching import batch
from .context import (
    ReplicaContext,
    get_app_handle,
    get_deployment_handle,
    get_replica_context,
)
from .handle import DeploymentHandle, DeploymentResponse, DeploymentResponseGenerator

OPTION_NAMES = frozenset(
    [
        "num_replicas",
        "max_ongoing_requests",
        "autoscaling_config",
        "user_config",
        "health_check_period_s",
        "health_check_timeout_s",
        "graceful_shutdown_timeout_s",
        "push_metrics",
        "ray_actor_options",
        "max_queued_requests",
        "max_replicas_per_node",
        "logging_config",
        "placement_group_bundles",
        "placement_group_strategy",
        "graceful_shutdown_wait_loop_s",
        "request_router_config",
        "version",
        "route_prefix",
        "max_concurrent_queries",
    ]
)
"""What `@serve.deployment(...)` and `.options(...)` take: the deployment keys of an app file
and Ray Serve's others. Whether fleetpulse supports a value is decided at deploy, by the same
check as for the file, so the message is the same for code and config."""


@dataclass(frozen=True, slots=True)
class Deployment:
    """A class or function with deployment options; `.bind()` makes it part of an app."""

    func_or_class: Any
    name: str
    options_given: Mapping[str, Any] = field(default_factory=dict)
    """The options set in code, by their app-file key (not defaults)."""

    def options(self, *, name: str | None = None, **options: Any) -> Deployment:
        """A copy with these options changed (and perhaps another name)."""
        _check_options(options)
        return Deployment(
            self.func_or_class,
            self.name if name is None else name,
            {**self.options_given, **options},
        )

    def bind(self, *args: Any, **kwargs: Any) -> Application:
        """An application node: this deployment with its constructor arguments, which may hold
        other bound deployments (they become handles in the replica)."""
        return Application(self, args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"deployment {self.name!r} is not called directly: use {self.name}.bind(...) to build "
            "an application, and `fleetpulse deploy` to run it"
        )

    @property
    def __fleetpulse_target__(self) -> Any:
        """What the replica runs (services/replica/usercode.py unwraps it)."""
        return self.func_or_class


@dataclass(frozen=True, slots=True, eq=False)
class Application:
    """A bound deployment: the root of an application graph (identity matters: the same node
    bound twice is one deployment)."""

    deployment: Deployment
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]


def _check_options(options: Mapping[str, Any]) -> None:
    unknown = sorted(set(options) - OPTION_NAMES)
    if unknown:
        raise TypeError(
            f"unknown deployment option(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(sorted(OPTION_NAMES))}"
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
    _check_options(options)

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

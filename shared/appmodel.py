"""Ray Serve's code-first app model as data (`Deployment`, `Application`) and its graph walk ->
the deployments `fleetpulse deploy` writes (pure: imports nothing but shared/appgraph.py).

The user API (`fleetpulse.serve`) re-exports the two types and wraps them in its
`@serve.deployment` decorator; they live here so the app builder (shared/appbuild.py), which
`fleetpulse deploy`, `fleetpulse up --config` and `replay --what-if` use, imports no service.

How the walk works: from the ingress node, every bound deployment reachable through constructor
arguments (at any depth of lists, tuples and mappings) is visited once; a node reached twice is
one deployment. Each becomes a `BuiltDeployment`: its name, the import path of its class or
function, its constructor arguments with every bound deployment replaced by a handle marker
(shared/appgraph.py), and the options set in code. Two different nodes with one name are
renamed `Name_1`, `Name_2`, ... as Ray Serve does. Arguments must be JSON values: they are
stored in fp_apps and every replica reads them from there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.appgraph import BuiltApp, BuiltDeployment, handle_ref

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
        check_options(options)
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


def check_options(options: Mapping[str, Any]) -> None:
    unknown = sorted(set(options) - OPTION_NAMES)
    if unknown:
        raise TypeError(
            f"unknown deployment option(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(sorted(OPTION_NAMES))}"
        )


class GraphError(Exception):
    """The graph cannot be deployed; the message says which deployment and what to do."""


def build(root: Application) -> BuiltApp:
    names: dict[int, str] = {}
    taken: dict[str, int] = {}
    out: list[BuiltDeployment] = []
    order: list[Application] = []
    _collect(root, names, taken, order, set())
    for node in order:
        d = node.deployment
        name = names[id(node)]
        where = f"deployment {name!r}"
        args = tuple(_plain(a, names, f"{where}: argument {i}") for i, a in enumerate(node.args))
        kwargs = {k: _plain(v, names, f"{where}: argument {k!r}") for k, v in node.kwargs.items()}
        reconfigure = callable(getattr(d.func_or_class, "reconfigure", None))
        out.append(
            BuiltDeployment(
                name, import_path_of(d), args, kwargs, dict(d.options_given), reconfigure
            )
        )
    return BuiltApp(names[id(root)], tuple(out))


def _collect(
    node: Application,
    names: dict[int, str],
    taken: dict[str, int],
    order: list[Application],
    visiting: set[int],
) -> None:
    if id(node) in names:
        return
    if id(node) in visiting:
        raise GraphError(f"deployment {node.deployment.name!r} is bound into itself")
    visiting.add(id(node))
    for value in (*node.args, *node.kwargs.values()):
        for child in _children(value):
            _collect(child, names, taken, order, visiting)
    base = node.deployment.name
    n = taken.get(base, 0)
    taken[base] = n + 1
    names[id(node)] = base if n == 0 else f"{base}_{n}"
    order.append(node)


def _children(value: Any) -> list[Application]:
    if isinstance(value, Application):
        return [value]
    if isinstance(value, Deployment):
        raise GraphError(
            f"deployment {value.name!r} is passed unbound; pass {value.name}.bind(...) instead"
        )
    if isinstance(value, list | tuple):
        return [c for v in value for c in _children(v)]
    if isinstance(value, dict):
        return [c for v in value.values() for c in _children(v)]
    return []


def _plain(value: Any, names: Mapping[int, str], where: str) -> Any:
    """A JSON value, bound deployments as handle markers."""
    if isinstance(value, Application):
        return handle_ref(names[id(value)])
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise GraphError(f"{where} is {value}; JSON (how fp_apps stores it) has no such number")
        return value
    if isinstance(value, list | tuple):
        return [_plain(v, names, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        for k in value:
            if not isinstance(k, str):
                raise GraphError(f"{where} has the key {k!r}; only string keys can be stored")
        return {k: _plain(v, names, f"{where}.{k}") for k, v in value.items()}
    raise GraphError(
        f"{where} is a {type(value).__name__}: constructor arguments are stored as JSON in "
        "fp_apps and read by every replica; pass strings, numbers, lists, mappings or bound "
        "deployments, and build other objects in the constructor"
    )


def import_path_of(d: Deployment) -> str:
    """`module:QualName` of the deployment's class or function, which a replica can import."""
    target = d.func_or_class
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise GraphError(f"deployment {d.name!r} wraps {target!r}, not a class or function")
    if module == "__main__":
        raise GraphError(
            f"deployment {d.name!r} is defined in the script being run (__main__); "
            "move it into a module the replicas can import"
        )
    if "<locals>" in qualname:
        raise GraphError(
            f"deployment {d.name!r} ({module}:{qualname}) is defined inside a function; "
            "define it at module level so a replica can import it"
        )
    return f"{module}:{qualname}"

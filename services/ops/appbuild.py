"""The build step of `fleetpulse deploy`: import an app's `import_path` and build its graph.

This is the one place fleetpulse imports application code outside a replica: where `deploy`
runs, which must therefore see the code (its working directory, `--app-dir`, PYTHONPATH). The
controller never imports it. `import_path` names a bound application (`module:app`) or a builder
function (`module:build`) that takes the app's `args` and returns one. While the module is
imported and the builder runs, the app's `runtime_env.env_vars` are set in the environment, as
they are in the replicas, so a builder that reads them sees the same values.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from fleetpulse.serve import Application, Deployment
from fleetpulse.serve.graph import GraphError, build
from shared.appgraph import BuiltApp


class BuildError(Exception):
    """The app cannot be built; the message names the module or function and the cause."""


def build_app(import_path: str, args: Mapping[str, Any] | None, env: Mapping[str, str]) -> BuiltApp:
    with _environment(env):
        target = _resolve(import_path)
        app = _application(target, import_path, args)
    try:
        return build(app)
    except GraphError as exc:
        raise BuildError(str(exc)) from None


def add_app_dir(path: str) -> None:
    """Make `path` importable first (Ray Serve's `--app-dir`)."""
    full = os.path.abspath(path)
    if full not in sys.path:
        sys.path.insert(0, full)


def _resolve(import_path: str) -> Any:
    module_name, _, attr = import_path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise BuildError(
            f"cannot import {module_name!r}: {type(exc).__name__}: {exc} (deploy imports the "
            "application to build it: run it where the code is importable, or pass --app-dir)"
        ) from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise BuildError(f"module {module_name!r} has no attribute {attr!r}") from None
    return obj


def _application(target: Any, import_path: str, args: Mapping[str, Any] | None) -> Application:
    if isinstance(target, Application):
        if args:
            raise BuildError(
                f"{import_path} is a bound application, so it takes no args; "
                "name a builder function (one taking `args`) or remove args"
            )
        return target
    if isinstance(target, Deployment):
        raise BuildError(
            f"{import_path} is a deployment, not an application: name `{target.name}.bind(...)` "
            "(assign it at module level, e.g. `app = ...`) or a builder function"
        )
    if not callable(target) or inspect.isclass(target):
        raise BuildError(
            f"{import_path} is a {type(target).__name__}; expected a bound application "
            "(`app = Ingress.bind(...)`) or a builder function taking `args`"
        )
    try:
        built = target(_builder_arg(target, dict(args or {})))
    except BuildError:
        raise
    except Exception as exc:
        raise BuildError(
            f"the builder {import_path} raised {type(exc).__name__}: {exc} (with args "
            f"{dict(args or {})})"
        ) from None
    if not isinstance(built, Application):
        raise BuildError(
            f"the builder {import_path} returned a {type(built).__name__}; it must return a bound "
            "application (`Ingress.bind(...)`)"
        )
    return built


def _builder_arg(builder: Any, args: dict[str, Any]) -> Any:
    """The args as the builder's annotation asks: a dict, or a pydantic model or dataclass built
    from them (Ray Serve's typed builders)."""
    try:
        params = list(inspect.signature(builder).parameters.values())
    except (TypeError, ValueError):
        return args
    if not params:
        raise BuildError(f"the builder {builder.__qualname__}() takes no argument; add `args`")
    kind = params[0].annotation
    if isinstance(kind, str):  # `from __future__ import annotations`
        kind = builder.__globals__.get(kind, kind) if hasattr(builder, "__globals__") else kind
    try:
        if hasattr(kind, "model_validate"):
            return kind.model_validate(args)
        if hasattr(kind, "parse_obj"):
            return kind.parse_obj(args)
        if inspect.isclass(kind) and hasattr(kind, "__dataclass_fields__"):
            return kind(**args)
    except Exception as exc:
        raise BuildError(f"args do not fit {kind.__name__}: {exc}") from None
    return args


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

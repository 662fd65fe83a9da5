"""The build step of `fleetpulse deploy` (also `fleetpulse up --config` and `replay --what-if`):
import an app's `import_path` and build its graph; `check_file`/`build_apps` read, check and
build a whole app file.

This is the one place fleetpulse imports application code outside a replica (besides a custom
policy's check, shared/policyapi.py): where `deploy` runs, which must therefore see the code (its working directory, `--app-dir`, PYTHONPATH). The
controller never imports it. `import_path` names a bound application (`module:app`) or a builder
function (`module:build`) that takes the app's `args` and returns one. While the module is
imported and the builder runs, the app's `runtime_env.env_vars` are set in the environment, as
they are in the replicas, so a builder that reads them sees the same values, and its
`working_dir` and `py_modules` are first on sys.path (`code_paths`).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from shared.appconfig import AppConfig
from shared.appgraph import BuiltApp
from shared.appmodel import Application, Deployment, GraphError, build
from shared.appyaml import Problem, problems_error, read_app_file
from shared.errors import ConfigError
from shared.policyapi import policy_problem
from shared.serveconfig import Checked, CodeApp, check_config


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


def check_file(path: str, *, dry_run: bool, app_dir: str = ".") -> Checked:
    """The checked file: apps defined in code built (unless a dry run), policies imported
    (unless a dry run). A file that cannot be read is one problem."""
    try:
        text = read_app_file(path)
    except ConfigError as exc:
        return Checked(problems=[_unreadable(exc)])
    if dry_run:
        return check_config(text)
    add_app_dir(app_dir)

    def build(code: CodeApp) -> BuiltApp:
        with code_paths(code.runtime_env):
            return build_app(code.import_path, code.args, code.env)

    return check_config(text, check_policy=policy_problem, build=build)


def build_apps(path: str, app_dir: str = ".") -> list[AppConfig]:
    """Every app of the file, those defined in code built (for `fleetpulse up --config`);
    ConfigError listing every problem. Warnings go to stderr."""
    checked = check_file(path, dry_run=False, app_dir=app_dir)
    for warning in checked.warnings:
        print(f"warning: {warning.render(path)}", file=sys.stderr)
    if checked.problems:
        raise problems_error(checked.problems, path)
    return checked.apps


def _unreadable(exc: ConfigError) -> Problem:
    return Problem("", None, str(exc).split(": ", 1)[-1])


@contextlib.contextmanager
def code_paths(runtime_env: Mapping[str, Any]) -> Iterator[None]:
    """While an app is built, its runtime_env's working_dir (then its py_modules' parents) come
    first on sys.path, as they will in its replicas; a zip URL is fetched and unpacked into a
    temporary directory for it. (Modules stay imported after the build: two apps of one file
    with different modules of the same name cannot both be built in one deploy.)"""
    paths: list[str] = []
    with tempfile.TemporaryDirectory(prefix="fleetpulse-build-") as tmp:
        for i, entry in enumerate(
            [runtime_env.get("working_dir"), *(runtime_env.get("py_modules") or [])]
        ):
            if not isinstance(entry, str):
                continue
            if entry.startswith("https://"):
                paths.append(str(_fetched(entry, Path(tmp) / str(i))))
            elif i == 0:
                paths.append(os.path.abspath(os.path.expanduser(entry)))
            else:
                paths.append(os.path.dirname(os.path.abspath(os.path.expanduser(entry))))
        sys.path[:0] = paths
        try:
            yield
        finally:
            for p in paths:
                if p in sys.path:
                    sys.path.remove(p)


def _fetched(url: str, dest: Path) -> Path:
    from shared import packages  # only a build with a URL needs it

    zip_path = dest.with_suffix(".zip")
    try:
        packages.download(url, zip_path, limit=packages.MAX_PACKAGE_BYTES)
        root = packages.unpack(zip_path, dest, max_bytes=packages.MAX_UNPACKED_BYTES)
    except (OSError, packages.PackageError) as exc:
        raise BuildError(f"cannot fetch the working_dir {url}: {exc}") from None
    return packages.strip_single_top(root)


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

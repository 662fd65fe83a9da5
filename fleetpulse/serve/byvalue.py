"""Deployments defined in a script, shipped to the replicas by value (for `serve.run`).

A replica imports its deployment by `module:Attribute` (services/replica/usercode.py). A class
defined in the script being run lives in `__main__`, which a replica cannot import: its own
`__main__` is the replica, and importing the script again under its file name would run its top
level again, `serve.run(...)` and `requests.post(...)` included. The same holds for a class
defined inside a function. So `serve.run` pickles such a class or function by value
(cloudpickle: its code, and the script's globals it uses; modules it uses travel by name and are
imported in the replica) into a file, and names it by an import path into this module:

    fleetpulse.serve.byvalue:Model_3f9a0c41d2b7e8a65c1d0f4e

This module answers an attribute lookup (a module `__getattr__`) by reading
`<Name>_<digest>.fpkl` from the directory in $FLEETPULSE_SERVE_BYVALUE_DIR, which `serve.run`
puts in the application's `runtime_env.env_vars` (so the replicas of that app, and only they,
have it). The digest is the file's sha256 (its first 24 hex digits): a changed class is a new
name, hence a new deployment version and a rollout, and a file that does not match its name is
refused. A loaded object is kept in the module, so it is unpickled once per replica.

The file must be readable where the replica runs: the machine that ran the script (its local
system, or agents on that machine). Replicas elsewhere fail to start with a message saying so.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from pathlib import Path
from typing import Any

ENV_DIR = "FLEETPULSE_SERVE_BYVALUE_DIR"
"""The directory of an app's pickled deployments (set by `serve.run` in runtime_env.env_vars)."""
SUFFIX = ".fpkl"
DIGEST_CHARS = 24
_NAME_RE = re.compile(rf"(?P<stem>[A-Za-z_]\w*?)_(?P<digest>[0-9a-f]{{{DIGEST_CHARS}}})")


class ByValueError(RuntimeError):
    """A shipped deployment cannot be loaded; the message says which file and why."""


def needs_by_value(target: Any) -> bool:
    """True for a class or function a replica cannot import by its own name: one defined in the
    script being run (`__main__`) or inside a function."""
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", "")
    return module == "__main__" or "<locals>" in str(qualname)


def ship(target: Any, directory: Path) -> str:
    """Pickle `target` by value into `directory`; the attribute name that loads it."""
    import cloudpickle

    # cloudpickle pickles what a replica could not import by name (a class of `__main__`, one
    # defined in a function) by value, and everything else it refers to by name
    reducers = _reducers()

    class Pickler(cloudpickle.CloudPickler):  # type: ignore[misc]
        def reducer_override(self, obj: Any) -> Any:
            reduce = reducers.get(type(obj))
            return reduce(obj) if reduce is not None else super().reducer_override(obj)

    out = io.BytesIO()
    Pickler(out).dump(target)
    blob = out.getvalue()
    digest = hashlib.sha256(blob).hexdigest()[:DIGEST_CHARS]
    qualname = str(getattr(target, "__qualname__", "deployment")).rsplit(".", 1)[-1]
    stem = re.sub(r"\W+", "_", qualname).strip("_") or "deployment"
    if not stem[0].isalpha():
        stem = "d_" + stem
    name = f"{stem}_{digest}"
    path = directory / f"{name}{SUFFIX}"
    if not path.exists():  # content-addressed: an existing file holds these very bytes
        directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(blob)
        tmp.replace(path)
    return name


def _reducers() -> dict[type, Any]:
    """Reductions for objects of common libraries that pickle cannot rebuild by itself: a
    Starlette `State` (a FastAPI app's `app.state`) answers every attribute lookup from a dict
    it does not have yet while being unpickled, and recurses until the stack runs out."""
    out: dict[type, Any] = {}
    try:
        from starlette.datastructures import State
    except ImportError:
        return out
    out[State] = lambda state: (State, (dict(state._state),))
    return out


def load(name: str, directory: str | None) -> Any:
    """The object shipped under `name` (ByValueError when it cannot be)."""
    match = _NAME_RE.fullmatch(name)
    if match is None:
        raise ByValueError(f"{name!r} is not the name of a deployment shipped by serve.run")
    if not directory:
        raise ByValueError(
            f"cannot load {name}: ${ENV_DIR} is not set in this replica's environment "
            "(serve.run sets it in the application's runtime_env.env_vars)"
        )
    path = Path(directory) / f"{name}{SUFFIX}"
    try:
        blob = path.read_bytes()
    except OSError as exc:
        raise ByValueError(
            f"cannot read {path} ({exc.strerror or exc}): serve.run wrote it on the machine "
            "that ran the script, and this replica runs where that file is not (run the agent "
            "on that machine, or put the deployment in a module the replicas can import)"
        ) from None
    if hashlib.sha256(blob).hexdigest()[:DIGEST_CHARS] != match["digest"]:
        raise ByValueError(f"{path} does not hold what serve.run wrote under that name")
    import cloudpickle

    try:
        return cloudpickle.loads(blob)
    except Exception as exc:
        raise ByValueError(
            f"cannot unpickle {name} from {path}: {type(exc).__name__}: {exc} (a module the "
            "script imports must be importable where the replicas run)"
        ) from exc


def __getattr__(name: str) -> Any:
    """`fleetpulse.serve.byvalue:<Name>_<digest>`, as the replica's import path resolves it."""
    if name.startswith("__") or _NAME_RE.fullmatch(name) is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    target = load(name, os.environ.get(ENV_DIR))
    globals()[name] = target
    return target

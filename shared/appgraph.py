"""An application graph as `fleetpulse deploy` builds it, and its handle markers in `fp_apps`.

`BuiltApp` is what the build step (shared/appbuild.py over shared/appmodel.py)
hands the config checker (shared/serveconfig.py): plain data, so the checker imports no code.

`fleetpulse deploy` builds an application graph (fleetpulse.serve) and writes each deployment's
constructor arguments as JSON. A bound deployment among them becomes the one-key object
`{"$fleetpulse_handle": "DeploymentName"}` (a deployment of the same application); the replica
replaces each such object with a handle to that deployment before it calls the constructor. The
marker key is part of the fp_apps contract (schemas/v1/kv/app.schema.json).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

HANDLE_KEY = "$fleetpulse_handle"


def handle_ref(deployment: str) -> dict[str, str]:
    return {HANDLE_KEY: deployment}


def ref_name(value: Any) -> str | None:
    """The deployment a marker names, or None when `value` is not a marker."""
    if isinstance(value, dict) and len(value) == 1 and isinstance(value.get(HANDLE_KEY), str):
        name: str = value[HANDLE_KEY]
        return name
    return None


def replace_refs(value: Any, make: Callable[[str], Any]) -> Any:
    """`value` with every marker (in lists and mappings, at any depth) replaced by `make(name)`."""
    name = ref_name(value)
    if name is not None:
        return make(name)
    if isinstance(value, list | tuple):
        return type(value)(replace_refs(v, make) for v in value)
    if isinstance(value, dict):
        return {k: replace_refs(v, make) for k, v in value.items()}
    return value


def referenced(value: Any) -> set[str]:
    """The deployments named by markers anywhere in `value`."""
    found: set[str] = set()
    replace_refs(value, lambda name: found.add(name))
    return found


@dataclass(frozen=True, slots=True)
class BuiltDeployment:
    """One bound deployment: where its code is, its constructor arguments (JSON values, bound
    deployments as markers) and the options set in code (app-file keys)."""

    name: str
    import_path: str
    init_args: tuple[Any, ...]
    init_kwargs: Mapping[str, Any]
    options: Mapping[str, Any]
    has_reconfigure: bool = False


@dataclass(frozen=True, slots=True)
class BuiltApp:
    ingress: str
    deployments: tuple[BuiltDeployment, ...]

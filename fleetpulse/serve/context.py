"""Where user code runs: the replica context and handles to other deployments.

The replica process (services/replica) calls `_enter()` before it constructs the user's class,
so a constructor may already call `get_replica_context()` or `get_deployment_handle()`, as in
Ray Serve. Outside a replica both raise RuntimeError.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shared.bus import Bus
    from shared.subjects import Subjects

    from .handle import DeploymentHandle


@dataclass(frozen=True, slots=True)
class ReplicaContext:
    """Who this replica is (Ray Serve's `ReplicaContext` fields, ids as strings)."""

    app_name: str
    deployment: str
    replica_id: str
    servable_object: Any = None
    """The user's instance, once constructed."""

    @property
    def replica_tag(self) -> str:
        """Ray Serve's older name of the replica id."""
        return self.replica_id


@dataclass(slots=True)
class _Host:
    context: ReplicaContext
    bus: Bus
    loop: asyncio.AbstractEventLoop
    subjects: Subjects


_host: _Host | None = None


def _enter(
    context: ReplicaContext, bus: Bus, loop: asyncio.AbstractEventLoop, subjects: Subjects
) -> None:
    global _host
    _host = _Host(context, bus, loop, subjects)


def _set_servable(instance: Any) -> None:
    if _host is not None:
        c = _host.context
        _host.context = ReplicaContext(c.app_name, c.deployment, c.replica_id, instance)


def _leave() -> None:
    global _host
    _host = None


def _need_host(what: str) -> _Host:
    if _host is None:
        raise RuntimeError(
            f"{what} may only be called inside a deployment's replica (fleetpulse runs the code "
            "in replica processes: `fleetpulse deploy` an application and call it from there)"
        )
    return _host


def get_replica_context() -> ReplicaContext:
    """The running replica's app name, deployment name and replica id."""
    return _need_host("serve.get_replica_context()").context


def get_deployment_handle(deployment_name: str, app_name: str | None = None) -> DeploymentHandle:
    """A handle to a deployment (of this replica's application unless `app_name` is given)."""
    from .handle import DeploymentHandle

    host = _need_host("serve.get_deployment_handle()")
    app = host.context.app_name if app_name is None else app_name
    return DeploymentHandle._connect(app, deployment_name, host.bus, host.loop, host.subjects)


def get_app_handle(name: str) -> DeploymentHandle:
    """A handle to another application's ingress deployment. fleetpulse needs the deployment's
    name for that: use `get_deployment_handle(deployment, app_name)`."""
    raise NotImplementedError(
        f"get_app_handle({name!r}): fleetpulse addresses a deployment by (app, deployment); "
        f"use serve.get_deployment_handle('<IngressDeployment>', app_name={name!r})"
    )

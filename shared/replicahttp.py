"""Which replicas serve HTTP themselves, and how they learn it (docs/dataplane.md, "HTTP served by
the replica").

The replicas of an app's ingress deployment (the app has a `route_prefix`; the ingress is the
app's `ingress`, else its only or first deployment, as the proxy reads it) run an HTTP server of
their own. The controller tells them by a variable in their spec's environment,
`FLEETPULSE_REPLICA_ROUTE_PREFIX` = the app's route prefix, added to the deployment's config as
the controller takes it in (never stored in fp_apps). Being in the spec, it is part of the
replicas' version: a route prefix given, changed or taken away rolls the ingress replicas onto
processes that serve (or stop serving) under the new prefix; other deployments are untouched.
Where a replica binds and what address it announces are the agent's settings
(shared/settings.py `REPLICA_HTTP_HOST`, `REPLICA_HTTP_ADVERTISE`), passed in the environment too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Final

from shared.appconfig import AppConfig, DeploymentConfig

ROUTE_PREFIX_ENV: Final = "FLEETPULSE_REPLICA_ROUTE_PREFIX"
"""Set (to the app's route prefix) for the replicas of an app's ingress deployment only."""


def ingress_name(app: AppConfig) -> str | None:
    """The deployment that serves the app's HTTP requests, or None (no route prefix)."""
    if app.route_prefix is None:
        return None
    return app.ingress or app.deployments[0].name


def with_serving_env(app: AppConfig, d: DeploymentConfig) -> DeploymentConfig:
    """`d` as its replicas are started: the ingress's with `ROUTE_PREFIX_ENV` in its env (a
    user's own value of that variable is replaced), any other deployment unchanged."""
    if d.name != ingress_name(app):
        return d
    assert app.route_prefix is not None
    if d.env.get(ROUTE_PREFIX_ENV) == app.route_prefix:
        return d
    return dataclasses.replace(d, env={**d.env, ROUTE_PREFIX_ENV: app.route_prefix})


def route_prefix_of(env: Mapping[str, str]) -> str | None:
    """In a replica: its app's route prefix when it is the ingress's replica, else None."""
    value = env.get(ROUTE_PREFIX_ENV)
    return value if value else None

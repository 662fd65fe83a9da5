"""The serviceability rule as a table: idle is not crashed, starting is not serving."""

from __future__ import annotations

import pytest

from services.proxy.registry import route_for
from services.proxy.serviceability import (
    Serviceability,
    app_serviceability,
    deployment_serviceability,
)
from shared.appconfig import AppConfig, AutoscalingConfig, DeploymentConfig
from shared.kv.status import AppStatusView, DeploymentStatusView

S = Serviceability

# (case, running replicas, status, expected)
DEPLOYMENT_TABLE = [
    ("serving while healthy", 3, "HEALTHY", S.SERVING),
    ("scaled to zero does not deregister", 0, "HEALTHY", S.IDLE),
    ("upscaling at zero (the wake-up window) does not", 0, "UPSCALING", S.IDLE),
    ("downscaling at zero (the settle transient) does not", 0, "DOWNSCALING", S.IDLE),
    ("updating at zero does not register", 0, "UPDATING", S.STARTING),
    ("a crash at zero (UNHEALTHY) deregisters", 0, "UNHEALTHY", S.DOWN),
    ("a failed deploy at zero deregisters", 0, "DEPLOY_FAILED", S.DOWN),
    ("an unknown status at zero is not trusted", 0, "REBOOTING", S.UNKNOWN),
    ("no status at all is not trusted", 0, "", S.UNKNOWN),
    ("running replicas serve even while updating", 1, "UPDATING", S.SERVING),
    ("running replicas serve even while unhealthy", 2, "UNHEALTHY", S.SERVING),
    ("running replicas serve even after a failed deploy", 1, "DEPLOY_FAILED", S.SERVING),
    ("a negative count is zero", -1, "HEALTHY", S.IDLE),
]


@pytest.mark.parametrize(
    "running,status,expected",
    [row[1:] for row in DEPLOYMENT_TABLE],
    ids=[r[0] for r in DEPLOYMENT_TABLE],
)
def test_deployment_rule(running: int, status: str, expected: Serviceability) -> None:
    assert deployment_serviceability(running, status) is expected


@pytest.mark.parametrize(
    "serviceability,serviceable",
    [(S.SERVING, True), (S.IDLE, True), (S.STARTING, False), (S.DOWN, False), (S.UNKNOWN, False)],
)
def test_which_kinds_are_serviceable(serviceability: Serviceability, serviceable: bool) -> None:
    assert serviceability.serviceable is serviceable


def d(running: int, status: str) -> Serviceability:
    return deployment_serviceability(running, status)


# (case, deployments, registered, down, blocking)
APP_TABLE = [
    (
        "cold start at min_replicas 0 registers",
        {"api": d(0, "HEALTHY")},
        True, False, (),
    ),
    (
        "a whole app scaled to zero stays registered",
        {"api": d(0, "HEALTHY"), "model": d(0, "DOWNSCALING")},
        True, False, (),
    ),
    (
        "waking from zero stays registered",
        {"api": d(0, "UPSCALING"), "model": d(2, "HEALTHY")},
        True, False, (),
    ),
    (
        "updating at zero does not register (a normal app before it can serve)",
        {"api": d(0, "UPDATING")},
        False, False, ("api",),
    ),
    (
        "one crashed deployment deregisters the app",
        {"api": d(2, "HEALTHY"), "model": d(0, "UNHEALTHY")},
        False, True, ("model",),
    ),
    (
        "crashed deployments are named before starting ones",
        {"a": d(0, "UPDATING"), "b": d(0, "DEPLOY_FAILED"), "c": d(1, "HEALTHY")},
        False, True, ("b", "a"),
    ),
    (
        "an app without deployments is not registered",
        {},
        False, False, (),
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    "deployments,registered,down,blocking",
    [row[1:] for row in APP_TABLE],
    ids=[r[0] for r in APP_TABLE],
)
def test_app_rule(
    deployments: dict[str, Serviceability],
    registered: bool,
    down: bool,
    blocking: tuple[str, ...],
) -> None:
    verdict = app_serviceability(deployments)
    assert (verdict.registered, verdict.down, verdict.blocking) == (registered, down, blocking)


# The cases end to end through the registry: one app with one deployment, as the
# controller reports it in fp_status. (case, running, status, registered, down)
REGISTRATION_TABLE = [
    ("scaled to zero does not deregister", 0, "HEALTHY", True, False),
    ("UPSCALING at zero (the wake-up window) does not", 0, "UPSCALING", True, False),
    ("DOWNSCALING at zero (the settle transient) does not", 0, "DOWNSCALING", True, False),
    ("a crash at zero (UNHEALTHY) does", 0, "UNHEALTHY", False, True),
    ("a failed deploy at zero does", 0, "DEPLOY_FAILED", False, True),
    ("UPDATING at zero does not register", 0, "UPDATING", False, False),
    ("running replicas register", 1, "HEALTHY", True, False),
]


@pytest.mark.parametrize(
    "running,status,registered,down",
    [row[1:] for row in REGISTRATION_TABLE],
    ids=[r[0] for r in REGISTRATION_TABLE],
)
def test_registration_table(running: int, status: str, registered: bool, down: bool) -> None:
    view = DeploymentStatusView(status, "why", 1, running, 0.0, running, 0, "")
    app = AppStatusView("shop", "RUNNING", "/shop", "Api", 0.0, 1, {"Api": view})
    route = route_for("shop", app, None)
    assert (route.registered, route.down) == (registered, down)


def test_cold_start_at_min_replicas_zero_registers_before_any_replica_ran() -> None:
    # what the controller reports right after `fleetpulse deploy` of a min_replicas 0 app
    cfg = AppConfig(
        "shop",
        (DeploymentConfig("Api", "m:C", autoscaling=AutoscalingConfig(min_replicas=0)),),
        route_prefix="/shop",
    )
    fresh = DeploymentStatusView("HEALTHY", "0/0 replicas running", 0, 0, 0.0, 0, 0, "")
    app = AppStatusView("shop", "RUNNING", "/shop", "Api", 0.0, 1, {"Api": fresh})
    assert route_for("shop", app, cfg).registered

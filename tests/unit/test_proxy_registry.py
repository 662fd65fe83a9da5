"""The registry: routes from fp_status and fp_apps, prefix matching, the fp_routes value."""

from __future__ import annotations

import pytest

from services.proxy.registry import Route, RouteTable, build_routes, route_for
from services.proxy.serviceability import Serviceability
from shared.appconfig import AppConfig, DeploymentConfig
from shared.errors import WireError
from shared.kv.status import AppStatusView, DeploymentStatusView


def dep(status: str, running: int = 0, message: str = "") -> DeploymentStatusView:
    return DeploymentStatusView(status, message, running, running, 0.0, running, 0, "")


def view(
    app: str,
    deployments: dict[str, DeploymentStatusView],
    *,
    prefix: str | None = "/x",
    ingress: str | None = None,
    status: str = "RUNNING",
) -> AppStatusView:
    return AppStatusView(app, status, prefix, ingress, 1.0, 1, deployments)


def config(
    app: str, *names: str, prefix: str | None = "/x", ingress: str | None = None
) -> AppConfig:
    deployments = tuple(DeploymentConfig(n, "services.examples.echo:Echo") for n in names)
    return AppConfig(app, deployments, route_prefix=prefix, ingress=ingress)


def test_scaled_to_zero_app_is_registered_and_says_it_wakes() -> None:
    route = route_for("shop", view("shop", {"Api": dep("HEALTHY")}, ingress="Api"), None)
    assert route.registered and not route.down
    assert route.ingress == "Api"
    assert "Api" in route.reason and "zero" in route.reason
    assert route.deployments["Api"].serviceability is Serviceability.IDLE


def test_crashed_deployment_deregisters_with_the_controllers_message() -> None:
    st = view(
        "shop",
        {"Api": dep("HEALTHY", 2), "Model": dep("DEPLOY_FAILED", message="3 replicas failed")},
        ingress="Api",
    )
    route = route_for("shop", st, None)
    assert not route.registered and route.down
    assert route.reason == "Model: DEPLOY_FAILED with no replica running: 3 replicas failed"


def test_updating_at_zero_is_not_registered_but_not_down() -> None:
    route = route_for("shop", view("shop", {"Api": dep("UPDATING")}), None)
    assert not route.registered and not route.down
    assert route.ingress == "Api"  # the only deployment
    assert "UPDATING" in route.reason


def test_deployed_app_without_status_is_known_not_registered() -> None:
    routes = build_routes({}, {"shop": config("shop", "Api", "Model")})
    route = routes["shop"]
    assert not route.registered and not route.down
    assert route.ingress == "Api"  # default: the first deployment
    assert route.route_prefix == "/x"
    assert "controller" in route.reason
    assert set(route.deployments) == {"Api", "Model"}


def test_config_names_the_deployments_and_missing_statuses_block() -> None:
    # the controller has not reported the deployment a redeploy added
    st = view("shop", {"Api": dep("HEALTHY", 1)}, ingress="Api")
    route = route_for("shop", st, config("shop", "Api", "Extra", prefix="/new"))
    assert not route.registered
    assert route.route_prefix == "/new"  # the deployed config is the newest word
    assert route.reason == "Extra: no status from a controller yet"
    assert route.deployments["Extra"].serviceability is Serviceability.UNKNOWN


def test_deleting_and_ingressless_apps_are_not_registered() -> None:
    deleting = route_for("a", view("a", {"Api": dep("HEALTHY", 1)}, status="DELETING"), None)
    assert not deleting.registered and "deleted" in deleting.reason
    two = view("b", {"Api": dep("HEALTHY", 1), "Model": dep("HEALTHY", 1)})
    no_ingress = route_for("b", two, None)
    assert not no_ingress.registered and "ingress" in no_ingress.reason


def test_registered_reason_when_everything_runs() -> None:
    route = route_for("a", view("a", {"Api": dep("HEALTHY", 2)}), None)
    assert route.registered and route.reason == "every deployment has running replicas"


def test_longest_prefix_on_whole_segments() -> None:
    routes = build_routes(
        {
            "root": view("root", {"D": dep("HEALTHY", 1)}, prefix="/"),
            "shop": view("shop", {"D": dep("HEALTHY", 1)}, prefix="/shop"),
            "cart": view("cart", {"D": dep("HEALTHY", 1)}, prefix="/shop/cart"),
            "nohttp": view("nohttp", {"D": dep("HEALTHY", 1)}, prefix=None),
        },
        {},
    )
    table = RouteTable(routes)

    def app(path: str) -> str | None:
        route = table.match(path)
        return route.app if route else None

    assert app("/shop") == "shop"
    assert app("/shop/") == "shop"
    assert app("/shop/items/1") == "shop"
    assert app("/shop/cart") == "cart"
    assert app("/shop/cart/42") == "cart"
    assert app("/shopping") == "root"  # not a segment of /shop
    assert app("/") == "root"
    assert app("/anything/else") == "root"
    assert table.registered == 4
    without_root = RouteTable({k: v for k, v in routes.items() if k != "root"})
    assert without_root.match("/shopping") is None
    assert without_root.match("/") is None


def test_deregistered_apps_still_match_so_they_answer_503_not_a_shorter_prefix() -> None:
    table = RouteTable(
        build_routes(
            {
                "root": view("root", {"D": dep("HEALTHY", 1)}, prefix="/"),
                "shop": view("shop", {"D": dep("UNHEALTHY")}, prefix="/shop"),
            },
            {},
        )
    )
    route = table.match("/shop/x")
    assert route is not None and route.app == "shop" and not route.registered


def test_duplicate_prefixes_resolve_to_the_first_app_by_name() -> None:
    st = {n: view(n, {"D": dep("HEALTHY", 1)}, prefix="/same") for n in ("b", "a")}
    route = RouteTable(build_routes(st, {})).match("/same")
    assert route is not None and route.app == "a"


def test_route_json_round_trip_is_stable() -> None:
    route = route_for(
        "shop", view("shop", {"Api": dep("HEALTHY"), "M": dep("UNHEALTHY", message="boom")}), None
    )
    data = route.to_json()
    assert Route.from_json(data) == route
    assert (
        route_for(
            "shop",
            view("shop", {"M": dep("UNHEALTHY", message="boom"), "Api": dep("HEALTHY")}),
            None,
        ).to_json()
        == data
    )  # same inputs, same bytes: proxies that agree write nothing new


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"[]",
        b'{"v": 2, "kind": "route"}',
        b'{"v": 1, "kind": "route", "app": "a"}',
        b'{"v":1,"kind":"route","app":"a","route_prefix":3,"ingress":null,"registered":true,'
        b'"down":false,"reason":"","deployments":{}}',
    ],
)
def test_bad_route_values_are_wire_errors(data: bytes) -> None:
    with pytest.raises(WireError):
        Route.from_json(data)

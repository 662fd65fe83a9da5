"""`fleetpulse status` rendering: pure functions over decoded fp_status / fp_apps values."""

from __future__ import annotations

import pytest
from rich.console import Console
from rich.table import Table

from services.ops.group_view import (
    LEGACY_STALE_AFTER_S,
    GroupView,
    group_notes,
    unattended,
)
from services.ops.status import WIDE_MIN_WIDTH, format_age, render_table, status_json
from shared.appconfig import AppConfig, AutoscalingConfig, DeploymentConfig
from shared.kv.group import ControllerMember, PartitionLease
from shared.kv.status import AppStatusView, DeploymentStatusView

NOW = 1_700_000_000.0
PARTITION = 2
EPOCH = 3
LOOKED_AFTER = GroupView(
    {"c1": ControllerMember("c1", (PARTITION,))}, {PARTITION: PartitionLease("c1", EPOCH)}
)
"""The group in which the statuses of `view` are looked after."""
OWNER_GONE = GroupView({}, {PARTITION: PartitionLease("c1", EPOCH)})


def dep(status: str = "HEALTHY", **kw: object) -> DeploymentStatusView:
    fields: dict[str, object] = {
        "status": status,
        "message": "",
        "target_replicas": 2,
        "running_replicas": 2,
        "demand": 1.5,
        "healthy_replicas": 2,
        "unhealthy_replicas": 0,
        "last_decision": "hold: demand 1.5 within target",
    }
    fields.update(kw)
    return DeploymentStatusView(**fields)  # type: ignore[arg-type]


def view(
    app: str,
    status: str,
    age: float,
    partition: int | None = PARTITION,
    **deployments: DeploymentStatusView,
) -> AppStatusView:
    return AppStatusView(
        app=app,
        status=status,
        route_prefix=f"/{app}",
        ingress=next(iter(deployments), None),
        updated_at=NOW - age,
        owner_epoch=EPOCH,
        deployments=deployments,
        partition=partition,
    )


def config(app: str, *names: str, autoscaling: AutoscalingConfig | None = None) -> AppConfig:
    deployments = tuple(
        DeploymentConfig(
            name=n,
            import_path="m:C",
            num_replicas=None if autoscaling else 2,
            autoscaling=autoscaling,
        )
        for n in names
    )
    return AppConfig(app, deployments, route_prefix=f"/{app}", ingress=names[0])


def text_of(table: Table, width: int = 160) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(table)
    return console.export_text()


def test_json_shape_is_exact() -> None:
    statuses = {
        "echo": view(
            "echo",
            "UNHEALTHY",
            4.0,
            Echo=dep(
                "UNHEALTHY",
                message="1 replica failing health checks",
                target_replicas=3,
                running_replicas=2,
                healthy_replicas=1,
                unhealthy_replicas=1,
                demand=4.25,
                last_decision="upscale 2->3",
            ),
        )
    }
    doc = status_json(statuses, {"echo": config("echo", "Echo")})
    assert doc == {
        "applications": {
            "echo": {
                "status": "UNHEALTHY",
                "route_prefix": "/echo",
                "deployments": {
                    "Echo": {
                        "status": "UNHEALTHY",
                        "target_replicas": 3,
                        "running_replicas": 2,
                        "healthy_replicas": 1,
                        "unhealthy_replicas": 1,
                        "demand": 4.25,
                        "message": "1 replica failing health checks",
                        "last_decision": "upscale 2->3",
                    }
                },
            }
        }
    }


def test_app_without_status_is_deploying_waiting_for_controller() -> None:
    scaling = AutoscalingConfig(min_replicas=0, max_replicas=4, initial_replicas=1)
    apps = {
        "fixed": config("fixed", "A", "B"),
        "scaled": config("scaled", "M", autoscaling=scaling),
    }
    doc = status_json({}, apps)["applications"]
    assert doc["fixed"]["status"] == "DEPLOYING"
    assert doc["fixed"]["route_prefix"] == "/fixed"
    assert sorted(doc["fixed"]["deployments"]) == ["A", "B"]
    a = doc["fixed"]["deployments"]["A"]
    assert a == {
        "status": "UPDATING",
        "target_replicas": 2,
        "running_replicas": 0,
        "healthy_replicas": 0,
        "unhealthy_replicas": 0,
        "demand": 0.0,
        "message": "waiting for controller",
        "last_decision": "",
    }
    assert doc["scaled"]["deployments"]["M"]["target_replicas"] == 1  # initial_replicas

    text = text_of(render_table({}, apps, NOW))
    assert "DEPLOYING" in text and "(waiting for controller)" in text
    assert "0/2" in text and "0/1" in text


def test_deployment_the_controller_has_not_reported_yet_is_added() -> None:
    statuses = {"app": view("app", "RUNNING", 1.0, A=dep())}
    doc = status_json(statuses, {"app": config("app", "A", "B")})["applications"]["app"]
    assert doc["status"] == "RUNNING"
    assert doc["deployments"]["A"]["status"] == "HEALTHY"
    assert doc["deployments"]["B"]["status"] == "UPDATING"
    assert doc["deployments"]["B"]["message"] == "waiting for controller"


def test_deleting_app_shows_what_the_controller_says_only() -> None:
    statuses = {"gone": view("gone", "DELETING", 1.0, A=dep("DOWNSCALING", target_replicas=0))}
    doc = status_json(statuses, {})["applications"]
    assert doc["gone"]["status"] == "DELETING"
    assert list(doc["gone"]["deployments"]) == ["A"]


def test_table_shows_every_column_for_each_deployment() -> None:
    statuses = {
        "shop": view(
            "shop",
            "UNHEALTHY",
            75.0,
            Api=dep(
                "UNHEALTHY",
                message="replica shop-Api-3 failed 3 health checks",
                target_replicas=3,
                running_replicas=2,
                healthy_replicas=1,
                unhealthy_replicas=1,
                demand=4.25,
            ),
            Cart=dep(),
        )
    }
    table = render_table(statuses, {}, NOW, group=OWNER_GONE)
    assert [c.header for c in table.columns] == [
        "APP",
        "APP STATUS",
        "DEPLOYMENT",
        "STATUS",
        "REPLICAS",
        "HEALTH",
        "DEMAND",
        "MESSAGE / LAST DECISION",
        "AGE",
    ]
    text = text_of(table)
    lines = text.splitlines()
    api = next(line for line in lines if " Api " in line)
    for cell in ("shop", "UNHEALTHY", "2/3", "1 ok / 1 bad", "4.2", "replica shop-Api-3", "1m15s"):
        assert cell in api, (cell, api)
    cart = next(line for line in lines if " Cart " in line)
    assert "HEALTHY" in cart and "2/2" in cart and "2 ok" in cart and "bad" not in cart
    assert "1m15s" not in cart  # app-level cells only on the app's first row
    assert "/shop" in text
    assert "1m15s !" in text  # marked: nobody looks after it
    assert "1 status(es) not looked after by a live controller (is one running?)" in text
    assert "shop: partition 2's owner c1 is gone" in text


def test_status_cells_are_colored_by_status() -> None:
    statuses = {
        "a": view("a", "RUNNING", 1.0, A=dep("HEALTHY")),
        "b": view("b", "UNHEALTHY", 1.0, B=dep("DEPLOY_FAILED")),
    }
    table = render_table(statuses, {}, NOW)
    app_status = [c for c in table.columns[1].cells if str(c)]
    dep_status = list(table.columns[3].cells)
    assert [(str(c), c.style) for c in app_status] == [("RUNNING", "green"), ("UNHEALTHY", "red")]
    assert [(str(c), c.style) for c in dep_status] == [
        ("HEALTHY", "green"),
        ("DEPLOY_FAILED", "bold red"),
    ]


def test_looked_after_statuses_have_no_stale_warning_however_old_and_long_text_is_cut() -> None:
    decision = "upscale " + "x" * 200
    statuses = {"a": view("a", "RUNNING", 3 * 3600, A=dep(last_decision=decision))}
    text = text_of(render_table(statuses, {}, NOW, group=LOOKED_AFTER), width=200)
    assert "controller running" not in text and "!" not in text
    assert "x" * 200 not in text and "…" in text
    assert "3h00m" in text  # unchanged for 3 hours: no rewrite, and none needed


@pytest.mark.parametrize(
    ("group", "why"),
    [
        (LOOKED_AFTER, None),
        (GroupView(), "partition 2 has no owner"),
        (
            GroupView({"c1": ControllerMember("c1")}, {2: PartitionLease("", 3)}),
            "partition 2 has no owner",
        ),
        (OWNER_GONE, "partition 2's owner c1 is gone"),
        (
            GroupView({"c2": ControllerMember("c2", (2,))}, {2: PartitionLease("c2", 4)}),
            "partition 2 changed hands: c2 has not written this status yet",
        ),
    ],
)
def test_a_status_is_looked_after_while_its_lease_holds_its_epoch_for_a_live_member(
    group: GroupView, why: str | None
) -> None:
    assert unattended(view("a", "RUNNING", 1.0), group, NOW) == why


def test_a_status_of_an_older_controller_is_judged_by_its_age() -> None:
    fresh = view("a", "RUNNING", LEGACY_STALE_AFTER_S - 1, partition=None)
    old = view("b", "RUNNING", LEGACY_STALE_AFTER_S + 5, partition=None)
    assert unattended(fresh, LOOKED_AFTER, NOW) is None
    assert unattended(old, LOOKED_AFTER, NOW) == "not refreshed for 35s"
    doc = status_json({"a": fresh, "b": old}, {}, LOOKED_AFTER, NOW)["applications"]
    assert doc["a"]["stale"] is False
    assert doc["b"]["stale"] is True and doc["b"]["stale_reason"] == "not refreshed for 35s"


def test_the_caption_names_a_few_unattended_apps_and_counts_the_rest() -> None:
    statuses = {f"a{i}": view(f"a{i}", "RUNNING", 1.0) for i in range(8)}
    text = text_of(render_table(statuses, {}, NOW, group=OWNER_GONE), width=200)
    assert "8 status(es) not looked after" in text
    assert "a4: partition 2's owner c1 is gone" in text and "a5:" not in text
    assert "and 3 more" in text
    assert "not looked after" not in text_of(render_table(statuses, {}, NOW), width=200)


def test_narrow_terminal_folds_app_status_under_the_name_and_drops_the_text() -> None:
    statuses = {"a": view("a", "RUNNING", 1.0, A=dep(last_decision="hold"))}
    table = render_table(statuses, {}, NOW, width=WIDE_MIN_WIDTH - 1)
    headers = [c.header for c in table.columns]
    assert headers == ["APP", "DEPLOYMENT", "STATUS", "REPLICAS", "HEALTH", "DEMAND", "AGE"]
    text = text_of(table, width=WIDE_MIN_WIDTH - 1)
    assert "use --json" in text and "2/2" in text
    lines = text.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith(" a "))
    assert lines[row + 1].strip() == "RUNNING"


def test_empty_table_says_how_to_deploy_and_notes_are_shown() -> None:
    text = text_of(render_table({}, {}, NOW, notes=["ignored fp_status/x: wrong_type"]))
    assert "no applications deployed" in text
    assert "ignored fp_status/x: wrong_type" in text


def test_clock_skew_never_shows_a_negative_age() -> None:
    statuses = {"a": view("a", "RUNNING", -5.0, A=dep())}
    text = text_of(render_table(statuses, {}, NOW))
    assert " 0s" in text and "-5" not in text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (59.9, "59s"), (60, "1m00s"), (192, "3m12s"), (7500, "2h05m"), (356400, "4d03h")],
)
def test_format_age(seconds: float, text: str) -> None:
    assert format_age(seconds) == text


def test_group_notes_name_members_partitions_and_lag() -> None:
    members = {"c1": ControllerMember("c1", (3, 0), pending=2), "c2": ControllerMember("c2", (1,))}
    notes = group_notes(GroupView(members))
    assert notes[0] == "controller group: 2 member(s)"
    assert "c1: 2 partition(s) [0, 3], 2 report(s) behind" in notes[1]
    assert "is a controller running?" in group_notes(GroupView())[0]

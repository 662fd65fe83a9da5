"""The `rollout` deployment key: its values, their resolution for a target, YAML and fp_apps."""

from __future__ import annotations

import textwrap

import pytest

from shared.appconfig import AppConfig, DeploymentConfig
from shared.appyaml import check_apps, parse_apps
from shared.errors import ConfigError
from shared.rollout import PARAMS, RolloutConfig


def test_defaults_are_todays_rollout_one_new_replica_never_below_target() -> None:
    cfg = DeploymentConfig("A", "m:A")
    assert cfg.rollout == RolloutConfig(max_surge=1, max_unavailable=0)
    assert cfg.rollout.budget(16384) == (1, 0)
    assert {p.name for p in PARAMS} == {"max_surge", "max_unavailable"}


@pytest.mark.parametrize(
    ("surge", "unavailable", "target", "want"),
    [
        ("25%", 0, 16384, (4096, 0)),
        ("25%", 0, 5, (2, 0)),  # surge rounds up
        (0, "25%", 5, (0, 1)),  # unavailable rounds down
        ("10%", "10%", 3, (1, 0)),
        ("0%", "10%", 5, (0, 1)),  # both round to 0: unavailable 1, as in Kubernetes
        (3, 10, 4, (3, 4)),  # unavailable is at most the target
        ("100%", "100%", 8, (8, 8)),
        ("25%", 0, 0, (0, 0)),
    ],
)
def test_budget_resolves_counts_and_percentages(
    surge: int | str, unavailable: int | str, target: int, want: tuple[int, int]
) -> None:
    assert RolloutConfig(surge, unavailable).budget(target) == want


@pytest.mark.parametrize(
    ("kwargs", "field", "message"),
    [
        ({"max_surge": -1}, "max_surge", "must be >= 0, got -1"),
        ({"max_surge": "25"}, "max_surge", "a percentage must look like '25%'"),
        ({"max_unavailable": "101%"}, "max_unavailable", "(0-100%)"),
        ({"max_unavailable": 1.5}, "max_unavailable", "must be a count (like 2)"),
        ({"max_surge": True}, "max_surge", "must be a count"),
        ({"max_surge": 0}, "max_surge", "cannot both be 0"),
        ({"max_surge": "0%", "max_unavailable": "00%"}, "max_surge", "cannot both be 0"),
    ],
)
def test_bad_values_name_the_field(kwargs: dict[str, object], field: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        RolloutConfig(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field and message in str(info.value)


APP = """
applications:
  - name: shop
    deployments:
      - name: Model
        import_path: m:Model
        num_replicas: 8
        rollout:
{lines}
"""


def app_with(*lines: str) -> str:
    return APP.format(lines="\n".join(f"          {line}" for line in lines))


def test_yaml_rollout_keys() -> None:
    [app] = parse_apps(app_with("max_surge: 25%", "max_unavailable: 2"))
    assert app.deployments[0].rollout == RolloutConfig("25%", 2)
    [app] = parse_apps(app_with("max_unavailable: 10%"))
    assert app.deployments[0].rollout == RolloutConfig(1, "10%")
    [app] = parse_apps(APP.format(lines="").replace("        rollout:\n", ""))
    assert app.deployments[0].rollout == RolloutConfig()


@pytest.mark.parametrize(
    ("line", "path", "message"),
    [
        ("max_surge: lots", "rollout.max_surge", "a percentage must look like '25%'"),
        ("max_surge: -2", "rollout.max_surge", "must be >= 0"),
        ("max_unavailable: 0.5", "rollout.max_unavailable", "must be a count"),
        ("max_surge: 0", "rollout.max_surge", "cannot both be 0"),
        ("maxSurge: 2", "rollout.maxSurge", "did you mean 'max_surge'?"),
    ],
)
def test_yaml_rollout_problems_name_path_and_line(line: str, path: str, message: str) -> None:
    text = app_with(line)
    _, found = check_apps(textwrap.dedent(text))
    assert len(found) == 1, found
    p = found[0]
    assert p.path == f"applications[0].deployments[0].{path}"
    assert message in p.message
    assert p.line == text.count("\n")  # the line of the bad value


def test_a_rollout_key_at_the_deployment_level_belongs_under_rollout() -> None:
    text = APP.format(lines="").replace("        rollout:\n", "        max_surge: 2\n")
    _, [p] = check_apps(text)
    assert p.path.endswith(".max_surge") and "belongs under rollout" in p.message


def test_fp_apps_carries_the_rollout_and_an_older_writer_gets_the_defaults() -> None:
    dep = DeploymentConfig("A", "m:A", rollout=RolloutConfig("25%", 1))
    app = AppConfig("shop", (dep,))
    assert AppConfig.from_json(app.to_json()) == app
    older = app.to_json().replace(b',"rollout":{"max_surge":"25%","max_unavailable":1}', b"")
    assert b"rollout" not in older
    assert AppConfig.from_json(older).deployments[0].rollout == RolloutConfig()

"""App files: YAML -> AppConfig, and every problem reported with its field path and line."""

from __future__ import annotations

import importlib
import textwrap
from pathlib import Path

import pytest
import yaml

from shared.appcheck import Checker
from shared.appconfig import AppConfig, AutoscalingConfig, DeploymentConfig
from shared.appkeys import DEPLOYMENT_KEYS
from shared.appyaml import (
    Problem,
    check_apps,
    load_apps,
    parse_apps,
)
from shared.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def problems(text: str) -> list[Problem]:
    _, found = check_apps(textwrap.dedent(text))
    assert found, "expected problems"
    return found


def only(text: str) -> Problem:
    found = problems(text)
    assert len(found) == 1, found
    return found[0]


def apps_of(text: str) -> list[AppConfig]:
    return parse_apps(textwrap.dedent(text), "test.yaml")


# -- valid files ------------------------------------------------------------------------------


def test_fixed_size_app_gets_every_default() -> None:
    [app] = apps_of(
        """
        applications:
          - name: echo
            deployments:
              - name: Echo
                import_path: mypkg.echo:Echo
        """
    )
    assert app == AppConfig(
        name="echo",
        deployments=(
            DeploymentConfig(
                name="Echo",
                import_path="mypkg.echo:Echo",
                init_args=(),
                init_kwargs={},
                max_ongoing_requests=5,
                health_check_period_s=10.0,
                health_check_timeout_s=30.0,
                graceful_shutdown_timeout_s=20.0,
                num_replicas=1,
                autoscaling=None,
            ),
        ),
        route_prefix="/",
        ingress="Echo",
        version="",
    )


def test_autoscaling_app_keeps_given_values_and_fills_the_rest() -> None:
    [app] = apps_of(
        """
        applications:
          - name: model
            route_prefix: /model
            ingress: Model
            version: 3
            deployments:
              - name: Pre
                import_path: mypkg.pre:Pre
                num_replicas: 2
                init_args: [1, "two", {three: 3}]
              - name: Model
                import_path: mypkg.model:Model
                init_kwargs: {delay_s: 0.05, tags: [a, b]}
                max_ongoing_requests: 8
                health_check_period_s: 2.5
                autoscaling_config:
                  min_replicas: 0
                  max_replicas: 4
                  target_ongoing_requests: 3
                  downscale_to_zero_delay_s: 120
                  panic_mode: true
        """
    )
    pre, model = app.deployments
    assert (app.route_prefix, app.ingress, app.version) == ("/model", "Model", "3")
    assert pre.num_replicas == 2 and pre.autoscaling is None
    assert pre.init_args == (1, "two", {"three": 3})
    assert model.num_replicas is None
    assert model.init_kwargs == {"delay_s": 0.05, "tags": ["a", "b"]}
    assert (model.max_ongoing_requests, model.health_check_period_s) == (8, 2.5)
    assert model.autoscaling == AutoscalingConfig(
        min_replicas=0,
        max_replicas=4,
        target_ongoing_requests=3.0,
        downscale_to_zero_delay_s=120.0,
        panic_mode=True,
    )
    assert model.autoscaling.upscale_delay_s == 30.0
    assert model.autoscaling.downscale_delay_s == 600.0
    assert model.autoscaling.initial_replicas is None


def test_example_file_loads_and_its_class_imports() -> None:
    [app] = load_apps(ROOT / "examples" / "apps" / "echo.yaml")
    [dep] = app.deployments
    assert (app.name, app.route_prefix, app.ingress) == ("echo", "/echo", "Echo")
    assert dep.import_path == "services.examples.echo:Echo"
    assert dep.autoscaling is not None and dep.autoscaling.min_replicas == 0
    module, _, attr = dep.import_path.partition(":")
    assert callable(getattr(importlib.import_module(module), attr))
    assert AppConfig.from_json(app.to_json()) == app


def test_route_prefix_null_means_no_http_route_and_several_apps_load() -> None:
    first, second = apps_of(
        """
        applications:
          - name: a
            deployments: [{name: A, import_path: "m:A"}]
          - name: b
            route_prefix: null
            deployments: [{name: B, import_path: "m:B"}]
        """
    )
    assert (first.route_prefix, second.route_prefix) == ("/", None)


def test_merge_keys_share_settings_and_explicit_keys_override() -> None:
    [app] = apps_of(
        """
        applications:
          - name: a
            deployments:
              - &base {name: A, import_path: "m:A", health_check_period_s: 3}
              - <<: *base
                name: B
                health_check_period_s: 4
        """
    )
    a, b = app.deployments
    assert (a.name, a.health_check_period_s) == ("A", 3.0)
    assert (b.name, b.import_path, b.health_check_period_s) == ("B", "m:A", 4.0)


# -- each kind of problem, with its field path and line ---------------------------------------

AUTOSCALING_APP = """\
applications:
  - name: echo
    deployments:
      - name: Pre
        import_path: m:Pre
      - name: Echo
        import_path: m:Echo
        autoscaling_config:
          min_replicas: 2
          max_replicas: 1
"""


def test_max_below_min_names_the_path_line_and_bound() -> None:
    p = only(AUTOSCALING_APP)
    assert p == Problem(
        "applications[0].deployments[1].autoscaling_config.max_replicas",
        10,
        "must be >= min_replicas (2)",
    )


def test_min_above_the_default_max_says_to_set_max() -> None:
    p = only(AUTOSCALING_APP.replace("          max_replicas: 1\n", ""))
    assert p.path.endswith("autoscaling_config.min_replicas") and p.line == 9
    assert "max_replicas (1, the default" in p.message


def test_unknown_key_suggests_the_close_one() -> None:
    p = only(AUTOSCALING_APP.replace("max_replicas: 1", "max_replica: 3"))
    assert p.path == "applications[0].deployments[1].autoscaling_config.max_replica"
    assert p.line == 10
    assert p.message == "unknown key 'max_replica' (did you mean 'max_replicas'?)"


@pytest.mark.parametrize(
    ("line", "path", "message"),
    [
        ("target_ongoing_requests: ten", "target_ongoing_requests", "expected a number, got 'ten'"),
        ("upscale_delay_s: true", "upscale_delay_s", "expected a number, got true"),
        ("upscale_delay_s: -1", "upscale_delay_s", "must be >= 0, got -1"),
        ("look_back_period_s: 0", "look_back_period_s", "must be > 0, got 0"),
        ("metrics_interval_s: .nan", "metrics_interval_s", "must be a finite number, got nan"),
        ("initial_replicas: 2.5", "initial_replicas", "expected an integer, got 2.5"),
        (
            "initial_replicas: 9",
            "initial_replicas",
            "must lie in [min_replicas, max_replicas] = [0, 4]",
        ),
        ("panic_mode: yes please", "panic_mode", "expected true or false, got 'yes please'"),
    ],
)
def test_autoscaling_value_problems(line: str, path: str, message: str) -> None:
    text = (
        "applications:\n  - name: a\n    deployments:\n      - name: A\n        import_path: m:A\n"
        f"        autoscaling_config:\n          min_replicas: 0\n          max_replicas: 4\n"
        f"          {line}\n"
    )
    p = only(text)
    assert p == Problem(f"applications[0].deployments[0].autoscaling_config.{path}", 9, message)


@pytest.mark.parametrize(
    ("line", "key", "message"),
    [
        ("name: my echo", "name", "invalid deployment name 'my echo'"),
        (
            "import_path: mypkg.echo.Echo",
            "import_path",
            "must look like 'package.module:Attribute'",
        ),
        ("max_ongoing_requests: 0", "max_ongoing_requests", "must be >= 1, got 0"),
        ("num_replicas: two", "num_replicas", "expected an integer, got 'two'"),
        ("health_check_timeout_s: [1]", "health_check_timeout_s", "expected a number, got a list"),
        ("init_args: {a: 1}", "init_args", "expected a list, got a mapping"),
        ("init_kwargs: [1]", "init_kwargs", "expected a mapping, got a list"),
        ("init_kwargs: {1x: 1}", "init_kwargs", "key '1x' is not a Python argument name"),
        ("init_kwargs: {when: 2024-05-01}", "init_kwargs.when", "a date cannot be stored as JSON"),
        ("init_args: [.inf]", "init_args[0]", "must be a finite number"),
        ("min_replicas: 1", "min_replicas", "it belongs under autoscaling_config"),
        (
            "ray_actor_options: {object_store_memory: 1}",
            "ray_actor_options.object_store_memory",
            "fleetpulse has no object store; remove the key",
        ),
        ("ray_actor_options: {num_gpus: 1.5}", "ray_actor_options.num_gpus", "whole number"),
        ("ray_actor_options: {resources: {GPU: 1}}", "ray_actor_options.resources.GPU", "num_gpus"),
        ("ray_actor_options: {num_cpus: -1}", "ray_actor_options.num_cpus", "must be >= 0"),
        ("max_queued_requests: 0", "max_queued_requests", "must be -1 (no bound of its own)"),
        ("max_replicas_per_node: 0", "max_replicas_per_node", "must be >= 1"),
        ("logging_config: {encoding: XML}", "logging_config.encoding", "must be TEXT or JSON"),
        ("logging_config: {log_level: LOUD}", "logging_config.log_level", "must be one of DEBUG"),
        ("placement_group_strategy: PACK", "placement_group_strategy", "Ray Serve option"),
        ("shade: red", "shade", "unknown key 'shade' (known keys: name, import_path"),
    ],
)
def test_deployment_value_problems(line: str, key: str, message: str) -> None:
    fields = {"name": "A", "import_path": "m:A"}
    fields.pop(line.split(":")[0], None)
    body = "\n        ".join([*(f"{k}: {v}" for k, v in fields.items()), line])
    text = f"applications:\n  - name: a\n    deployments:\n      - {body}\n"
    p = only(text)
    assert p.path == f"applications[0].deployments[0].{key}"
    assert p.line == text.count("\n")  # the last line holds the bad value
    assert message in p.message


def test_required_keys_point_at_their_mapping() -> None:
    found = problems(
        """\
        applications:
          - name: a
            deployments:
              - num_replicas: 1
          - route_prefix: /b
        """
    )
    assert [(p.path, p.line) for p in found] == [
        ("applications[0].deployments[0].name", 4),
        ("applications[0].deployments[0].import_path", 4),
        ("applications[1].name", 5),
        ("applications[1].deployments", 5),
    ]
    assert all(p.message.startswith("required") for p in found)


def test_num_replicas_and_autoscaling_together() -> None:
    p = only(
        AUTOSCALING_APP.replace("max_replicas: 1", "max_replicas: 3") + "        num_replicas: 2\n"
    )
    assert p == Problem(
        "applications[0].deployments[1].num_replicas",
        11,
        "set num_replicas or autoscaling_config, not both",
    )


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("route_prefix: echo", "must start with '/', got 'echo'"),
        ("route_prefix: /echo/", "must not end with '/'"),
        ("version: 1.5", 'expected a string (quote it, e.g. version: "1.2"), got 1.5'),
        ("name: a.b", "invalid application name 'a.b'"),
    ],
)
def test_app_value_problems(line: str, message: str) -> None:
    text = f"applications:\n  - {line}\n    deployments: [{{name: A, import_path: 'm:A'}}]\n"
    if not line.startswith("name:"):
        text = text.replace("  - ", "  - name: a\n    ", 1)
    p = only(text)
    assert p.path == f"applications[0].{line.split(':')[0]}"
    assert p.line == text.count("\n") - 1
    assert message in p.message


def test_ingress_must_name_a_deployment_and_is_reported_once() -> None:
    p = only(
        """\
        applications:
          - name: a
            ingress: Nope
            deployments: [{name: A, import_path: "m:A"}, {name: B, import_path: "m:B"}]
        """
    )
    assert p == Problem(
        "applications[0].ingress",
        3,
        "'Nope' is not a deployment of this application (deployments: 'A', 'B')",
    )


def test_duplicate_names_and_route_prefixes() -> None:
    found = problems(
        """\
        applications:
          - name: a
            deployments:
              - {name: A, import_path: "m:A"}
              - {name: A, import_path: "m:B"}
          - name: a
            route_prefix: /a
            deployments: [{name: A, import_path: "m:A"}]
          - name: c
            deployments: [{name: C, import_path: "m:C"}]
        """
    )
    assert [(p.path, p.line, p.message) for p in found] == [
        (
            "applications[0].deployments[1].name",
            5,
            "duplicate deployment name 'A' (first at line 4)",
        ),
        ("applications[1].name", 6, "duplicate application name 'a' (first at line 2)"),
        (
            "applications[2].route_prefix",
            9,
            "'/' (the default) is also the route_prefix of 'a'; give each application its own",
        ),
    ]


def test_duplicate_yaml_key_is_a_problem_not_a_silent_override() -> None:
    p = only(
        """\
        applications:
          - name: a
            name: b
            deployments: [{name: A, import_path: "m:A"}]
        """
    )
    assert (p.path, p.line, p.message) == (
        "applications[0].name",
        3,
        "duplicate key (first at line 2)",
    )


@pytest.mark.parametrize(
    ("text", "path", "message"),
    [
        ("", "", "the file is empty"),
        ("- a\n", "", "expected a mapping, got a list"),
        ("application: []\n", "application", "(did you mean 'applications'?)"),
        ("target_capacity: 50\napplications: [{}]\n", "target_capacity", "Ray Serve option"),
        ("applications: []\n", "applications", "must not be empty"),
        ("applications: {name: a}\n", "applications", "expected a list, got a mapping"),
        (
            "applications:\n  - name: a\n    deployments: []\n",
            "applications[0].deployments",
            "must not be empty",
        ),
    ],
)
def test_file_shape_problems(text: str, path: str, message: str) -> None:
    found = problems(text)
    assert found[0].path == path and message in found[0].message


def test_yaml_syntax_error_names_the_line() -> None:
    p = only("applications:\n  - name: a\n    deployments: [{name: A\n  - name: b\n")
    assert p.path == "" and p.line == 4
    assert p.message.startswith("YAML syntax error:")


BILLION_LAUGHS = (
    "[&a0 [x, x, x, x, x, x, x, x, x, x], "
    + ", ".join(f"&a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9))
    + "]"
)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("&loop [1, *loop]", "unsupported YAML value: found unconstructable recursive node"),
        (BILLION_LAUGHS, "more than 100000 values"),
    ],
    ids=["recursive", "billion-laughs"],
)
def test_recursive_or_exploding_init_args_are_refused_quickly(value: str, message: str) -> None:
    text = (
        "applications:\n  - name: a\n    deployments:\n      - name: A\n        import_path: m:A\n"
        f"        init_args: {value}\n"
    )
    p = only(text)
    assert p.path == "applications[0].deployments[0].init_args" and p.line == 6
    assert message in p.message


def test_unknown_yaml_tag_is_a_problem_not_a_crash() -> None:
    p = only(
        "applications:\n  - name: !!python/name:os.system a\n"
        "    deployments: [{name: A, import_path: 'm:A'}]\n"
    )
    assert p.path == "applications[0].name" and "unsupported YAML value" in p.message


# -- all problems together, in one ConfigError ------------------------------------------------


def test_every_problem_is_reported_at_once_in_line_order(tmp_path: Path) -> None:
    path = tmp_path / "apps.yaml"
    path.write_text(
        "applications:\n"
        "  - name: a\n"
        "    deployments:\n"
        "      - name: A\n"
        "        import_path: m:A\n"
        "        num_replicas: 2\n"
        "        autoscaling_config: {max_replica: 3}\n"
        "        health_check_period_s: ten\n"
        "  - name: b\n"
        "    deployments: [{name: B}]\n"
    )
    with pytest.raises(ConfigError) as info:
        load_apps(path)
    text = str(info.value)
    assert text.startswith(f"{path}: 5 problems:\n")
    assert text.splitlines()[1:] == [
        f"  {path}:6: applications[0].deployments[0].num_replicas: set num_replicas or "
        "autoscaling_config, not both",
        f"  {path}:7: applications[0].deployments[0].autoscaling_config.max_replica: unknown key "
        "'max_replica' (did you mean 'max_replicas'?)",
        f"  {path}:8: applications[0].deployments[0].health_check_period_s: expected a number, "
        "got 'ten'",
        f"  {path}:9: applications[1].route_prefix: '/' (the default) is also the route_prefix "
        "of 'a'; give each application its own",
        f"  {path}:10: applications[1].deployments[0].import_path: required "
        "(like 'package.module:Class')",
    ]
    assert info.value.source == str(path)


def test_a_single_problem_is_one_line_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "apps.yaml"
    path.write_text(AUTOSCALING_APP)
    with pytest.raises(ConfigError) as info:
        load_apps(path)
    assert str(info.value) == (
        f"{path}:10: applications[0].deployments[1].autoscaling_config.max_replicas: "
        "must be >= min_replicas (2)"
    )


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.yaml: cannot read the file"):
        load_apps(tmp_path / "missing.yaml")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"applications: \xff\xfe\n")
    with pytest.raises(ConfigError, match=r"binary\.yaml: not UTF-8 text"):
        load_apps(binary)


def test_errors_the_dataclasses_raise_are_reported_under_the_field_path() -> None:
    # A backstop: the checker finds these itself first, but whatever the dataclasses of
    # shared.appconfig reject must still come out under a field path and line, not as a crash.
    text = "name: A\nimport_path: m:A\nnum_replicas: 1\n"
    loader = yaml.SafeLoader(text)
    checker = Checker(loader)
    m = checker.mapping(loader.get_single_node(), "applications[0].deployments[0]", DEPLOYMENT_KEYS)
    assert m is not None and checker.problems == []
    scaling = AutoscalingConfig(max_replicas=2)
    built = checker.build(
        "applications[0].deployments[0]",
        m,
        lambda: DeploymentConfig(**m.values, autoscaling=scaling),
    )
    assert built is None
    assert checker.problems == [
        Problem(
            "applications[0].deployments[0].num_replicas",
            3,
            "set num_replicas or autoscaling_config, not both",
        )
    ]


# -- custom autoscaling policies ---------------------------------------------------------------

POLICY_APP = """
applications:
  - name: llm
    deployments:
      - name: Model
        import_path: services.examples.kv_model:KVModel
        autoscaling_config:
          max_replicas: 4
          policy:
            {policy}
"""


def test_a_custom_policy_is_rays_policy_function_key() -> None:
    text = POLICY_APP.format(
        policy="policy_function: services.examples.kv_policy:scale_on_kv_cache"
    )
    [app] = apps_of(text)
    scaling = app.deployments[0].autoscaling
    assert scaling is not None and scaling.policy == "services.examples.kv_policy:scale_on_kv_cache"
    assert AppConfig.from_json(app.to_json()) == app  # it survives fp_apps


@pytest.mark.parametrize(
    ("policy", "path", "message"),
    [
        ("policy_function: kv_policy", "policy.policy_function", "'package.module:Attribute'"),
        ("policy_function: 3", "policy.policy_function", "expected a string"),
        ("{}", "policy.policy_function", "required"),
        ("pkg.mod:fn", "policy", "expected a mapping"),
    ],
)
def test_policy_problems(policy: str, path: str, message: str) -> None:
    p = only(POLICY_APP.format(policy=policy))
    assert p.path == f"applications[0].deployments[0].autoscaling_config.{path}"
    assert message in p.message and p.line is not None


def test_policy_at_the_deployment_level_belongs_under_autoscaling_config() -> None:
    p = only(
        """
        applications:
          - name: llm
            deployments:
              - name: Model
                import_path: pkg.mod:Model
                policy: {policy_function: pkg.mod:fn}
        """
    )
    assert "belongs under autoscaling_config" in p.message


def test_the_import_check_reports_with_file_and_line(tmp_path: Path) -> None:
    from services.controller.custom_policy import policy_problem

    path = tmp_path / "llm.yaml"
    path.write_text(POLICY_APP.format(policy="policy_function: nowhere_to_be.found:fn"))
    assert load_apps(path)  # the file check alone imports nothing
    with pytest.raises(ConfigError) as err:
        load_apps(path, check_policy=policy_problem)
    message = str(err.value)
    assert f"{path}:10:" in message and "policy.policy_function" in message
    assert "ModuleNotFoundError" in message


def test_the_custom_policy_example_file_loads_and_imports() -> None:
    from services.controller.custom_policy import policy_problem

    [app] = load_apps(ROOT / "examples" / "apps" / "kv_cache.yaml", check_policy=policy_problem)
    [dep] = app.deployments
    assert dep.autoscaling is not None
    assert dep.autoscaling.policy == "services.examples.kv_policy:scale_on_kv_cache"
    module, _, attr = dep.import_path.partition(":")
    assert callable(getattr(importlib.import_module(module), attr).record_autoscaling_stats)


def test_rays_application_level_policy_is_refused_by_name() -> None:
    p = only(
        """
        applications:
          - name: llm
            autoscaling_policy: {policy_function: pkg.mod:fn}
            deployments:
              - name: Model
                import_path: pkg.mod:Model
        """
    )
    assert "a Ray Serve option fleetpulse does not support" in p.message

"""Forms public Ray Serve config files use that Ray's `serve deploy` accepts (measured on public
files with scripts/ray_configs.py): a file-level logging_config, `serve build` output (both names
of a renamed key, one null; `additional_log_standard_attrs: []`), the deprecated
`smoothing_factor`, `aggregation_function`, and a policy's `module.function` form."""

from __future__ import annotations

import textwrap
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.appkeys import Problem
from shared.serveconfig import Checked, check_config


def checked(text: str) -> Checked:
    return check_config(textwrap.dedent(text))


def problems(c: Checked) -> list[tuple[str, str]]:
    return [(p.path, p.message) for p in c.problems]


def scaling_of(extra: str) -> Checked:
    body = textwrap.indent(textwrap.dedent(extra), " " * 10)
    return checked(
        "applications:\n  - name: a\n    deployments:\n      - name: A\n"
        "        import_path: m:A\n        autoscaling_config:\n" + body
    )


def test_a_file_level_logging_config_is_each_apps_that_sets_none() -> None:
    c = checked(
        """
        logging_config:
          encoding: JSON
          log_level: DEBUG
        applications:
          - name: written
            deployments:
              - {name: A, import_path: 'm:A'}
          - name: own
            route_prefix: /own
            logging_config: {log_level: WARNING}
            deployments:
              - {name: B, import_path: 'm:B'}
          - name: code
            route_prefix: /code
            import_path: m:app
        """
    )
    assert problems(c) == []
    written, own = c.apps
    assert written.deployment("A").logging_config["encoding"] == "JSON"
    assert written.deployment("A").logging_config["log_level"] == "DEBUG"
    assert own.deployment("B").logging_config["log_level"] == "WARNING"
    assert own.deployment("B").logging_config["encoding"] == "TEXT"
    (code,) = c.code_apps
    assert code.logging is not None and code.logging["encoding"] == "JSON"
    assert any(w.path == "logging_config" for w in c.warnings)


def test_a_bad_file_level_logging_config_is_reported_once() -> None:
    c = checked(
        """
        logging_config: {log_level: LOUD}
        applications:
          - {name: a, import_path: 'm:a'}
          - {name: b, import_path: 'm:b', route_prefix: /b}
        """
    )
    assert [path for path, _ in problems(c)] == ["logging_config.log_level"]


def test_an_empty_additional_log_standard_attrs_is_rays_default() -> None:
    c = checked(
        """
        applications:
          - name: a
            logging_config: {encoding: JSON, logs_dir: null, additional_log_standard_attrs: []}
            deployments:
              - {name: A, import_path: 'm:A'}
        """
    )
    assert problems(c) == []
    some = checked(
        "applications:\n  - name: a\n    logging_config: {additional_log_standard_attrs: [name]}\n"
        "    deployments:\n      - {name: A, import_path: 'm:A'}\n"
    )
    assert [p for p, _ in problems(some)] == [
        "applications[0].logging_config.additional_log_standard_attrs"
    ]


def test_both_names_of_a_renamed_key_with_one_null_as_serve_build_writes_them() -> None:
    c = scaling_of(
        """\
        upscale_smoothing_factor: null
        downscale_smoothing_factor: 0.5
        upscaling_factor: 1.5
        downscaling_factor: null
        """
    )
    assert problems(c) == []
    scaling = c.apps[0].deployments[0].autoscaling
    assert scaling is not None
    assert (scaling.upscaling_factor, scaling.downscaling_factor) == (1.5, 0.5)
    both = scaling_of("upscale_smoothing_factor: 2\nupscaling_factor: 3\n")
    assert [m for _, m in problems(both)] == [
        "give 'upscaling_factor' or its older name 'upscale_smoothing_factor', not both"
    ]


def test_smoothing_factor_stands_for_the_factors_not_set() -> None:
    c = scaling_of("smoothing_factor: 0.5\nupscaling_factor: 2\n")
    assert problems(c) == []
    scaling = c.apps[0].deployments[0].autoscaling
    assert scaling is not None
    assert (scaling.upscaling_factor, scaling.downscaling_factor) == (2, 0.5)
    assert any(w.path.endswith("autoscaling_config.smoothing_factor") for w in c.warnings)
    old = scaling_of("smoothing_factor: 0.5\ndownscale_smoothing_factor: 0.25\n")
    scaling = old.apps[0].deployments[0].autoscaling
    assert scaling is not None
    assert (scaling.upscaling_factor, scaling.downscaling_factor) == (0.5, 0.25)
    assert scaling_of("smoothing_factor: null\n").problems == []
    bad = scaling_of("smoothing_factor: 0\n")
    assert [p for p, _ in problems(bad)] == [
        "applications[0].deployments[0].autoscaling_config.smoothing_factor"
    ]


def test_aggregation_function_mean_is_what_the_window_does() -> None:
    assert scaling_of("aggregation_function: mean\n").problems == []
    bad = scaling_of("aggregation_function: max\n")
    assert len(bad.problems) == 1 and "only 'mean'" in bad.problems[0].message


def test_a_policy_in_the_module_dot_function_form() -> None:
    for key in ("policy_function", "name"):
        c = scaling_of(f"policy:\n  {key}: my.pkg.policies.scale\n")
        assert problems(c) == [], key
        scaling = c.apps[0].deployments[0].autoscaling
        assert scaling is not None and scaling.policy == "my.pkg.policies:scale"


def test_pip_index_options_reach_the_installer_as_single_arguments() -> None:
    c = checked(
        """
        applications:
          - name: a
            runtime_env:
              pip:
                - -f https://wheels.example/libtpu.html
                - "--extra-index-url https://index.example/simple"
                - --index-url=https://mirror.example/simple
                - jax[tpu]
            deployments:
              - {name: A, import_path: 'm:A'}
        """
    )
    assert problems(c) == []
    assert c.apps[0].deployments[0].runtime_env["pip"]["packages"] == [
        "--find-links=https://wheels.example/libtpu.html",
        "--extra-index-url=https://index.example/simple",
        "--index-url=https://mirror.example/simple",
        "jax[tpu]",
    ]
    other = checked(
        "applications:\n  - name: a\n    runtime_env: {pip: [--no-deps, x]}\n"
        "    deployments:\n      - {name: A, import_path: 'm:A'}\n"
    )
    assert [m for _, m in problems(other)] == [
        "'--no-deps': installer options are not passed through"
    ]


def test_a_bad_app_name_beside_an_import_path_is_a_problem_not_a_crash() -> None:
    c = checked(
        """
        name: svc
        compute_config: simple
        applications:
          - name: My Inference
            import_path: inference.app:server
        """
    )
    assert [p for p, _ in problems(c)] == ["applications[0].name"]
    assert c.code_apps == []
    unnamed = checked("applications:\n  - import_path: inference.app:server\n")
    assert problems(unnamed) == [] and [a.name for a in unnamed.code_apps] == ["default"]


def test_an_older_anyscale_service_file_is_read_by_its_ray_serve_config() -> None:
    c = checked(
        """\
        name: svc
        project_id: prj_1
        cluster_env: env:3
        ray_serve_config:
          applications:
            - name: app
              route_prefix: /app
              import_path: deployment:app
              runtime_env:
                working_dir: https://code.example/a.zip
                upload_path: s3://bucket/svc
              deployments:
                - name: Counter
                  user_config: {count: 1}
        rollout_strategy: ROLLOUT
        """
    )
    assert problems(c) == []
    (app,) = c.code_apps
    assert (app.name, app.route_prefix, app.import_path) == ("app", "/app", "deployment:app")
    assert app.runtime_env == {"working_dir": "https://code.example/a.zip"}
    warned = {(w.path, w.line) for w in c.warnings}
    assert {("name", 1), ("project_id", 2), ("cluster_env", 3), ("rollout_strategy", 15)} <= warned
    assert ("ray_serve_config.applications[0].runtime_env.upload_path", 11) in warned
    bad = checked(
        "name: svc\nray_serve_config:\n  applications:\n"
        "    - {name: a, import_path: 'm:a', num_replicas: 2}\n"
    )
    assert [(p.path, p.line) for p in bad.problems] == [
        ("ray_serve_config.applications[0].num_replicas", 4)
    ]


def test_ray_serve_config_beside_applications_is_not_a_wrapper() -> None:
    c = checked("ray_serve_config: {}\napplications:\n  - {name: a, import_path: 'm:a'}\n")
    assert [p for p, _ in problems(c)] == ["ray_serve_config"]


_SCALARS = st.sampled_from(
    [None, "", "m:app", "m.app", "bad name", "a", "/", "/x", 0, 1, -1, 2.5, True, "auto", []]
)
_KEYS = [
    "name", "import_path", "route_prefix", "args", "runtime_env", "deployments", "logging_config",
    "num_replicas", "autoscaling_config", "smoothing_factor", "upscale_smoothing_factor",
    "upscaling_factor", "aggregation_function", "policy", "policy_function", "working_dir", "pip",
    "env_vars", "upload_path", "user_config", "ray_actor_options", "init_args", "applications",
    "ray_serve_config", "http_options", "compute_config", "requirements",
]  # fmt: skip
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(_KEYS), inner, max_size=4)
    ),
    max_leaves=12,
)


_DEPLOYMENT = st.fixed_dictionaries(
    {},
    optional={
        k: _VALUES
        for k in (
            "name",
            "import_path",
            "num_replicas",
            "autoscaling_config",
            "user_config",
            "ray_actor_options",
            "init_args",
            "logging_config",
        )
    },
)
_APP = st.fixed_dictionaries(
    {},
    optional={
        "name": st.sampled_from(["a", "bad name", "", None, 1]),
        "import_path": st.sampled_from(["m:app", "m.app", "m", None]),
        "route_prefix": st.sampled_from(["/", "/x", "x", None]),
        "args": _VALUES,
        "runtime_env": _VALUES,
        "logging_config": _VALUES,
        "deployments": st.lists(_DEPLOYMENT, max_size=2),
    },
)


@settings(max_examples=400, deadline=None)
@given(
    st.dictionaries(st.sampled_from(_KEYS), _VALUES, max_size=4),
    st.lists(_APP, max_size=3),
    st.booleans(),
)
def test_any_mix_of_serve_keys_gets_problems_never_an_exception(
    top: dict[str, Any], apps: list[dict[str, Any]], wrapped: bool
) -> None:
    doc: dict[str, Any] = dict(top)
    if apps:
        doc.pop("ray_serve_config", None)
        doc["ray_serve_config" if wrapped else "applications"] = (
            {"applications": apps} if wrapped else apps
        )
    c = check_config(yaml.safe_dump(doc))
    assert all(isinstance(p, Problem) for p in [*c.problems, *c.warnings])
    if not c.problems:
        assert {a.name for a in c.apps}.isdisjoint({a.name for a in c.code_apps})

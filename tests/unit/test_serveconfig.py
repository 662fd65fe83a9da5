"""Ray Serve's config forms (shared/serveconfig.py): apps defined in code, overrides by name,
runtime_env, Ray's own services, the legacy single-app form and RayService manifests."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

import pytest

from services.ops.deploy import run_deploy
from shared.appconfig import AppConfig, AutoscalingConfig
from shared.appgraph import BuiltApp, BuiltDeployment, handle_ref
from shared.appyaml import check_apps
from shared.serveconfig import Checked, CodeApp, check_config

FIXTURES = Path(__file__).parents[1] / "fixtures"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def checked(text: str, graphs: dict[str, BuiltApp] | None = None) -> Checked:
    build = None
    if graphs is not None:

        def build(code: CodeApp) -> BuiltApp:
            return graphs[code.import_path]

    return check_config(textwrap.dedent(text), build=build)


def messages(c: Checked) -> list[tuple[str, int | None, str]]:
    return [(p.path, p.line, p.message) for p in c.problems]


def dep(name: str, path: str, **kw: object) -> BuiltDeployment:
    return BuiltDeployment(
        name,
        path,
        tuple(kw.pop("args", ())),  # type: ignore[call-overload]
        kw.pop("kwargs", {}),  # type: ignore[arg-type]
        kw.pop("options", {}),  # type: ignore[arg-type]
        bool(kw.pop("reconfigure", False)),
    )


# -- the fixtures: configs in the forms used in the wild ------------------------------------------

CLASSIFIER = BuiltApp(
    "ImageClassifier",
    (
        dep("downloader", "image_classifier:downloader"),
        dep(
            "ImageClassifier",
            "image_classifier:ImageClassifier",
            args=[handle_ref("downloader")],
            options={"max_ongoing_requests": 8, "autoscaling_config": {"max_replicas": 3}},
        ),
    ),
)
TRANSLATOR = BuiltApp(
    "Translator", (dep("Translator", "text_translator:Translator", reconfigure=True),)
)


def test_ray_docs_multi_app_config() -> None:
    c = check_config(fixture("ray_docs_multi_app.yaml"))
    assert c.problems == [] and c.apps == []
    assert [(a.name, a.import_path, a.route_prefix) for a in c.code_apps] == [
        ("app1", "image_classifier:app", "/classify"),
        ("app2", "text_translator:app", "/translate"),
    ]
    assert list(c.code_apps[0].overrides) == ["downloader", "ImageClassifier"]
    warned = {w.path: w.message for w in c.warnings}
    assert set(warned) == {"proxy_location", "http_options.host", "http_options.port",
                           "grpc_options"}  # fmt: skip
    assert "fleetpulse proxy --port" in warned["http_options.port"]
    assert "no gRPC ingress" in warned["grpc_options"]
    # built: the code's options under the file's overrides
    c = check_config(
        fixture("ray_docs_multi_app.yaml"),
        build=lambda code: {"image_classifier:app": CLASSIFIER, "text_translator:app": TRANSLATOR}[
            code.import_path
        ],
    )
    assert c.problems == []
    app1, app2 = c.apps
    classifier = app1.deployment("ImageClassifier")
    assert app1.ingress == "ImageClassifier"
    assert classifier.max_ongoing_requests == 4  # the file wins over the code's 8
    # `num_replicas: null` is "not set": the code's autoscaling_config stays
    assert classifier.autoscaling == AutoscalingConfig(max_replicas=3)
    assert classifier.init_args == ({"$fleetpulse_handle": "downloader"},)
    assert app2.deployment("Translator").user_config == {"language": "french"}


def test_legacy_single_app_config() -> None:
    built = BuiltApp(
        "FruitMarket",
        tuple(
            dep(n, f"fruit:{n}", reconfigure=n != "FruitMarket")
            for n in ("MangoStand", "OrangeStand", "FruitMarket")
        ),
    )
    c = check_config(fixture("ray_legacy_single_app.yaml"), build=lambda code: built)
    assert c.problems == []
    (app,) = c.apps
    assert (app.name, app.route_prefix, app.ingress) == ("default", "/", "FruitMarket")
    assert app.deployment("MangoStand").user_config == {"price": 3}
    market = app.deployment("FruitMarket")
    assert (market.num_replicas, market.max_ongoing_requests) == (2, 100)
    warned = {w.path: (w.line, w.message) for w in c.warnings}
    assert "host" in warned and "port" in warned and "" in warned  # the form itself
    path = "applications[0].deployments[2].max_concurrent_queries"
    assert warned[path] == (25, "Ray Serve's older name of 'max_ongoing_requests'; read as "
                                "'max_ongoing_requests'")  # fmt: skip


def test_builder_with_args_and_num_replicas_auto() -> None:
    c = check_config(fixture("ray_builder_args.yaml"))
    (code,) = c.code_apps
    assert code.args == {"model": "meta-llama/Llama-3.1-8B-Instruct",
                         "tensor-parallel-size": 1, "max_model_len": 8192}  # fmt: skip
    assert code.env == {"HF_HOME": "/mnt/cache/hf", "VLLM_USE_V1": "1"}
    built = BuiltApp("VLLMDeployment", (dep("VLLMDeployment", "llm_serving:VLLMDeployment"),))
    c = check_config(fixture("ray_builder_args.yaml"), build=lambda code: built)
    (d,) = c.apps[0].deployments
    # auto: Ray's defaults (min 1, max 100, target 2) under the values given; null = default
    assert d.autoscaling == AutoscalingConfig(
        min_replicas=1, max_replicas=4, target_ongoing_requests=16.0
    )
    assert d.env == {"HF_HOME": "/mnt/cache/hf", "VLLM_USE_V1": "1"}
    assert d.max_ongoing_requests == 32


def test_rayservice_manifest_with_a_working_dir_url_and_pip() -> None:
    c = check_config(fixture("rayservice_sample.yaml"))
    assert c.manifest == "RayService 'rayservice-sample', spec.serveConfigV2"
    assert c.problems == []
    fruit, math = c.code_apps
    assert fruit.runtime_env["working_dir"].startswith("https://github.com/ray-project/test_dag")
    assert math.runtime_env["pip"] == ["numpy==1.26.4"]


def test_rayservice_manifest_refuses_conda_at_the_line_of_the_file() -> None:
    text = fixture("rayservice_sample.yaml").replace('pip: ["numpy==1.26.4"]', "conda: env")
    c = check_config(text)
    assert [(p.path, p.line) for p in c.problems] == [
        ("spec.serveConfigV2.applications[1].runtime_env.conda", 27),
    ]
    assert "builds no conda environments" in c.problems[0].message


def test_rayservice_manifest_with_the_code_in_the_image() -> None:
    c = check_config(fixture("rayservice_image_baked.yaml"))
    assert c.problems == []
    (code,) = c.code_apps
    assert (code.name, code.import_path, code.args) == (
        "hello", "examples.serve.builder:app_builder", {"greeting": "Hi"}
    )  # fmt: skip


# -- refusals: which key, why, what to do ----------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "path", "message"),
    [
        ("runtime_env: {pip: [-e .]}", "runtime_env.pip", "options are not passed through"),
        ("runtime_env: {conda: env}", "runtime_env.conda", "builds no conda environments"),
        ("runtime_env: {container: {image: x}}", "runtime_env.container", "not containers"),
        ("runtime_env: {image_uri: x}", "runtime_env.image_uri", "not containers"),
        ("runtime_env: {nsight: default}", "runtime_env.nsight", "no profiler integration"),
        ("runtime_env: {java_jars: [a]}", "runtime_env.java_jars", "Python replicas only"),
        ("runtime_env: {working_dir: s3://b/x.zip}", "runtime_env.working_dir", "s3:// is not"),
        ("runtime_env: {working_dir: /no/such/dir}", "runtime_env.working_dir", "not a directory"),
        ("runtime_env: {env_vars: {N: 1}}", "runtime_env.env_vars.N", 'quote it: "1"'),
        ("runtime_env: {env_vars: [A]}", "runtime_env.env_vars", "expected a mapping"),
        ("args: [1, 2]", "args", "expected a mapping, got a list"),
        ("ingress: A", "ingress", "the ingress is the deployment it binds at the root"),
        ("import_path: nocolon", "import_path", "must look like 'package.module:Attribute'"),
    ],
)
def test_app_level_refusals(line: str, path: str, message: str) -> None:
    text = f"applications:\n  - name: a\n    import_path: m:app\n    {line}\n"
    if line.startswith("import_path"):
        text = f"applications:\n  - name: a\n    {line}\n"
    c = checked(text)
    (p,) = c.problems
    assert p.path == f"applications[0].{path}" and message in p.message


@pytest.mark.parametrize(
    ("line", "key", "message"),
    [
        ("import_path: m:A", "import_path", "set in code when the app has an import_path"),
        ("init_kwargs: {a: 1}", "init_kwargs", "remove init_kwargs"),
        ("num_replicas: many", "num_replicas", "expected an integer, got 'many' or 'auto'"),
        ("user_config: [1]", "user_config", "expected a mapping (given to reconfigure())"),
        ("autoscaling_config: {max_replica: 3}", "autoscaling_config.max_replica", "did you mean"),
    ],
)
def test_override_refusals(line: str, key: str, message: str) -> None:
    c = checked(
        f"applications:\n  - import_path: m:app\n    deployments:\n      - name: A\n        {line}\n"
    )
    (p,) = c.problems
    assert p.path == f"applications[0].deployments[0].{key}" and message in p.message
    assert p.line == 5


def test_an_override_must_name_a_deployment_of_the_built_app() -> None:
    c = checked(
        """\
        applications:
          - import_path: m:app
            deployments:
              - name: Modle
                num_replicas: 2
        """,
        {"m:app": BuiltApp("Model", (dep("Model", "m:Model"),))},
    )
    assert messages(c) == [(
        "applications[0].deployments[0].name", 4,
        "no deployment 'Modle' in the application m:app builds (it has: Model)",
    )]  # fmt: skip


def test_user_config_needs_a_reconfigure_method() -> None:
    c = checked(
        "applications:\n  - import_path: m:app\n    deployments: [{name: A, user_config: {k: 1}}]\n",
        {"m:app": BuiltApp("A", (dep("A", "m:A"),))},
    )
    (p,) = c.problems
    assert p.path == "applications[0].deployments[0].user_config"
    assert "m:A has no reconfigure(config) method" in p.message


def test_options_set_in_code_are_checked_like_the_file() -> None:
    bad = dep("A", "m:A", options={"num_replicas": 2, "max_ongoing_requests": 0})
    c = checked("applications:\n  - import_path: m:app\n", {"m:app": BuiltApp("A", (bad,))})
    (p,) = c.problems
    assert p.path == "applications[0].import_path[A].max_ongoing_requests"
    assert p.line == 2 and "must be >= 1" in p.message  # the line of the import_path


def test_deprecated_per_deployment_options_in_code_are_ignored_with_a_warning() -> None:
    code = dep("A", "m:A", options={"version": "3", "route_prefix": "/a"})
    c = checked("applications:\n  - import_path: m:app\n", {"m:app": BuiltApp("A", (code,))})
    assert c.problems == [] and c.apps[0].route_prefix == "/"
    assert [w.path for w in c.warnings] == [
        "applications[0].import_path[A].route_prefix",
        "applications[0].import_path[A].version",
    ]


def test_the_file_sizing_replaces_the_codes() -> None:
    code = dep("A", "m:A", options={"autoscaling_config": {"max_replicas": 5}})
    c = checked(
        "applications:\n  - import_path: m:app\n    deployments: [{name: A, num_replicas: 3}]\n",
        {"m:app": BuiltApp("A", (code,))},
    )
    (d,) = c.apps[0].deployments
    assert (d.num_replicas, d.autoscaling) == (3, None)


def test_a_build_failure_is_a_problem_at_the_import_path() -> None:
    def fails(code: CodeApp) -> BuiltApp:
        raise RuntimeError("cannot import 'm': ModuleNotFoundError: No module named 'm'")

    c = check_config("applications:\n  - name: a\n    import_path: m:app\n", build=fails)
    assert messages(c) == [("applications[0].import_path", 3,
                            "cannot import 'm': ModuleNotFoundError: No module named 'm'")]  # fmt: skip


def test_older_names_are_read_with_a_warning_and_not_twice() -> None:
    c = checked(
        """\
        applications:
          - name: a
            deployments:
              - name: A
                import_path: m:A
                autoscaling_config:
                  target_num_ongoing_requests_per_replica: 3
                  upscale_smoothing_factor: 2
        """
    )
    assert c.problems == []
    scaling = c.apps[0].deployments[0].autoscaling
    assert scaling is not None and (scaling.target_ongoing_requests, scaling.upscaling_factor) == (
        3,
        2,
    )
    assert len(c.warnings) == 2
    both = checked(
        "applications:\n  - name: a\n    deployments:\n      - {name: A, import_path: 'm:A', "
        "max_ongoing_requests: 2, max_concurrent_queries: 3}\n"
    )
    assert "give 'max_ongoing_requests' or its older name" in both.problems[0].message


def test_null_means_not_set_except_where_null_is_a_value() -> None:
    c = checked(
        """\
        applications:
          - name: a
            route_prefix: null
            version: null
            deployments:
              - name: A
                import_path: m:A
                num_replicas: null
                max_ongoing_requests: null
                user_config: null
        """
    )
    (app,) = c.apps
    assert app.route_prefix is None  # not served over HTTP
    d = app.deployments[0]
    assert (d.num_replicas, d.max_ongoing_requests, d.user_config) == (1, 5, None)


def test_env_vars_reach_the_per_deployment_form_too() -> None:
    c = checked(
        "applications:\n  - name: a\n    runtime_env: {env_vars: {MODEL_ID: m1}}\n"
        "    deployments: [{name: A, import_path: 'm:A'}]\n"
    )
    assert c.apps[0].deployments[0].env == {"MODEL_ID": "m1"}


def test_check_apps_says_an_app_defined_in_code_needs_deploy() -> None:
    apps, problems = check_apps("applications:\n  - import_path: m:app\n")
    assert apps == [] and "`fleetpulse deploy` imports and builds it" in problems[0].message


def test_dotted_import_paths_of_older_configs() -> None:
    (code,) = checked("import_path: fruit.deployment_graph\n").code_apps
    assert code.import_path == "fruit:deployment_graph"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "without a RayService"),
        (
            "apiVersion: ray.io/v1\nkind: RayService\nmetadata: {name: s}\n"
            "spec:\n  serveConfig: {importPath: a.b}\n",
            "KubeRay's older form; move it to serveConfigV2",
        ),
        (
            "apiVersion: ray.io/v1\nkind: RayService\nmetadata: {name: s}\n"
            "spec:\n  serveConfigV2: {applications: []}\n",
            "expected the config file as a string",
        ),
    ],
)
def test_manifests_without_a_serve_config(text: str, message: str) -> None:
    (p,) = check_config(text).problems
    assert message in p.message


def test_dry_run_says_what_it_did_not_check(capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(file=str(FIXTURES / "ray_builder_args.yaml"), dry_run=True)
    assert run_deploy(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("valid as far as checked without importing: llm (import_path")
    assert "not checked: that llm_serving:build_app imports and builds an application" in out
    assert "(VLLMDeployment) exist in it" in out


def test_dry_run_of_a_refused_manifest(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "rayservice.yaml"
    path.write_text(fixture("rayservice_sample.yaml").replace("working_dir: ", "conda: "))
    assert run_deploy(argparse.Namespace(file=str(path), dry_run=True)) == 2
    err = capsys.readouterr().err
    assert f"{path}:14: spec.serveConfigV2.applications[0].runtime_env.conda" in err


def test_a_built_app_round_trips_through_fp_apps() -> None:
    c = check_config(
        fixture("ray_docs_multi_app.yaml"),
        build=lambda code: {"image_classifier:app": CLASSIFIER, "text_translator:app": TRANSLATOR}[
            code.import_path
        ],
    )
    for app in c.apps:
        assert AppConfig.from_json(app.to_json()) == app


def test_an_app_level_logging_config_reaches_the_deployments_built_from_code() -> None:
    c = checked(
        """
        applications:
          - name: app1
            import_path: image_classifier:app
            logging_config: {encoding: JSON}
            deployments:
              - name: downloader
                logging_config: {log_level: DEBUG}
        """,
        {"image_classifier:app": CLASSIFIER},
    )
    assert c.problems == []
    (app,) = c.apps
    assert app.deployment("ImageClassifier").logging_config["encoding"] == "JSON"
    own = app.deployment("downloader").logging_config
    assert own["log_level"] == "DEBUG" and own["encoding"] == "TEXT"

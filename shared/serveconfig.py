"""Ray Serve's config files: apps defined in code, the legacy single-app form, RayService manifests.

How it works: `check_config` extends the app-file checker (shared/appcheck.py) with what Ray Serve
users write today, and imports nothing:
- an app-level `import_path` (a bound application or a builder taking `args`) makes a `CodeApp`:
  its `deployments` entries are optional overrides matched by name, checked key by key as far as
  they can be without the code;
- `runtime_env` (app level, over an Anyscale service file's top-level `working_dir`,
  `requirements`, `excludes`, `env_vars`) merges with each deployment's
  `ray_actor_options.runtime_env` by Ray Serve's rule (shared/runtimeenv.py): `env_vars` become
  the replicas' environment, code and requirements the deployment's `runtime_env` (local paths
  until `fleetpulse deploy` packages them); `conda`, `container`, `image_uri` are refused by name,
  with the reason, and an Anyscale file's infrastructure keys are warnings; `proxy_location`, `http_options`, `grpc_options` and the legacy
  form's `host`/`port` configure services `deploy` does not run: each is a warning naming the
  fleetpulse equivalent, never silently dropped;
- the legacy single-app form (`import_path` at the top) is read as one application, and a
  RayService manifest (Kubernetes YAML) by its `spec.serveConfigV2` string, lines mapped back
  (shared/raymanifest.py).
Given a `build` function (the deploy step that imports the code, shared/appbuild.py),
each CodeApp's `BuiltApp` is merged with its overrides (a key set in the file replaces the one
set in code) and checked like a deployment written out in the file: one set of messages.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from shared import appkeys, raymanifest, runtimeenv
from shared.appcheck import Checker, Map, value_of
from shared.appconfig import AppConfig, AutoscalingConfig, DeploymentConfig
from shared.appgraph import BuiltApp, BuiltDeployment
from shared.appkeys import RENAMED, Bad, Conv, PolicyCheck, Problem

_STR, _MAP, _SEQ = "tag:yaml.org,2002:str", "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"
_CODE_ONLY = {"import_path", "init_args", "init_kwargs"}
"""Keys of a deployment written out in full that an override of a code deployment cannot set."""

_ANYSCALE_RUNTIME = {"working_dir": "working_dir", "requirements": "pip",
                     "excludes": "excludes", "env_vars": "env_vars", "py_modules": "py_modules"}  # fmt: skip
"""Anyscale service file keys that are the apps' runtime environment (file key -> runtime_env)."""
_ANYSCALE_INFRA = [
    "name",
    "image_uri",
    "compute_config",
    "cloud",
    "containerfile",
    "query_auth_token_enabled",
    "project",
    "build_id",
    "ray_gcs_external_storage_config",
    "tracing_config",
    "version_level",
    "canary_percent",
    "max_surge_percent",
]
"""Anyscale service file keys about the machines and the service's own settings."""
_ANYSCALE_V1_WRAPPER = "ray_serve_config"
"""The older Anyscale service file (`anyscale service rollout`) nests the serve config here, beside
its own keys (`name`, `project_id`, `cluster_env`, `build_id`, `compute_config`, `version`,
`rollout_strategy`, `canary_percent`, `config`, ...), every one of them about the service itself."""
_PROXY_FLAGS = {
    "host": "`fleetpulse proxy --host` (FLEETPULSE_PROXY_HOST)",
    "port": "`fleetpulse proxy --port` (or `fleetpulse up --http-port`)",
    "request_timeout_s": "`fleetpulse proxy --request-timeout`",
}


@dataclass(frozen=True, slots=True, eq=False)
class CodeApp:
    """An application whose deployments are defined in code: built by `fleetpulse deploy`."""

    name: str
    path: str
    """Its field path in the file (`applications[0]`), for messages."""
    import_path: str
    args: Mapping[str, Any] | None
    env: Mapping[str, str]
    logging: Mapping[str, Any] | None
    """The app's `logging_config`, for the deployments that set none."""
    route_prefix: str | None
    version: str
    overrides: Mapping[str, tuple[str, MappingNode]]
    """Deployment name -> (field path, its entry) from the file's `deployments`."""
    import_node: Node
    index: int
    """Its place among the file's applications."""
    runtime_env: Mapping[str, Any] = field(default_factory=dict)
    """The app's runtime_env as written (merged over a service file's top level): the build
    imports from its working_dir and py_modules."""


@dataclass(slots=True)
class Checked:
    """What `check_config` found: apps ready to deploy, apps still to build (none once a build
    function was given), every problem and every warning."""

    apps: list[AppConfig] = field(default_factory=list)
    code_apps: list[CodeApp] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    manifest: str | None = None
    """Set when the file was a RayService manifest: which one."""


Build = Callable[[CodeApp], BuiltApp]
"""Imports and builds a CodeApp; raises an Exception whose message says why it cannot."""


def check_config(
    text: str, check_policy: PolicyCheck | None = None, build: Build | None = None
) -> Checked:
    """The whole check of a config file's text (see the module docstring)."""
    inner, offset, manifest, early = raymanifest.unwrap(text)
    out = Checked(manifest=manifest, problems=early)
    if inner is None:
        return out
    loader = yaml.SafeLoader(inner)
    try:
        try:
            root = loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            out.problems.append(appkeys.syntax_problem(exc))
            return _relocate(out, offset, manifest)
        except yaml.YAMLError as exc:
            out.problems.append(Problem("", None, f"YAML syntax error: {exc}"))
            return _relocate(out, offset, manifest)
        checker = ServeChecker(loader, check_policy)
        built = checker.file(root)
        order = {id(a): i for i, a in enumerate(built)}
        out.apps, out.code_apps = built, checker.code_apps
        out.problems += checker.problems
        out.warnings += checker.warnings
    finally:
        loader.dispose()
    if build is not None and not out.problems:
        _build_all(out, build, check_policy, order)
    if checker.wrapper:  # an older Anyscale service file: paths as the file nests them
        outer = set(checker.outer)
        out.problems = [_under(checker.wrapper, p) for p in out.problems]
        out.warnings = [w if w in outer else _under(checker.wrapper, w) for w in out.warnings]
    out.problems.sort(key=lambda p: p.line or 0)
    out.warnings = sorted(set(out.warnings), key=lambda p: (p.line or 0, p.path))
    return _relocate(out, offset, manifest)


def _build_all(
    out: Checked, build: Build, check_policy: PolicyCheck | None, order: dict[int, int]
) -> None:
    ranked: list[tuple[float, AppConfig]] = [(order[id(a)], a) for a in out.apps]
    for code in out.code_apps:
        try:
            graph = build(code)
        except Exception as exc:
            line = appkeys.node_line(code.import_node)
            out.problems.append(Problem(f"{code.path}.import_path", line, str(exc)))
            continue
        app, problems, warnings = complete(code, graph, check_policy)
        out.problems += problems
        out.warnings += warnings
        if app is not None:
            ranked.append((code.index - 0.5, app))
    out.apps = [a for _, a in sorted(ranked, key=lambda r: r[0])]
    out.code_apps = []


class ServeChecker(Checker):
    """appcheck's checker, plus the Ray Serve forms (see the module docstring)."""

    app_keys: Mapping[str, Conv | None] = {
        **appkeys.APP_KEYS,
        "import_path": lambda value: appkeys.to_import_path(_colon_form(value)),
        "args": None,
        "runtime_env": None,
    }

    def __init__(self, loader: yaml.SafeLoader, check_policy: PolicyCheck | None = None) -> None:
        super().__init__(loader, check_policy)
        self.code_apps: list[CodeApp] = []
        self._legacy = False
        self._file_runtime_nodes: list[tuple[str, Node, Node]] = []
        self._file_runtime: dict[str, Any] | None = None
        self._runtime_by_node: dict[int, dict[str, Any]] = {}
        self._file_logging: Node | None = None
        self._file_logging_checked: tuple[Mapping[str, Any] | None] | None = None
        self.wrapper = ""
        """`ray_serve_config` when the file is an older Anyscale service file."""
        self.outer: list[Problem] = []
        """The warnings about such a file's own keys (their paths are not under the wrapper)."""

    def file(self, root: Node | None) -> list[AppConfig]:
        if isinstance(root, MappingNode):
            try:
                self.loader.flatten_mapping(root)
            except yaml.YAMLError:
                return super().file(root)  # its mapping check reports the bad merge key
            root = self._older_anyscale(root)
            root = self._infrastructure(root)
            keys = appkeys.node_keys(root)
            if "import_path" in keys and "applications" not in keys:
                root = self._legacy_form(root)
        return super().file(root)

    def _older_anyscale(self, root: MappingNode) -> MappingNode:
        """An older Anyscale service file: its `ray_serve_config`, the other keys warned of."""
        keys = appkeys.node_keys(root)
        inner = value_of(root, _ANYSCALE_V1_WRAPPER)
        if not isinstance(inner, MappingNode) or {"applications", "import_path"} & set(keys):
            return root
        try:
            self.loader.flatten_mapping(inner)
        except yaml.YAMLError:
            return root
        for key_node, _ in root.value:
            if key_node.value != _ANYSCALE_V1_WRAPPER:
                self.warn(
                    str(key_node.value), key_node, "ignored: a setting of the Anyscale service "
                    f"itself (an Anyscale service file of the older schema: its {_ANYSCALE_V1_WRAPPER} "
                    "is read as the serve config)",
                )  # fmt: skip
        self.outer = list(self.warnings)
        self.wrapper = _ANYSCALE_V1_WRAPPER
        return inner

    def check_runtime(self, raw: Any, path: str, node: Node) -> dict[str, Any]:
        if isinstance(raw, Mapping) and "upload_path" in raw:  # Anyscale's, for the working_dir
            self.warn(
                f"{path}.upload_path" if path else "upload_path", value_of(node, "upload_path")
                or node, "ignored: where Anyscale uploads a local working_dir; fleetpulse "
                "packages it into NATS's object store",
            )  # fmt: skip
            raw = {k: v for k, v in raw.items() if k != "upload_path"}
        return super().check_runtime(raw, path, node)

    def _infrastructure(self, root: MappingNode) -> MappingNode:
        """Take out the keys about Ray's own services, with a warning each."""
        kept = []
        for key_node, value in root.value:
            key = key_node.value if isinstance(key_node, ScalarNode) else None
            if key == "proxy_location":
                self.warn(
                    key, key_node, "ignored: fleetpulse's HTTP proxies run where you start "
                    "`fleetpulse proxy` (or `fleetpulse up`), as many as you like; the app "
                    "stays reachable through every one, and through the NATS gateway",
                )  # fmt: skip
            elif key == "http_options":
                self._options(key, value, _PROXY_FLAGS, "the HTTP proxy is its own service")
            elif key in _ANYSCALE_RUNTIME:
                self._file_runtime_nodes.append((key, key_node, value))
            elif key in _ANYSCALE_INFRA:
                self.warn(
                    key, key_node, "ignored: an Anyscale service setting about machines or the "
                    "service itself; fleetpulse runs on the agents you start",
                )  # fmt: skip
            elif key == "logging_config":
                # Ray Serve: the controller's and proxies' logging, and each app's that sets none
                self._file_logging = value
                self.warn(
                    key, key_node, "applied to each application that sets no logging_config "
                    "(as in Ray Serve); fleetpulse's own services log as their flags say",
                )  # fmt: skip
            elif key == "grpc_options":
                self.warn(
                    key, key_node, "ignored: fleetpulse has no gRPC ingress; callers in any "
                    "language use the router gateway on NATS (fp.v1.call.{app}.{deployment})",
                )  # fmt: skip
            else:
                kept.append((key_node, value))
        return MappingNode(root.tag, kept, root.start_mark, root.end_mark)

    def _options(self, path: str, node: Node, flags: Mapping[str, str], why: str) -> None:
        if not isinstance(node, MappingNode):
            self.warn(path, node, f"ignored ({why})")
            return
        for key_node, _ in node.value:
            key = str(key_node.value)
            if key in flags:
                message = f"not applied by deploy ({why}): set it with {flags[key]}; ignored"
            else:
                message = f"ignored: no fleetpulse equivalent ({why})"
            self.warn(f"{path}.{key}", key_node, message)

    def _legacy_form(self, root: MappingNode) -> MappingNode:
        """Ray Serve's single-app file (before multi-app configs): one app, `host`/`port` of
        its proxy at the top."""
        self._legacy = True
        kept = []
        for key_node, value in root.value:
            key = key_node.value if isinstance(key_node, ScalarNode) else None
            if key in ("host", "port"):
                flag = _PROXY_FLAGS[key]
                self.warn(key, key_node, f"not applied by deploy: set it with {flag}; ignored")
            else:
                kept.append((key_node, value))
        self.warn("", root, "the single-application form (Ray Serve before 2.4): read as "
                  "`applications: [...]` with one app, named 'default' unless it has a name")  # fmt: skip
        app = MappingNode(root.tag, kept, root.start_mark, root.end_mark)
        seq = SequenceNode(_SEQ, [app], root.start_mark, root.end_mark)
        return MappingNode(_MAP, [(ScalarNode(_STR, "applications"), seq)], root.start_mark)

    def app_logging(self, m: Map, path: str) -> Mapping[str, Any] | None:
        if "logging_config" in m.nodes or self._file_logging is None:
            return super().app_logging(m, path)
        if self._file_logging_checked is None:  # checked once, whatever the number of apps
            self._file_logging_checked = (
                self.logging_config(self._file_logging, "logging_config"),
            )
        return self._file_logging_checked[0]

    def autoscaling(
        self, node: Node | None, path: str, defaults: Mapping[str, Any] | None = None
    ) -> AutoscalingConfig | None:
        """Also Ray Serve's `smoothing_factor` (deprecated there: both factors unless either is
        set) and `aggregation_function` ('mean', what fleetpulse's window does)."""
        smoothing: float | None = None
        if isinstance(node, MappingNode):
            where = path if defaults is None else f"{path}.autoscaling_config"
            given = {RENAMED.get(k.value, k.value) for k, v in node.value
                     if isinstance(k, ScalarNode) and not appkeys.is_null(v)}  # fmt: skip
            kept = []
            for key_node, value in node.value:
                key = key_node.value if isinstance(key_node, ScalarNode) else None
                if key not in ("smoothing_factor", "aggregation_function"):
                    kept.append((key_node, value))
                elif not appkeys.is_null(value):
                    smoothing = self._ray_scaling_key(key, value, f"{where}.{key}", smoothing)
            node = MappingNode(node.tag, kept, node.start_mark, node.end_mark)
        scaling = super().autoscaling(node, path, defaults)
        if scaling is None or smoothing is None:
            return scaling
        up = scaling.upscaling_factor if "upscaling_factor" in given else smoothing
        down = scaling.downscaling_factor if "downscaling_factor" in given else smoothing
        return replace(scaling, upscaling_factor=up, downscaling_factor=down)

    def _ray_scaling_key(
        self, key: str, node: Node, path: str, smoothing: float | None
    ) -> float | None:
        try:
            value = self.construct(node)
        except Bad as exc:
            self.add(path, node, exc.message)
            return smoothing
        if key == "aggregation_function":
            if value != "mean":
                self.add(path, node, f"only 'mean' (fleetpulse averages the demand over "
                         f"look_back_period_s), got {appkeys.show_value(value)}")  # fmt: skip
            return smoothing
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            self.add(path, node, f"expected a number > 0, got {appkeys.show_value(value)}")
            return smoothing
        self.warn(path, node, "Ray Serve's deprecated smoothing_factor: read as upscaling_factor "
                  "and downscaling_factor, where those are not set")  # fmt: skip
        return float(value)

    def policy(self, node: Node, path: str) -> str | None:
        """Ray Serve also reads a policy's `module.function` form."""
        if isinstance(node, MappingNode):
            pairs = [(k, _colon_node(v) if k.value in ("policy_function", "name") else v)
                     for k, v in node.value]  # fmt: skip
            node = MappingNode(node.tag, pairs, node.start_mark, node.end_mark)
        return super().policy(node, path)

    def app_env(self, m: Map, path: str) -> Mapping[str, str]:
        env = self.app_runtime(m, path).get("env_vars") or {}
        return dict(env)

    def file_runtime(self) -> dict[str, Any]:
        """An Anyscale service file's top-level working_dir, requirements, excludes, env_vars:
        the runtime_env every app of the file starts from."""
        if self._file_runtime is not None:
            return self._file_runtime
        raw: dict[str, Any] = {}
        for key, _, value in self._file_runtime_nodes:
            try:
                raw[_ANYSCALE_RUNTIME[key]] = self.construct(value)
            except Bad as exc:
                self.add(key, value, exc.message)
        self._file_runtime = (
            self.check_runtime(raw, "", self._file_runtime_nodes[0][1]) if raw else {}
        )
        if raw:
            keys = ", ".join(k for k, _, _ in self._file_runtime_nodes)
            self.warn("", self._file_runtime_nodes[0][1], "an Anyscale service file: every "
                      f"application's runtime_env starts from its top-level {keys}")  # fmt: skip
        return self._file_runtime

    def app_runtime(self, m: Map, path: str) -> Mapping[str, Any]:
        """The app's runtime_env as written, over the file's top level (checked once)."""
        cached = self._runtime_by_node.get(id(m.node))
        if cached is not None:
            return cached
        node = m.nodes.get("runtime_env")
        raw: dict[str, Any] = {}
        if node is not None:
            path = f"{path}.runtime_env"
            if not isinstance(node, MappingNode):
                self.add(path, node, f"expected a mapping, got {appkeys.node_kind(node)}")
            else:
                try:
                    value = self.construct(node)
                except Bad as exc:
                    self.add(path, node, exc.message)
                    value = {}
                raw = self.check_runtime(value or {}, path, node)
        out = runtimeenv.merge(self.file_runtime(), raw)
        self._runtime_by_node[id(m.node)] = out
        return out

    def code_app(self, m: Map, path: str) -> None:
        before = len(self.problems)
        if "ingress" in m.nodes:
            self.add(
                f"{path}.ingress", m.nodes["ingress"], "not used with an app-level import_path: "
                "the ingress is the deployment it binds at the root; remove ingress",
            )  # fmt: skip
        args = self._args(m.nodes.get("args"), f"{path}.args")
        env = self.app_env(m, path)
        runtime = self.app_runtime(m, path)
        logs = self.app_logging(m, path)
        overrides = self._overrides(m.nodes.get("deployments"), path, env, runtime)
        if len(self.problems) != before or not {"name", "import_path"} <= m.values.keys():
            return
        self.code_apps.append(
            CodeApp(
                name=m.values["name"],
                path=path,
                import_path=m.values["import_path"],
                args=args,
                env=env,
                logging=logs,
                route_prefix=m.values.get("route_prefix", appkeys.DEFAULT_ROUTE_PREFIX),
                version=m.values.get("version", ""),
                overrides=overrides,
                import_node=m.nodes["import_path"],
                index=int(path.rpartition("[")[2].rstrip("]") or 0),
                runtime_env=runtime,
            )
        )

    def _args(self, node: Node | None, path: str) -> dict[str, Any] | None:
        """The builder's args: a mapping of any JSON values."""
        return None if node is None else self.json_arg(node, path, dict, argument_names=False)

    def _overrides(
        self, node: Node | None, path: str, env: Mapping[str, str], runtime: Mapping[str, Any]
    ) -> dict[str, tuple[str, MappingNode]]:
        out: dict[str, tuple[str, MappingNode]] = {}
        if node is None:
            return out
        if not isinstance(node, SequenceNode):
            self.add(f"{path}.deployments", node, f"expected a list, got {appkeys.node_kind(node)}")
            return out
        names: dict[str, int | None] = {}
        for j, item in enumerate(node.value):
            dpath = f"{path}.deployments[{j}]"
            d = self.mapping(item, dpath, self.deployment_keys)
            if d is None:
                continue
            for key in sorted(_CODE_ONLY & d.nodes.keys()):
                self.add(
                    f"{dpath}.{key}", d.nodes[key], "set in code when the app has an import_path "
                    f"(a deployments entry overrides options by name); remove {key}",
                )  # fmt: skip
            if not self.required(d, dpath, "name", "the name of a deployment in the code"):
                continue
            self.unique(d, dpath, names, "deployment")
            self.deployment(d, dpath, env, import_path="code.defined:Deployment", runtime=runtime)
            out[d.values["name"]] = (dpath, item)
        return out


def _under(wrapper: str, p: Problem) -> Problem:
    return replace(p, path=f"{wrapper}.{p.path}" if p.path else wrapper)


def _colon_node(node: Node) -> Node:
    if isinstance(node, ScalarNode) and node.tag == _STR and _colon_form(node.value) != node.value:
        return ScalarNode(node.tag, _colon_form(node.value), node.start_mark, node.end_mark)
    return node


def _colon_form(value: Any) -> Any:
    """Ray Serve also reads `module.attribute` (older configs: `fruit.deployment_graph`)."""
    if isinstance(value, str) and ":" not in value and "." in value:
        module, _, attr = value.rpartition(".")
        return f"{module}:{attr}"
    return value


def complete(
    app: CodeApp, graph: BuiltApp, check_policy: PolicyCheck | None = None
) -> tuple[AppConfig | None, list[Problem], list[Problem]]:
    """The AppConfig of a built CodeApp: code options under the file's overrides, checked as a
    deployment of the file; or None with the problems."""
    checker = ServeChecker(yaml.SafeLoader(""), check_policy)
    mark = app.import_node.start_mark
    where = f"{app.path}.import_path"
    names = [d.name for d in graph.deployments]
    for name, (dpath, node) in app.overrides.items():
        if name not in names:
            checker.add(
                f"{dpath}.name", node, f"no deployment {name!r} in the application "
                f"{app.import_path} builds (it has: {', '.join(names)})",
            )  # fmt: skip
    deployments: list[DeploymentConfig] = []
    for built in graph.deployments:
        dpath, override = app.overrides.get(built.name, (f"{where}[{built.name}]", None))
        for key in sorted({"version", "route_prefix"} & built.options.keys()):
            checker.warn(
                f"{where}[{built.name}].{key}", app.import_node, f"ignored: Ray Serve's "
                f"deprecated per-deployment {key}; set the application's {key} in the file",
            )  # fmt: skip
        try:
            code_node = _code_node(built, mark)
        except Bad as exc:
            checker.add(f"{where}[{built.name}]", app.import_node, exc.message)
            continue
        merged = _merge(code_node, override)
        d = checker.mapping(merged, dpath, checker.deployment_keys)
        if d is None:
            continue
        dep = checker.deployment(
            d, dpath, app.env, import_path=built.import_path, logging=app.logging,
            runtime=app.runtime_env,
        )  # fmt: skip
        if dep is not None and dep.user_config is not None and not built.has_reconfigure:
            checker.add(
                f"{dpath}.user_config", d.nodes.get("user_config"), f"{built.import_path} has no "
                "reconfigure(config) method to receive it; add one or remove user_config",
            )  # fmt: skip
        elif dep is not None:
            deployments.append(dep)
    if checker.problems:
        return None, checker.problems, checker.warnings
    try:
        config = AppConfig(
            name=app.name,
            deployments=tuple(deployments),
            route_prefix=app.route_prefix,
            ingress=graph.ingress,
            version=app.version,
        )
    except Exception as exc:
        return (
            None,
            [Problem(where, appkeys.node_line(app.import_node), str(exc))],
            checker.warnings,
        )
    return config, [], checker.warnings


def _code_node(built: BuiltDeployment, mark: Any) -> MappingNode:
    """The deployment as the code defines it, as YAML nodes that point at the import_path."""
    values: dict[str, Any] = {"name": built.name}
    for key, value in built.options.items():
        if key in ("version", "route_prefix"):
            continue  # Ray's deprecated per-deployment options; the app's own apply
        values[key] = value
    if built.init_args:
        values["init_args"] = list(built.init_args)
    if built.init_kwargs:
        values["init_kwargs"] = dict(built.init_kwargs)
    try:
        plain = json.loads(json.dumps(values))
    except (TypeError, ValueError) as exc:
        raise Bad(
            f"deployment {built.name!r}: an option set in code is not a plain value ({exc}); "
            "give options as in an app file (numbers, strings, mappings)"
        ) from None
    node = yaml.representer.SafeRepresenter().represent_data(plain)
    _stamp(node, mark)
    assert isinstance(node, MappingNode)
    return node


def _stamp(node: Node, mark: Any) -> None:
    node.start_mark = node.end_mark = mark
    if isinstance(node, MappingNode):
        for k, v in node.value:
            _stamp(k, mark)
            _stamp(v, mark)
    elif isinstance(node, SequenceNode):
        for v in node.value:
            _stamp(v, mark)


def _merge(code: MappingNode, override: MappingNode | None) -> MappingNode:
    """Keys set in the file replace those set in code; one way of sizing wins as a whole (a
    file's num_replicas drops the code's autoscaling_config and the other way round, unless
    it is `num_replicas: auto`, which takes an autoscaling_config)."""
    if override is None:
        return code
    given: dict[str, Node] = {}
    for k, v in override.value:
        key = k.value if isinstance(k, ScalarNode) else None
        if RENAMED.get(key or "") in appkeys.DEPLOYMENT_KEYS:
            key = RENAMED[str(key)]
        if key is not None and not appkeys.is_null(v):
            given[str(key)] = v
    drop = set(given)
    num = given.get("num_replicas")
    if num is not None and not (isinstance(num, ScalarNode) and num.value == "auto"):
        drop.add("autoscaling_config")
    code_num = next((v for k, v in code.value if k.value == "num_replicas"), None)
    if "autoscaling_config" in given and not (code_num is not None and code_num.value == "auto"):
        drop.add("num_replicas")
    kept = [(k, v) for k, v in code.value if k.value not in drop]
    return MappingNode(_MAP, kept + list(override.value), override.start_mark, override.end_mark)


def _show(value: Any) -> str:
    return appkeys.show_value(value)


def _relocate(out: Checked, offset: int, manifest: str | None) -> Checked:
    out.problems = raymanifest.relocate(out.problems, offset, manifest)
    out.warnings = raymanifest.relocate(out.warnings, offset, manifest)
    return out

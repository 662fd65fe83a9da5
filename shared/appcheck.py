"""The app file's checker: walks PyYAML's node tree against the key tables (shared/appkeys.py).

How it works: the text is composed into PyYAML's node tree (not loaded into plain dicts), so every
value keeps the line it came from. `Checker` walks the tree against the key tables, converting
each scalar with PyYAML's safe constructor and checking its type and range; it never stops at the
first mistake but collects a `Problem` (field path, line, message) for each, so one run of
`fleetpulse deploy --dry-run` shows everything to fix. Unknown keys are problems too (a typo must
not silently become a default), with a suggestion when a known key is close. Only a subtree
without problems is turned into the frozen dataclasses of shared.appconfig; whatever those still
reject is reported under the same field path.

Extension points (shared/serveconfig.py's `ServeChecker` uses them): the `app_keys` and
`deployment_keys` tables, and the methods `code_app` (an app defined in code) and `app_env` (an
app's environment for its replicas).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from shared import logconfig, resources, rollout, runtimeenv
from shared.appconfig import AppConfig, AutoscalingConfig, DeploymentConfig
from shared.appkeys import (
    ACTOR_KEYS,
    APP_KEYS,
    AUTO_SCALING_DEFAULTS,
    AUTOSCALING_KEYS,
    DEFAULT_APP_NAME,
    DEFAULT_NUM_REPLICAS,
    DEFAULT_ROUTE_PREFIX,
    DEPLOYMENT_KEYS,
    IDENTIFIER_RE,
    LOGGING_KEYS,
    MERGE_TAG,
    NULL_IS_A_VALUE,
    POLICY_KEYS,
    RENAMED,
    ROLLOUT_KEYS,
    TOP_KEYS,
    Bad,
    Conv,
    PolicyCheck,
    Problem,
    first_non_json,
    is_null,
    node_kind,
    node_line,
    show_value,
    unknown_key,
    user_config_value,
)
from shared.errors import ConfigError, UsageError

_T = TypeVar("_T")


@dataclass(slots=True)
class Map:
    """A checked YAML mapping: converted values, and each key's value node (for lines)."""

    node: Node
    values: dict[str, Any]
    nodes: dict[str, Node]

    def line(self, key: str) -> int | None:
        node = self.nodes.get(key)
        return node_line(self.node if node is None else node)


class Checker:
    """Walks the node tree, collecting problems; returns what is valid."""

    def __init__(self, loader: yaml.SafeLoader, check_policy: PolicyCheck | None = None) -> None:
        self.loader = loader
        self.check_policy = check_policy
        self.problems: list[Problem] = []
        self.warnings: list[Problem] = []
        self.base_dir = os.getcwd()
        """Relative working_dir / py_modules / requirements paths start here (as in Ray)."""

    app_keys: Mapping[str, Conv | None] = APP_KEYS
    deployment_keys: Mapping[str, Conv | None] = DEPLOYMENT_KEYS

    def warn(self, path: str, node: Node | None, message: str) -> None:
        self.warnings.append(Problem(path, None if node is None else node_line(node), message))

    def add(self, path: str, node: Node | None, message: str) -> None:
        self.problems.append(Problem(path, None if node is None else node_line(node), message))

    def construct(self, node: Node) -> Any:
        try:
            return self.loader.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or str(exc)
            raise Bad(f"unsupported YAML value: {problem}") from None

    # -- structure -------------------------------------------------------------------------

    def mapping(self, node: Node, path: str, keys: Mapping[str, Conv | None]) -> Map | None:
        """Check a mapping's keys and convert the values of the keys with a conversion."""
        if not isinstance(node, MappingNode):
            self.add(path, node, f"expected a mapping, got {node_kind(node)}")
            return None
        explicit = sum(1 for k, _ in node.value if k.tag != MERGE_TAG)
        try:
            self.loader.flatten_mapping(node)  # resolves `<<: *anchor` merge keys
        except yaml.YAMLError as exc:
            self.add(path, node, f"bad merge key: {getattr(exc, 'problem', exc)}")
            return None
        merged = len(node.value) - explicit  # flatten_mapping puts merged pairs first
        out = Map(node, {}, {})
        from_merge: set[str] = set()
        renamed: set[str] = set()
        for index, (key_node, value_node) in enumerate(node.value):
            key = key_node.value if isinstance(key_node, ScalarNode) else None
            if not isinstance(key, str) or not key_node.tag.endswith(":str"):
                self.add(path, key_node, f"keys must be names, got {node_kind(key_node)}")
                continue
            sub = f"{path}.{key}" if path else key
            if key in renamed and is_null(value_node):
                continue  # the current name null, the older one set: that one holds
            if key in out.nodes and key not in from_merge:
                self.add(sub, key_node, f"duplicate key (first at line {out.line(key)})")
                continue
            # a key written out overrides one merged from an anchor, as in YAML's merge spec
            out.values.pop(key, None)
            from_merge.discard(key)
            if index < merged:
                from_merge.add(key)
            if key not in keys and RENAMED.get(key) in keys:
                new = RENAMED[key]
                if is_null(value_node):
                    continue  # not set (`serve build` writes both names, one of them null)
                self.warn(sub, key_node, f"Ray Serve's older name of {new!r}; read as {new!r}")
                other = value_of(node, new)
                if other is not None and not is_null(other):
                    self.add(sub, key_node, f"give {new!r} or its older name {key!r}, not both")
                    continue
                renamed.add(new)
                key, sub = new, f"{path}.{new}" if path else new
            if key not in keys:
                self.add(sub, key_node, unknown_key(key, keys))
                continue
            if is_null(value_node) and key not in NULL_IS_A_VALUE:
                continue  # null: not set, the default applies
            out.nodes[key] = value_node
            conv = keys[key]
            if conv is not None:
                try:
                    out.values[key] = conv(self.construct(value_node))
                except Bad as exc:
                    self.add(sub, value_node, exc.message)
        return out

    def sequence(self, node: Node, path: str) -> list[Node] | None:
        if not isinstance(node, SequenceNode):
            self.add(path, node, f"expected a list, got {node_kind(node)}")
            return None
        if not node.value:
            self.add(path, node, "must not be empty")
            return None
        items: list[Node] = node.value
        return items

    def required(self, m: Map, path: str, key: str, hint: str) -> bool:
        if key in m.nodes:
            return key in m.values
        self.add(f"{path}.{key}", m.node, f"required ({hint})")
        return False

    # -- the file, applications, deployments ------------------------------------------------

    def file(self, root: Node | None) -> list[AppConfig]:
        if root is None:
            self.add("", None, "the file is empty; expected 'applications:' with a list of apps")
            return []
        top = self.mapping(root, "", TOP_KEYS)
        if top is None:
            return []
        if "applications" not in top.nodes:
            self.add("applications", root, "required (a list of applications)")
            return []
        items = self.sequence(top.nodes["applications"], "applications")
        if items is None:
            return []
        apps: list[AppConfig] = []
        names: dict[str, int | None] = {}
        prefixes: dict[str, str] = {}
        for i, item in enumerate(items):
            path = f"applications[{i}]"
            before = len(self.problems)
            m = self.mapping(item, path, self.app_keys)
            if m is None:
                continue
            if "name" not in m.nodes and "import_path" in m.nodes:
                m.values["name"], m.nodes["name"] = DEFAULT_APP_NAME, m.node  # Ray Serve's
            if self.required(m, path, "name", "a name like 'echo'"):
                self.unique(m, path, names, "application")
            prefix = m.values.get("route_prefix", DEFAULT_ROUTE_PREFIX)
            if "route_prefix" in m.values or "route_prefix" not in m.nodes:
                self._unique_prefix(m, path, prefix, prefixes)
            app = self.app(m, path)
            if app is not None and len(self.problems) == before:
                apps.append(app)
        return apps

    def unique(self, m: Map, path: str, seen: dict[str, int | None], what: str) -> None:
        name = m.values["name"]
        if name in seen:
            message = f"duplicate {what} name {name!r} (first at line {seen[name]})"
            self.add(f"{path}.name", m.nodes["name"], message)
        else:
            seen[name] = m.line("name")

    def _unique_prefix(self, m: Map, path: str, prefix: str | None, seen: dict[str, str]) -> None:
        if prefix is None:
            return
        owner = m.values.get("name", path)
        if prefix in seen:
            default = "" if "route_prefix" in m.nodes else " (the default)"
            self.add(
                f"{path}.route_prefix",
                m.nodes.get("route_prefix", m.node),
                f"{prefix!r}{default} is also the route_prefix of {seen[prefix]!r}; "
                "give each application its own",
            )
        else:
            seen[prefix] = str(owner)

    def app(self, m: Map, path: str) -> AppConfig | None:
        if "import_path" in m.nodes:  # defined in code: shared/serveconfig.py
            self.code_app(m, path)
            return None
        env = self.app_env(m, path)
        runtime = self.app_runtime(m, path)
        logs = self.app_logging(m, path)
        before = len(self.problems)
        deployments: list[DeploymentConfig] = []
        dep_names: dict[str, int | None] = {}
        all_named = True  # else an ingress naming the unnamed one must not be reported too
        items = None
        if "deployments" in m.nodes:
            items = self.sequence(m.nodes["deployments"], f"{path}.deployments")
        else:
            self.add(f"{path}.deployments", m.node, "required (a list of deployments)")
        for j, item in enumerate(items or ()):
            dpath = f"{path}.deployments[{j}]"
            d = self.mapping(item, dpath, self.deployment_keys)
            if d is None:
                continue
            all_named = all_named and "name" in d.values
            if "name" in d.values:
                self.unique(d, dpath, dep_names, "deployment")
            dep = self.deployment(d, dpath, env=env, logging=logs, runtime=runtime)
            if dep is not None:
                deployments.append(dep)
        ingress = m.values.get("ingress")
        if ingress is not None and items is not None and all_named and ingress not in dep_names:
            known = ", ".join(repr(n) for n in dep_names) or "none"
            self.add(
                f"{path}.ingress",
                m.nodes["ingress"],
                f"{ingress!r} is not a deployment of this application (deployments: {known})",
            )
        if len(self.problems) != before or not deployments or "name" not in m.values:
            return None
        return self.build(
            path,
            m,
            lambda: AppConfig(
                name=m.values["name"],
                deployments=tuple(deployments),
                route_prefix=m.values.get("route_prefix", DEFAULT_ROUTE_PREFIX),
                ingress=ingress if ingress is not None else deployments[0].name,
                version=m.values.get("version", ""),
            ),
        )

    def code_app(self, m: Map, path: str) -> None:
        """An app whose deployments are defined in code (shared/serveconfig.py checks it)."""
        self.add(f"{path}.import_path", m.nodes["import_path"], "needs the code-first checker")

    def app_env(self, m: Map, path: str) -> Mapping[str, str]:
        """The app's environment variables for its replicas (shared/serveconfig.py)."""
        return {}

    def app_runtime(self, m: Map, path: str) -> Mapping[str, Any]:
        """The app's runtime_env as written, checked (shared/serveconfig.py)."""
        return {}

    def resolve_path(self, value: str) -> str:
        full = os.path.normpath(os.path.join(self.base_dir, os.path.expanduser(value)))
        if not os.path.isdir(full):
            raise ValueError(
                f"{value!r} is not a directory (relative paths start at {self.base_dir})"
            )
        return full

    def read_file(self, value: str) -> str:
        with open(os.path.join(self.base_dir, value), encoding="utf-8") as f:
            return f.read()

    def normalise_runtime(self, raw: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        """runtimeenv.normalise with this checker's file access; RuntimeEnvError."""
        return runtimeenv.normalise(raw, resolve_path=self.resolve_path, read_file=self.read_file)

    def check_runtime(self, raw: Any, path: str, node: Node) -> dict[str, Any]:
        """`raw` if it is a runtime_env fleetpulse can use, else {} with the problem reported
        under `path` (and the key at fault)."""
        if not isinstance(raw, Mapping):
            self.add(path, node, f"expected a mapping, got {show_value(raw)}")
            return {}
        try:
            self.normalise_runtime(raw)
        except runtimeenv.RuntimeEnvError as exc:
            where = f"{path}.{exc.key}" if path and exc.key else (path or exc.key)
            self.add(where, _child(node, exc.key.split(".")[0].split("[")[0]), exc.message)
            return {}
        return dict(raw)

    def app_logging(self, m: Map, path: str) -> Mapping[str, Any] | None:
        """The app's `logging_config`: each deployment's that sets none (as in Ray Serve)."""
        node = m.nodes.get("logging_config")
        return None if node is None else self.logging_config(node, f"{path}.logging_config")

    def deployment(
        self, d: Map, path: str, env: Mapping[str, str] | None = None, import_path: str = "",
        logging: Mapping[str, Any] | None = None, runtime: Mapping[str, Any] | None = None,
    ) -> DeploymentConfig | None:  # fmt: skip
        """`import_path` given: the deployment is defined in code (the file may not set it)."""
        before = len(self.problems)
        self.required(d, path, "name", "a name like 'Echo'")
        if not import_path:
            self.required(d, path, "import_path", "like 'package.module:Class'")
        kwargs: dict[str, Any] = dict(d.values)  # only keys with a scalar conversion
        if import_path:
            kwargs["import_path"] = import_path
        if env:
            kwargs["env"] = dict(env)
        if "user_config" in d.nodes:
            kwargs["user_config"] = self.user_config(d.nodes["user_config"], f"{path}.user_config")
        if "init_args" in d.nodes:
            args = self.json_arg(d.nodes["init_args"], f"{path}.init_args", list)
            kwargs["init_args"] = tuple(args or ())
        if "init_kwargs" in d.nodes:
            kwargs["init_kwargs"] = self.json_arg(
                d.nodes["init_kwargs"], f"{path}.init_kwargs", dict
            )
        scaling = None
        auto = kwargs.get("num_replicas") == "auto"
        if auto:
            del kwargs["num_replicas"]
            scaling = self.autoscaling(
                d.nodes.get("autoscaling_config"), path, AUTO_SCALING_DEFAULTS
            )
        elif "autoscaling_config" in d.nodes:
            scaling = self.autoscaling(d.nodes["autoscaling_config"], f"{path}.autoscaling_config")
            if "num_replicas" in d.nodes:
                self.add(
                    f"{path}.num_replicas",
                    d.nodes["num_replicas"],
                    "set num_replicas or autoscaling_config, not both",
                )
        elif "num_replicas" not in d.nodes:
            kwargs["num_replicas"] = DEFAULT_NUM_REPLICAS
        child: Mapping[str, Any] = {}
        if "ray_actor_options" in d.nodes:
            request = self.actor_options(d.nodes["ray_actor_options"], f"{path}.ray_actor_options")
            kwargs["resources"] = request or {}
            rnode = value_of(d.nodes["ray_actor_options"], "runtime_env")
            if rnode is not None and not is_null(rnode):
                rpath = f"{path}.ray_actor_options.runtime_env"
                try:
                    child = self.check_runtime(self.construct(rnode), rpath, rnode)
                except Bad as exc:
                    self.add(rpath, rnode, exc.message)
        if runtime or child:
            try:
                rt, env_vars = self.normalise_runtime(runtimeenv.merge(runtime or {}, child))
            except runtimeenv.RuntimeEnvError as exc:
                self.add(f"{path}.ray_actor_options.runtime_env.{exc.key}", d.node, exc.message)
            else:
                if env_vars:
                    kwargs["env"] = env_vars
                if rt:
                    kwargs["runtime_env"] = rt
        if "logging_config" in d.nodes:
            logs = self.logging_config(d.nodes["logging_config"], f"{path}.logging_config")
            kwargs["logging_config"] = logs or {}
        elif logging:
            kwargs["logging_config"] = dict(logging)
        if "rollout" in d.nodes:
            strategy = self.rollout_strategy(d.nodes["rollout"], f"{path}.rollout")
            if strategy is not None:
                kwargs["rollout"] = strategy
        if len(self.problems) != before or not {"name", "import_path"} <= kwargs.keys():
            return None  # (a bad name or import_path was reported by mapping())
        return self.build(path, d, lambda: DeploymentConfig(**kwargs, autoscaling=scaling))

    def autoscaling(
        self, node: Node | None, path: str, defaults: Mapping[str, Any] | None = None
    ) -> AutoscalingConfig | None:
        """`node` None: `defaults` alone (`num_replicas: auto` without an autoscaling_config)."""
        before = len(self.problems)
        if node is None:
            a: Map | None = Map(MappingNode("tag:yaml.org,2002:map", []), {}, {})
        else:
            path = path if defaults is None else f"{path}.autoscaling_config"
            a = self.mapping(node, path, AUTOSCALING_KEYS)
        if a is not None and "policy" in a.nodes:
            a.values["policy"] = self.policy(a.nodes["policy"], f"{path}.policy")
        if a is None or len(self.problems) != before:
            return None
        v = {**(defaults or {}), **a.values}
        low, high = v.get("min_replicas", 1), v.get("max_replicas", 1)
        if high < low:
            where = "max_replicas" if "max_replicas" in a.nodes else "min_replicas"
            what = (
                f"must be >= min_replicas ({low})"
                if where == "max_replicas"
                else (f"must be <= max_replicas ({high}, the default; set max_replicas too)")
            )
            self.add(f"{path}.{where}", a.nodes.get(where, a.node), what)
        initial = v.get("initial_replicas")
        if initial is not None and low <= high and not low <= initial <= high:
            self.add(
                f"{path}.initial_replicas",
                a.nodes["initial_replicas"],
                f"must lie in [min_replicas, max_replicas] = [{low}, {high}]",
            )
        if len(self.problems) != before:
            return None
        return self.build(path, a, lambda: AutoscalingConfig(**v))

    def actor_options(self, node: Node, path: str) -> dict[str, float] | None:
        """Ray's `ray_actor_options`: num_cpus, num_gpus, memory and custom `resources`, the
        replica's placement request (shared.resources); the rest refused by name."""
        if is_null(node):
            return {}
        before = len(self.problems)
        m = self.mapping(node, path, ACTOR_KEYS)
        if m is None:
            return None
        custom: dict[str, Any] = {}
        if "resources" in m.nodes and not is_null(m.nodes["resources"]):
            rnode = m.nodes["resources"]
            try:
                value = self.construct(rnode)
            except Bad as exc:
                self.add(f"{path}.resources", rnode, exc.message)
                return None
            if not isinstance(value, dict):
                self.add(f"{path}.resources", rnode, f"expected a mapping, got {show_value(value)}")
                return None
            custom = value
        if len(self.problems) != before:
            return None
        try:
            return resources.build_request(
                m.values.get("num_cpus"), m.values.get("num_gpus"), m.values.get("memory"), custom
            )
        except ConfigError as exc:
            key = exc.field.split(".", 1)[0]
            message = str(exc).removeprefix(f"{exc.field}: ")
            self.add(f"{path}.{exc.field}", m.nodes.get(key, m.node), message)
            return None

    def logging_config(self, node: Node, path: str) -> dict[str, Any] | None:
        """Ray's `logging_config` (shared.logconfig), canonical with its defaults."""
        if is_null(node):
            return {}
        if isinstance(node, MappingNode):  # `[]` is Ray's default (`serve build` writes it)
            kept = [(k, v) for k, v in node.value if not (
                isinstance(k, ScalarNode) and k.value == "additional_log_standard_attrs"
                and isinstance(v, SequenceNode) and not v.value)]  # fmt: skip
            node = MappingNode(node.tag, kept, node.start_mark, node.end_mark)
        before = len(self.problems)
        m = self.mapping(node, path, LOGGING_KEYS)
        if m is None or len(self.problems) != before:
            return None
        return logconfig.normalise(m.values)

    def rollout_strategy(self, node: Node, path: str) -> rollout.RolloutConfig | None:
        """fleetpulse's `rollout: {max_surge, max_unavailable}` (shared.rollout)."""
        before = len(self.problems)
        m = self.mapping(node, path, ROLLOUT_KEYS)
        if m is None or len(self.problems) != before:
            return None
        return self.build(path, m, lambda: rollout.RolloutConfig(**m.values))

    def policy(self, node: Node, path: str) -> str | None:
        """Ray Serve's `policy: {policy_function: 'package.module:function'}`."""
        before = len(self.problems)
        m = self.mapping(node, path, POLICY_KEYS)
        if m is None or len(self.problems) != before:
            return None  # (an unknown key, likely Ray's older `name`, says enough)
        if not self.required(m, path, "policy_function", "like 'package.module:function'"):
            return None
        function: str = m.values["policy_function"]
        problem = None if self.check_policy is None else self.check_policy(function)
        if problem is not None:
            self.add(f"{path}.policy_function", m.nodes["policy_function"], problem)
        return function

    def user_config(self, node: Node, path: str) -> Any:
        try:
            value = user_config_value(self.construct(node))
        except Bad as exc:
            self.add(path, node, exc.message)
            return None
        self.json_value(value, path, node)
        return value

    def json_arg(
        self,
        node: Node,
        path: str,
        kind: type[list[Any]] | type[dict[str, Any]],
        argument_names: bool = True,
    ) -> Any:
        """init_args (a list) or init_kwargs (a mapping of argument names; any string keys
        unless `argument_names`): any YAML value that JSON (the fp_apps format) can carry."""
        try:
            value = self.construct(node)
        except Bad as exc:
            self.add(path, node, exc.message)
            return None
        if not isinstance(value, kind):
            want = "a list" if kind is list else "a mapping"
            self.add(path, node, f"expected {want}, got {show_value(value)}")
            return None
        for key in value if isinstance(value, dict) and argument_names else ():
            if not isinstance(key, str) or not IDENTIFIER_RE.fullmatch(key):
                self.add(path, node, f"key {key!r} is not a Python argument name")
        self.json_value(value, path, node)
        return value

    def json_value(self, value: Any, path: str, node: Node) -> None:
        """Report the first part of `value` that JSON (the fp_apps format) cannot carry."""
        bad = first_non_json(value, path)
        if bad is not None:
            self.add(bad[0], node, bad[1])

    def build(self, path: str, m: Map, make: Callable[[], _T]) -> _T | None:
        """Construct a dataclass; its own ConfigError is reported under `path`."""
        try:
            return make()
        except (ConfigError, UsageError) as exc:
            field = getattr(exc, "field", "")
            message = str(exc).removeprefix(f"{field}: ") if field else str(exc)
            yaml_key = "autoscaling_config" if field == "autoscaling" else field
            self.add(
                f"{path}.{yaml_key}" if yaml_key else path, m.nodes.get(yaml_key, m.node), message
            )
            return None


def value_of(node: Node, key: str) -> Node | None:
    """The YAML node under `key` of a mapping node (None: not a mapping, or no such key)."""
    if isinstance(node, MappingNode):
        for k, v in node.value:
            if isinstance(k, ScalarNode) and k.value == key:
                found: Node = v
                return found
    return None


def _child(node: Node, key: str) -> Node:
    """The value node of `key` in a mapping node (for a problem's line), else `node` itself."""
    return value_of(node, key) or node

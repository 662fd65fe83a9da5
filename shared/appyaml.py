"""Application files (YAML, Ray Serve's shape) -> validated `AppConfig`s for `fleetpulse deploy`.

How it works: the text is composed into PyYAML's node tree (not loaded into plain dicts), so every
value keeps the line it came from. A checker walks the tree against the key tables below,
converting each scalar with PyYAML's safe constructor and checking its type and range; it never
stops at the first mistake but collects a `Problem` (field path, line, message) for each, so one
run of `fleetpulse deploy --dry-run` shows everything to fix. Unknown keys are problems too (a typo
must not silently become a default), with a suggestion when a known key is close. Only a subtree
without problems is turned into the frozen dataclasses of shared.appconfig; whatever those still
reject is reported under the same field path. `load_apps` raises one `ConfigError` listing every
problem, or returns the apps with all defaults filled in.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from shared import logconfig, replicaspec, resources, rollout, settings
from shared.appconfig import (
    IMPORT_PATH_RE,
    REPLICA_FIELDS,
    AppConfig,
    AutoscalingConfig,
    DeploymentConfig,
)
from shared.errors import ConfigError, UsageError
from shared.subjects import validate_name

MAX_FILE_BYTES = 1024 * 1024
"""An app file larger than this is surely not one (KV values are bounded by max_payload too)."""
DEFAULT_ROUTE_PREFIX = "/"
"""Ray Serve's default; `route_prefix: null` means the app is not served over HTTP."""
DEFAULT_NUM_REPLICAS = 1
DEFAULT_APP_NAME = "default"
"""Ray Serve's name of an application defined in code whose entry has no `name`."""
SUGGESTION_CUTOFF = 0.6
MAX_ARG_VALUES = 100_000
"""init_args / init_kwargs hold at most this many values (lists and mappings included)."""
_MERGE_TAG = "tag:yaml.org,2002:merge"
_T = TypeVar("_T")

_IDENTIFIER_RE = re.compile(r"[A-Za-z_]\w*")

# Ray Serve keys fleetpulse has no equivalent for: say so instead of guessing a typo.
_RAY_ONLY_KEYS = (
    "proxy_location http_options grpc_options logging_config target_capacity import_path "
    "runtime_env args external_scaler_enabled ray_actor_options "
    "placement_group_bundles placement_group_strategy max_replicas_per_node max_queued_requests "
    "graceful_shutdown_wait_loop_s request_router_config smoothing_factor autoscaling_policy"
)
_RAY_ONLY = frozenset(_RAY_ONLY_KEYS.split())
# Older Ray Serve names of keys fleetpulse knows under their current name.
_RENAMED = {
    "max_concurrent_queries": "max_ongoing_requests",
    "target_num_ongoing_requests_per_replica": "target_ongoing_requests",
    "upscale_smoothing_factor": "upscaling_factor",
    "downscale_smoothing_factor": "downscaling_factor",
    "name": "policy_function",  # AutoscalingPolicy's key before Ray Serve 2.51
}
# Keys whose null is a value of its own; any other optional key given as null takes its default
# (Ray Serve writes `key: null` for "not set", e.g. in `serve build` output).
_NULL_IS_A_VALUE = frozenset(
    {"route_prefix", *(s.name for s in settings.AUTOSCALING if s.nullable)}
)
AUTO_SCALING_DEFAULTS: Mapping[str, Any] = {
    "min_replicas": 1,
    "max_replicas": 100,
    "target_ongoing_requests": 2.0,
}
"""What Ray Serve's `num_replicas: auto` means, under any autoscaling_config values given."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with an app file: where (field path, 1-based line) and what."""

    path: str
    line: int | None
    message: str

    def render(self, source: str) -> str:
        where = source if self.line is None else f"{source}:{self.line}"
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


PolicyCheck = Callable[[str], str | None]
"""What is wrong with a custom policy's import path (it cannot be imported, say), or None.
The file check itself imports nothing; `fleetpulse deploy` passes one that does."""


def load_apps(
    path: str | os.PathLike[str], check_policy: PolicyCheck | None = None
) -> list[AppConfig]:
    """Read and validate an app file; ConfigError (naming file, line and field) if anything is
    wrong, listing every problem found."""
    return parse_apps(read_app_file(path), os.fspath(path), check_policy)


def read_app_file(path: str | os.PathLike[str]) -> str:
    """The file's text; ConfigError when it cannot be read or is not a (small, UTF-8) text."""
    source = os.fspath(path)
    try:
        with open(source, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read the file: {exc.strerror or exc}", source=source) from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"larger than {MAX_FILE_BYTES} bytes; not an app file", source=source)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"not UTF-8 text ({exc.reason} at byte {exc.start})", source=source
        ) from None
    return text


def parse_apps(
    text: str, source: str = "<string>", check_policy: PolicyCheck | None = None
) -> list[AppConfig]:
    """Like `load_apps` for text already in memory; `source` names it in messages."""
    apps, problems = check_apps(text, check_policy)
    if problems:
        raise problems_error(problems, source)
    return apps


def problems_error(problems: list[Problem], source: str) -> ConfigError:
    """One ConfigError for all problems: a single line for one, a list for several."""
    if len(problems) == 1:
        p = problems[0]
        where = source if p.line is None else f"{source}:{p.line}"
        return ConfigError(f"{p.path}: {p.message}" if p.path else p.message, source=where)
    lines = "\n".join(f"  {p.render(source)}" for p in problems)
    return ConfigError(f"{len(problems)} problems:\n{lines}", source=source)


def check_apps(
    text: str, check_policy: PolicyCheck | None = None
) -> tuple[list[AppConfig], list[Problem]]:
    """The pure core: the valid apps, and every problem found (apps are complete only when there
    are no problems). Ray Serve's forms are read too (shared/serveconfig.py); an app defined in
    code is a problem here, since only `fleetpulse deploy` builds it (`check_config`)."""
    from shared.serveconfig import check_config  # it builds on this module

    checked = check_config(text, check_policy)
    problems = checked.problems + [
        Problem(
            f"{code.path}.import_path",
            _line(code.import_node),
            "defined in code: `fleetpulse deploy` imports and builds it "
            "(shared.serveconfig.check_config with a build function)",
        )
        for code in checked.code_apps
    ]
    return checked.apps, sorted(problems, key=lambda p: p.line or 0)


def _syntax_problem(exc: yaml.MarkedYAMLError) -> Problem:
    mark = exc.problem_mark or exc.context_mark
    what = ": ".join(str(p) for p in (exc.context, exc.problem) if p)
    return Problem("", None if mark is None else mark.line + 1, f"YAML syntax error: {what}")


# -- scalar conversions: return the value or raise _Bad(message) -------------------------------


class _Bad(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


Conv = Callable[[Any], Any]


def _show(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, list | dict):
        return "a list" if isinstance(value, list) else "a mapping"
    return repr(value) if isinstance(value, str) else str(value)


@dataclass(frozen=True, slots=True)
class _Number:
    """A number (an integer if `integer`) >= low (> low if `strict`), or null if `nullable`."""

    integer: bool = False
    low: float = 0.0
    strict: bool = False
    nullable: bool = False

    def __call__(self, value: Any) -> Any:
        if value is None and self.nullable:
            return None
        kinds = int if self.integer else int | float
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise _Bad(
                f"expected {'an integer' if self.integer else 'a number'}, got {_show(value)}"
            )
        if not math.isfinite(value):
            raise _Bad(f"must be a finite number, got {_show(value)}")
        if value < self.low or (self.strict and value == self.low):
            raise _Bad(f"must be {'>' if self.strict else '>='} {self.low:g}, got {_show(value)}")
        return value if self.integer else float(value)


_COUNT = _Number(integer=True)
_DELAY = _Number()


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Bad(f"expected true or false, got {_show(value)}")
    return value


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise _Bad(f"expected a string, got {_show(value)}")
    return value


def _name(what: str) -> Conv:
    def check(value: Any) -> str:
        try:
            return validate_name(_string(value), what)
        except UsageError as exc:
            raise _Bad(str(exc)) from None

    return check


def _replica_count(value: Any) -> int | str:
    if value == "auto":
        return "auto"
    try:
        count: int = _COUNT(value)
    except _Bad as exc:
        raise _Bad(f"{exc.message} or 'auto'") from None
    return count


def _user_config(value: Any) -> Any:
    if value is not None and not isinstance(value, dict):
        raise _Bad(f"expected a mapping (given to reconfigure()), got {_show(value)}")
    return value


def _import_path(value: Any) -> str:
    s = _string(value)
    if not IMPORT_PATH_RE.fullmatch(s):
        raise _Bad(f"must look like 'package.module:Attribute', got {s!r}")
    return s


def _version(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise _Bad(f'expected a string (quote it, e.g. version: "1.2"), got {_show(value)}')
    return value


def _route_prefix(value: Any) -> str | None:
    if value is None:
        return None
    s = _string(value)
    if not s.startswith("/"):
        raise _Bad(f"must start with '/', got {s!r}")
    if len(s) > 1 and s.endswith("/"):
        raise _Bad(f"must not end with '/' (except the root '/'), got {s!r}")
    if any(c.isspace() or c in "{}?#" for c in s):
        raise _Bad(f"must be a plain URL path (no spaces, '{{}}', '?' or '#'), got {s!r}")
    return s


def _max_queued(value: Any) -> int:
    n: int = _Number(integer=True, low=-1)(value)
    if n == 0:
        raise _Bad("must be -1 (no bound of its own) or >= 1, got 0")
    return n


def _refused(reason: str) -> Conv:
    def conv(value: Any) -> Any:
        raise _Bad(reason)

    return conv


def _log_value(key: str) -> Conv:
    def conv(value: Any) -> Any:
        try:
            return logconfig.check_value(key, value)
        except ConfigError as exc:
            raise _Bad(str(exc).removeprefix(f"{key}: ")) from None

    return conv


def _is_null(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.tag.endswith(":null")


def _setting_conv(s: settings.Setting) -> Conv:
    """The YAML conversion of a setting declared in shared.settings."""
    if s.kind == "bool":
        return _boolean
    low = 0.0 if s.low is None else s.low
    return _Number(integer=s.kind == "int", low=low, strict=s.strict, nullable=s.nullable)


# -- key tables: YAML key -> conversion (None: checked by its own method) ----------------------

_TOP_KEYS: dict[str, Conv | None] = {"applications": None}
_APP_KEYS: dict[str, Conv | None] = {
    "name": _name("application name"),
    "route_prefix": _route_prefix,
    "ingress": _string,
    "version": _version,
    "deployments": None,
    "logging_config": None,
}
_DEPLOYMENT_KEYS: dict[str, Conv | None] = {
    "name": _name("deployment name"),
    "import_path": _import_path,
    "init_args": None,
    "init_kwargs": None,
    **{
        p.name: _boolean if p.kind == "bool" else _Number(p.kind == "int", p.low, p.strict)
        for p in replicaspec.PARAMS
        if p.kind in ("int", "float", "bool") and p.name in REPLICA_FIELDS
    },
    "num_replicas": _replica_count,
    "autoscaling_config": None,
    "rollout": None,
    "user_config": None,
    "ray_actor_options": None,
    "max_replicas_per_node": _Number(integer=True, low=1, nullable=True),
    "max_queued_requests": _max_queued,
    "logging_config": None,
}
_DEPLOYMENT_LEVEL = frozenset({"ray_actor_options", "max_replicas_per_node"})
_ACTOR_KEYS: dict[str, Conv | None] = {
    "num_cpus": _DELAY,
    "num_gpus": _DELAY,
    "memory": _DELAY,
    "resources": None,
    **{key: _refused(reason) for key, reason in resources.RAY_ACTOR_REFUSED.items()},
}
_LOGGING_KEYS: dict[str, Conv | None] = {
    **{key: _log_value(key) for key in logconfig.KEYS},
    **{key: _refused(reason) for key, reason in logconfig.REFUSED.items()},
}
_AUTOSCALING_KEYS: dict[str, Conv | None] = {
    s.name: None if s.name == "policy" else _setting_conv(s) for s in settings.AUTOSCALING
}
_POLICY_KEYS: dict[str, Conv | None] = {"policy_function": _import_path}


def _rollout_amount(param: rollout.Param) -> Conv:
    def check(value: Any) -> int | str:
        problem = param.problem(value)
        if problem is not None:
            raise _Bad(problem)
        converted: int | str = value
        return converted

    return check


_ROLLOUT_KEYS: dict[str, Conv | None] = {p.name: _rollout_amount(p) for p in rollout.PARAMS}


def _line(node: Node) -> int | None:
    mark = node.start_mark
    return None if mark is None else int(mark.line) + 1


def _kind(node: Node) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    return repr(node.value) if node.tag.endswith(":str") else str(node.value or "null")


@dataclass(slots=True)
class _Map:
    """A checked YAML mapping: converted values, and each key's value node (for lines)."""

    node: Node
    values: dict[str, Any]
    nodes: dict[str, Node]

    def line(self, key: str) -> int | None:
        node = self.nodes.get(key)
        return _line(self.node if node is None else node)


class _Checker:
    """Walks the node tree, collecting problems; returns what is valid."""

    def __init__(self, loader: yaml.SafeLoader, check_policy: PolicyCheck | None = None) -> None:
        self.loader = loader
        self.check_policy = check_policy
        self.problems: list[Problem] = []
        self.warnings: list[Problem] = []

    app_keys: Mapping[str, Conv | None] = _APP_KEYS
    deployment_keys: Mapping[str, Conv | None] = _DEPLOYMENT_KEYS

    def warn(self, path: str, node: Node | None, message: str) -> None:
        self.warnings.append(Problem(path, None if node is None else _line(node), message))

    def add(self, path: str, node: Node | None, message: str) -> None:
        self.problems.append(Problem(path, None if node is None else _line(node), message))

    def construct(self, node: Node) -> Any:
        try:
            return self.loader.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or str(exc)
            raise _Bad(f"unsupported YAML value: {problem}") from None

    # -- structure -------------------------------------------------------------------------

    def mapping(self, node: Node, path: str, keys: Mapping[str, Conv | None]) -> _Map | None:
        """Check a mapping's keys and convert the values of the keys with a conversion."""
        if not isinstance(node, MappingNode):
            self.add(path, node, f"expected a mapping, got {_kind(node)}")
            return None
        explicit = sum(1 for k, _ in node.value if k.tag != _MERGE_TAG)
        try:
            self.loader.flatten_mapping(node)  # resolves `<<: *anchor` merge keys
        except yaml.YAMLError as exc:
            self.add(path, node, f"bad merge key: {getattr(exc, 'problem', exc)}")
            return None
        merged = len(node.value) - explicit  # flatten_mapping puts merged pairs first
        out = _Map(node, {}, {})
        from_merge: set[str] = set()
        for index, (key_node, value_node) in enumerate(node.value):
            key = key_node.value if isinstance(key_node, ScalarNode) else None
            if not isinstance(key, str) or not key_node.tag.endswith(":str"):
                self.add(path, key_node, f"keys must be names, got {_kind(key_node)}")
                continue
            sub = f"{path}.{key}" if path else key
            if key in out.nodes and key not in from_merge:
                self.add(sub, key_node, f"duplicate key (first at line {out.line(key)})")
                continue
            # a key written out overrides one merged from an anchor, as in YAML's merge spec
            out.values.pop(key, None)
            from_merge.discard(key)
            if index < merged:
                from_merge.add(key)
            if key not in keys and _RENAMED.get(key) in keys:
                new = _RENAMED[key]
                self.warn(sub, key_node, f"Ray Serve's older name of {new!r}; read as {new!r}")
                if new in node_keys(node):
                    self.add(sub, key_node, f"give {new!r} or its older name {key!r}, not both")
                    continue
                key, sub = new, f"{path}.{new}" if path else new
            if key not in keys:
                self.add(sub, key_node, _unknown_key(key, keys))
                continue
            if _is_null(value_node) and key not in _NULL_IS_A_VALUE:
                continue  # null: not set, the default applies
            out.nodes[key] = value_node
            conv = keys[key]
            if conv is not None:
                try:
                    out.values[key] = conv(self.construct(value_node))
                except _Bad as exc:
                    self.add(sub, value_node, exc.message)
        return out

    def sequence(self, node: Node, path: str) -> list[Node] | None:
        if not isinstance(node, SequenceNode):
            self.add(path, node, f"expected a list, got {_kind(node)}")
            return None
        if not node.value:
            self.add(path, node, "must not be empty")
            return None
        items: list[Node] = node.value
        return items

    def required(self, m: _Map, path: str, key: str, hint: str) -> bool:
        if key in m.nodes:
            return key in m.values
        self.add(f"{path}.{key}", m.node, f"required ({hint})")
        return False

    # -- the file, applications, deployments ------------------------------------------------

    def file(self, root: Node | None) -> list[AppConfig]:
        if root is None:
            self.add("", None, "the file is empty; expected 'applications:' with a list of apps")
            return []
        top = self.mapping(root, "", _TOP_KEYS)
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

    def unique(self, m: _Map, path: str, seen: dict[str, int | None], what: str) -> None:
        name = m.values["name"]
        if name in seen:
            message = f"duplicate {what} name {name!r} (first at line {seen[name]})"
            self.add(f"{path}.name", m.nodes["name"], message)
        else:
            seen[name] = m.line("name")

    def _unique_prefix(self, m: _Map, path: str, prefix: str | None, seen: dict[str, str]) -> None:
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

    def app(self, m: _Map, path: str) -> AppConfig | None:
        if "import_path" in m.nodes:  # defined in code: shared/serveconfig.py
            self.code_app(m, path)
            return None
        env = self.app_env(m, path)
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
            dep = self.deployment(d, dpath, env=env, logging=logs)
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

    def code_app(self, m: _Map, path: str) -> None:
        """An app whose deployments are defined in code (shared/serveconfig.py checks it)."""
        self.add(f"{path}.import_path", m.nodes["import_path"], "needs the code-first checker")

    def app_env(self, m: _Map, path: str) -> Mapping[str, str]:
        """The app's environment variables for its replicas (shared/serveconfig.py)."""
        return {}

    def app_logging(self, m: _Map, path: str) -> Mapping[str, Any] | None:
        """The app's `logging_config`: each deployment's that sets none (as in Ray Serve)."""
        node = m.nodes.get("logging_config")
        return None if node is None else self.logging_config(node, f"{path}.logging_config")

    def deployment(
        self, d: _Map, path: str, env: Mapping[str, str] | None = None, import_path: str = "",
        logging: Mapping[str, Any] | None = None,
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
        if "ray_actor_options" in d.nodes:
            request = self.actor_options(d.nodes["ray_actor_options"], f"{path}.ray_actor_options")
            kwargs["resources"] = request or {}
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
            a: _Map | None = _Map(MappingNode("tag:yaml.org,2002:map", []), {}, {})
        else:
            path = path if defaults is None else f"{path}.autoscaling_config"
            a = self.mapping(node, path, _AUTOSCALING_KEYS)
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
        if _is_null(node):
            return {}
        before = len(self.problems)
        m = self.mapping(node, path, _ACTOR_KEYS)
        if m is None:
            return None
        custom: dict[str, Any] = {}
        if "resources" in m.nodes and not _is_null(m.nodes["resources"]):
            rnode = m.nodes["resources"]
            try:
                value = self.construct(rnode)
            except _Bad as exc:
                self.add(f"{path}.resources", rnode, exc.message)
                return None
            if not isinstance(value, dict):
                self.add(f"{path}.resources", rnode, f"expected a mapping, got {_show(value)}")
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
        if _is_null(node):
            return {}
        before = len(self.problems)
        m = self.mapping(node, path, _LOGGING_KEYS)
        if m is None or len(self.problems) != before:
            return None
        return logconfig.normalise(m.values)

    def rollout_strategy(self, node: Node, path: str) -> rollout.RolloutConfig | None:
        """fleetpulse's `rollout: {max_surge, max_unavailable}` (shared.rollout)."""
        before = len(self.problems)
        m = self.mapping(node, path, _ROLLOUT_KEYS)
        if m is None or len(self.problems) != before:
            return None
        return self.build(path, m, lambda: rollout.RolloutConfig(**m.values))

    def policy(self, node: Node, path: str) -> str | None:
        """Ray Serve's `policy: {policy_function: 'package.module:function'}`."""
        before = len(self.problems)
        m = self.mapping(node, path, _POLICY_KEYS)
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
            value = _user_config(self.construct(node))
        except _Bad as exc:
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
        except _Bad as exc:
            self.add(path, node, exc.message)
            return None
        if not isinstance(value, kind):
            want = "a list" if kind is list else "a mapping"
            self.add(path, node, f"expected {want}, got {_show(value)}")
            return None
        for key in value if isinstance(value, dict) and argument_names else ():
            if not isinstance(key, str) or not _IDENTIFIER_RE.fullmatch(key):
                self.add(path, node, f"key {key!r} is not a Python argument name")
        self.json_value(value, path, node)
        return value

    def json_value(self, value: Any, path: str, node: Node) -> None:
        """Report the first part of `value` that JSON (the fp_apps format) cannot carry."""
        bad = _first_non_json(value, path)
        if bad is not None:
            self.add(bad[0], node, bad[1])

    def build(self, path: str, m: _Map, make: Callable[[], _T]) -> _T | None:
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


def node_keys(node: MappingNode) -> set[str]:
    return {k.value for k, _ in node.value if isinstance(k, ScalarNode)}


def _unknown_key(key: str, known: Mapping[str, object]) -> str:
    if key in _AUTOSCALING_KEYS and "autoscaling_config" in known:
        return f"unknown key {key!r} here (it belongs under autoscaling_config)"
    if key in _DEPLOYMENT_LEVEL and key not in known:
        return f"unknown key {key!r} here (set it per deployment, under deployments[])"
    if key in _ROLLOUT_KEYS and "rollout" in known:
        return f"unknown key {key!r} here (it belongs under rollout)"
    if key in _RENAMED and _RENAMED[key] in known:
        return f"unknown key {key!r} (Ray Serve's older name; use {_RENAMED[key]!r})"
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=SUGGESTION_CUTOFF)
    if close:
        return f"unknown key {key!r} (did you mean {close[0]!r}?)"
    if key in _RAY_ONLY:
        return f"unknown key {key!r} (a Ray Serve option fleetpulse does not support)"
    return f"unknown key {key!r} (known keys: {', '.join(known)})"


def _first_non_json(value: Any, path: str) -> tuple[str, str] | None:
    """(path, problem) of the first part JSON cannot carry, in document order. The walk is
    bounded: YAML aliases can make a recursive value, or an exponentially large one."""
    stack = [(value, path)]
    for _ in range(MAX_ARG_VALUES):
        if not stack:
            return None
        v, at = stack.pop()
        if v is None or isinstance(v, bool | int | str):
            continue
        if isinstance(v, float):
            if not math.isfinite(v):
                return at, f"must be a finite number, got {v}"
        elif isinstance(v, list):
            stack.extend((item, f"{at}[{i}]") for i, item in reversed(list(enumerate(v))))
        elif isinstance(v, dict):
            for k in v:
                if not isinstance(k, str):
                    return at, f"mapping key {k!r} is not a string (quote it)"
            stack.extend((item, f"{at}.{k}") for k, item in reversed(list(v.items())))
        else:
            return at, f"a {type(v).__name__} cannot be stored as JSON; quote it to pass a string"
    return path, f"more than {MAX_ARG_VALUES} values (a recursive or much-repeated alias?)"

"""The app file's vocabulary: its keys, how each scalar is converted and checked, and its messages.

The key tables map each YAML key to a conversion (a function returning the value or raising `Bad`
with the message), or to None when the checker (shared/appcheck.py) reads the key with a method of
its own. Settings declared in a table elsewhere take their conversion from it: replica settings
from shared.replicaspec `PARAMS`, autoscaling settings from shared.settings `AUTOSCALING`,
rollout settings from shared.rollout `PARAMS`. Unknown keys get a message with a suggestion
(`unknown_key`). shared/serveconfig.py extends the tables with Ray Serve's forms through these
public names.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from shared import logconfig, replicaspec, resources, rollout, settings
from shared.appconfig import IMPORT_PATH_RE, REPLICA_FIELDS
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
MERGE_TAG = "tag:yaml.org,2002:merge"

IDENTIFIER_RE = re.compile(r"[A-Za-z_]\w*")

# Ray Serve keys fleetpulse has no equivalent for: say so instead of guessing a typo.
_RAY_ONLY_KEYS = (
    "proxy_location http_options grpc_options logging_config target_capacity import_path "
    "runtime_env args external_scaler_enabled ray_actor_options "
    "placement_group_bundles placement_group_strategy max_replicas_per_node max_queued_requests "
    "graceful_shutdown_wait_loop_s request_router_config smoothing_factor autoscaling_policy"
)
_RAY_ONLY = frozenset(_RAY_ONLY_KEYS.split())
# Older Ray Serve names of keys fleetpulse knows under their current name.
RENAMED = {
    "max_concurrent_queries": "max_ongoing_requests",
    "target_num_ongoing_requests_per_replica": "target_ongoing_requests",
    "upscale_smoothing_factor": "upscaling_factor",
    "downscale_smoothing_factor": "downscaling_factor",
    "name": "policy_function",  # AutoscalingPolicy's key before Ray Serve 2.51
}
# Keys whose null is a value of its own; any other optional key given as null takes its default
# (Ray Serve writes `key: null` for "not set", e.g. in `serve build` output).
NULL_IS_A_VALUE = frozenset({"route_prefix", *(s.name for s in settings.AUTOSCALING if s.nullable)})
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


def syntax_problem(exc: yaml.MarkedYAMLError) -> Problem:
    mark = exc.problem_mark or exc.context_mark
    what = ": ".join(str(p) for p in (exc.context, exc.problem) if p)
    return Problem("", None if mark is None else mark.line + 1, f"YAML syntax error: {what}")


# -- scalar conversions: return the value or raise Bad(message) -------------------------------


class Bad(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


Conv = Callable[[Any], Any]


def show_value(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, list | dict):
        return "a list" if isinstance(value, list) else "a mapping"
    return repr(value) if isinstance(value, str) else str(value)


@dataclass(frozen=True, slots=True)
class Number:
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
            raise Bad(
                f"expected {'an integer' if self.integer else 'a number'}, got {show_value(value)}"
            )
        if not math.isfinite(value):
            raise Bad(f"must be a finite number, got {show_value(value)}")
        if value < self.low or (self.strict and value == self.low):
            raise Bad(
                f"must be {'>' if self.strict else '>='} {self.low:g}, got {show_value(value)}"
            )
        return value if self.integer else float(value)


_COUNT = Number(integer=True)
_DELAY = Number()


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise Bad(f"expected true or false, got {show_value(value)}")
    return value


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise Bad(f"expected a string, got {show_value(value)}")
    return value


def _name(what: str) -> Conv:
    def check(value: Any) -> str:
        try:
            return validate_name(_string(value), what)
        except UsageError as exc:
            raise Bad(str(exc)) from None

    return check


def _replica_count(value: Any) -> int | str:
    if value == "auto":
        return "auto"
    try:
        count: int = _COUNT(value)
    except Bad as exc:
        raise Bad(f"{exc.message} or 'auto'") from None
    return count


def user_config_value(value: Any) -> Any:
    if value is not None and not isinstance(value, dict):
        raise Bad(f"expected a mapping (given to reconfigure()), got {show_value(value)}")
    return value


def to_import_path(value: Any) -> str:
    s = _string(value)
    if not IMPORT_PATH_RE.fullmatch(s):
        raise Bad(f"must look like 'package.module:Attribute', got {s!r}")
    return s


def _version(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise Bad(f'expected a string (quote it, e.g. version: "1.2"), got {show_value(value)}')
    return value


def _route_prefix(value: Any) -> str | None:
    if value is None:
        return None
    s = _string(value)
    if not s.startswith("/"):
        raise Bad(f"must start with '/', got {s!r}")
    if len(s) > 1 and s.endswith("/"):
        raise Bad(f"must not end with '/' (except the root '/'), got {s!r}")
    if any(c.isspace() or c in "{}?#" for c in s):
        raise Bad(f"must be a plain URL path (no spaces, '{{}}', '?' or '#'), got {s!r}")
    return s


def _max_queued(value: Any) -> int:
    n: int = Number(integer=True, low=-1)(value)
    if n == 0:
        raise Bad("must be -1 (no bound of its own) or >= 1, got 0")
    return n


def _refused(reason: str) -> Conv:
    def conv(value: Any) -> Any:
        raise Bad(reason)

    return conv


def _log_value(key: str) -> Conv:
    def conv(value: Any) -> Any:
        try:
            return logconfig.check_value(key, value)
        except ConfigError as exc:
            raise Bad(str(exc).removeprefix(f"{key}: ")) from None

    return conv


def is_null(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.tag.endswith(":null")


def _setting_conv(s: settings.Setting) -> Conv:
    """The YAML conversion of a setting declared in shared.settings."""
    if s.kind == "bool":
        return _boolean
    low = 0.0 if s.low is None else s.low
    return Number(integer=s.kind == "int", low=low, strict=s.strict, nullable=s.nullable)


# -- key tables: YAML key -> conversion (None: checked by its own method) ----------------------

TOP_KEYS: dict[str, Conv | None] = {"applications": None}
APP_KEYS: dict[str, Conv | None] = {
    "name": _name("application name"),
    "route_prefix": _route_prefix,
    "ingress": _string,
    "version": _version,
    "deployments": None,
    "logging_config": None,
}
DEPLOYMENT_KEYS: dict[str, Conv | None] = {
    "name": _name("deployment name"),
    "import_path": to_import_path,
    "init_args": None,
    "init_kwargs": None,
    **{
        p.name: _boolean if p.kind == "bool" else Number(p.kind == "int", p.low, p.strict)
        for p in replicaspec.PARAMS
        if p.kind in ("int", "float", "bool") and p.name in REPLICA_FIELDS
    },
    "num_replicas": _replica_count,
    "autoscaling_config": None,
    "rollout": None,
    "user_config": None,
    "ray_actor_options": None,
    "max_replicas_per_node": Number(integer=True, low=1, nullable=True),
    "max_queued_requests": _max_queued,
    "logging_config": None,
}
DEPLOYMENT_LEVEL = frozenset({"ray_actor_options", "max_replicas_per_node"})
ACTOR_KEYS: dict[str, Conv | None] = {
    "num_cpus": _DELAY,
    "num_gpus": _DELAY,
    "memory": _DELAY,
    "resources": None,
    **{key: _refused(reason) for key, reason in resources.RAY_ACTOR_REFUSED.items()},
    "runtime_env": None,  # merged over the app's runtime_env (shared/runtimeenv.py)
}
LOGGING_KEYS: dict[str, Conv | None] = {
    **{key: _log_value(key) for key in logconfig.KEYS},
    **{key: _refused(reason) for key, reason in logconfig.REFUSED.items()},
}
AUTOSCALING_KEYS: dict[str, Conv | None] = {
    s.name: None if s.name == "policy" else _setting_conv(s) for s in settings.AUTOSCALING
}
POLICY_KEYS: dict[str, Conv | None] = {"policy_function": to_import_path}


def _rollout_amount(param: rollout.Param) -> Conv:
    def check(value: Any) -> int | str:
        problem = param.problem(value)
        if problem is not None:
            raise Bad(problem)
        converted: int | str = value
        return converted

    return check


ROLLOUT_KEYS: dict[str, Conv | None] = {p.name: _rollout_amount(p) for p in rollout.PARAMS}


def node_line(node: Node) -> int | None:
    mark = node.start_mark
    return None if mark is None else int(mark.line) + 1


def node_kind(node: Node) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    return repr(node.value) if node.tag.endswith(":str") else str(node.value or "null")


def node_keys(node: MappingNode) -> set[str]:
    return {k.value for k, _ in node.value if isinstance(k, ScalarNode)}


def unknown_key(key: str, known: Mapping[str, object]) -> str:
    if key in AUTOSCALING_KEYS and "autoscaling_config" in known:
        return f"unknown key {key!r} here (it belongs under autoscaling_config)"
    if key in DEPLOYMENT_LEVEL and key not in known:
        return f"unknown key {key!r} here (set it per deployment, under deployments[])"
    if key in ROLLOUT_KEYS and "rollout" in known:
        return f"unknown key {key!r} here (it belongs under rollout)"
    if key in RENAMED and RENAMED[key] in known:
        return f"unknown key {key!r} (Ray Serve's older name; use {RENAMED[key]!r})"
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=SUGGESTION_CUTOFF)
    if close:
        return f"unknown key {key!r} (did you mean {close[0]!r}?)"
    if key in _RAY_ONLY:
        return f"unknown key {key!r} (a Ray Serve option fleetpulse does not support)"
    return f"unknown key {key!r} (known keys: {', '.join(known)})"


def first_non_json(value: Any, path: str) -> tuple[str, str] | None:
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

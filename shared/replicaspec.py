"""What a replica process is started with: one declaration, everything else derived from it.

`PARAMS` declares each setting once (name, type, default, range, whether changing it restarts
replicas, help). From that table come:
- `ReplicaSpec`, the frozen value (validated in `__post_init__`, the only place the rules live);
- the replica's command-line flags (`add_arguments`) and the agent's command line (`argv`), which
  read each other back exactly (`from_args(parse(argv)) == spec`);
- the version hash (`version()`): only settings that need a new process change it;
- the JSON form carried in fp_targets (`to_doc` / `from_doc`, unknown fields ignored);
- the YAML key checks for these settings (shared.appkeys reads `PARAMS`) and the deployment
  config's validation (shared.appconfig calls `check`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Literal

from shared import logconfig, resources, runtimeenv, settings
from shared.errors import ConfigError, WireError
from shared.wire import reasons

Kind = Literal[
    "str",
    "int",
    "float",
    "bool",
    "list",
    "map",
    "env",
    "resources",
    "logging",
    "config",
    "runtime",
]
_JSON_KINDS = ("list", "map", "env", "resources", "logging", "config", "runtime")
MAX_ENV_VARS = 256


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    kind: Kind
    default: Any
    help: str
    low: float = 0.0
    """Numbers: the least value allowed (exclusive when `strict`)."""
    strict: bool = False
    restarts: bool = True
    """Part of the version: a change rolls the deployment's replicas onto new processes."""
    omit_default: bool = False
    """Left out of the JSON form and the version hash while at its default: a setting added
    later, so that values and versions written before it stay byte for byte the same (an
    upgraded controller must not roll every deployment)."""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def problem(self, value: Any) -> str | None:
        """What is wrong with `value` for this parameter, or None."""
        return self.type_problem(value) or self._value_problem(value)

    def type_problem(self, value: Any) -> str | None:
        """What is wrong with the type of `value` (a peer's `wrong_type`), or None."""
        if self.kind in ("int", "float"):
            kinds = int if self.kind == "int" else int | float
            if isinstance(value, bool) or not isinstance(value, kinds):
                return "must be an integer" if self.kind == "int" else "must be a number"
            return None
        if self.kind == "config":
            return None if value is None or isinstance(value, Mapping) else "must be a map or null"
        expected = {"str": str, "bool": bool, "list": tuple | list, "map": Mapping, "env": Mapping,
                    "resources": Mapping, "logging": Mapping, "runtime": Mapping}  # fmt: skip
        return None if isinstance(value, expected[self.kind]) else f"must be a {self.kind}"

    def _value_problem(self, value: Any) -> str | None:
        if self.kind == "env":
            return _env_problem(value)
        if self.kind == "resources":
            return resources.request_problem(value)
        if self.kind == "logging":
            return logconfig.problem(value)
        if self.kind == "runtime":
            return runtimeenv.problem(value)
        if self.kind in ("int", "float"):
            if not math.isfinite(value):
                return "must be a finite number"
            if value < self.low or (self.strict and value == self.low):
                return f"must be {'>' if self.strict else '>='} {self.low:g}"
        if self.name == "import_path" and ":" not in value:
            return "must look like 'package.module:Attribute'"
        return None


def _env_problem(value: Mapping[Any, Any]) -> str | None:
    if len(value) > MAX_ENV_VARS:
        return f"holds more than {MAX_ENV_VARS} variables"
    if not all(isinstance(k, str) and k and "=" not in k for k in value):
        return "names must be non-empty strings without '='"
    if not all(isinstance(v, str) for v in value.values()):
        return "values must be strings"
    return None


PARAMS: tuple[Param, ...] = (
    Param("import_path", "str", "", "user code as 'package.module:Attribute' (class or function)"),
    Param("init_args", "list", (), "positional arguments of the user class (JSON list)"),
    Param("init_kwargs", "map", {}, "keyword arguments of the user class (JSON object)"),
    Param("max_ongoing_requests", "int", 5, "requests a replica runs at once", low=1),
    Param("health_check_period_s", "float", 10.0, "seconds between health checks", strict=True),
    Param("health_check_timeout_s", "float", 30.0, "a health check's time limit", strict=True),
    Param(
        "graceful_shutdown_timeout_s",
        "float",
        20.0,
        "seconds a stopping replica lets requests finish (0: none)",
    ),
    Param(
        "metrics_interval_s",
        "float",
        settings.AUTOSCALING_BY_NAME["metrics_interval_s"].default,
        "how often the replica reports (its deployment's autoscaling metrics_interval_s)",
        strict=True,
        restarts=False,
    ),
    Param(
        "push_metrics",
        "bool",
        False,
        "publish its own replica reports (health rides them; default: routers report)",
        restarts=False,
    ),
    Param("env", "env", {}, "environment variables of the replica process (JSON object)"),
    Param(
        "resources",
        "resources",
        {},
        "what one replica needs from its agent: cpus, gpus, memory (bytes), custom (JSON object)",
        omit_default=True,
    ),
    Param(
        "logging_config",
        "logging",
        {},
        "log level, TEXT/JSON encoding, access log, logs dir (JSON object; {}: the defaults)",
        omit_default=True,
    ),
    Param(
        "user_config",
        "config",
        None,
        "passed to the user class's reconfigure() at start and on change (JSON object or null)",
        restarts=False,
        omit_default=True,
    ),
    Param(
        "runtime_env",
        "runtime",
        {},
        "code packages (working_dir, py_modules: content addresses) and pip/uv requirements the "
        "agent prepares before it starts the replica (JSON object; shared/runtimeenv.py)",
        omit_default=True,
    ),
)
BY_NAME: Mapping[str, Param] = {p.name: p for p in PARAMS}
_D: Mapping[str, Any] = {p.name: p.default for p in PARAMS}


def check(name: str, value: Any) -> None:
    """Raise ConfigError (naming the field) unless `value` is valid for parameter `name`."""
    problem = BY_NAME[name].problem(value)
    if problem is not None:
        raise ConfigError(problem, field=name)


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """How to run the replicas of one deployment version (see PARAMS for each field)."""

    import_path: str
    init_args: tuple[Any, ...] = _D["init_args"]
    init_kwargs: Mapping[str, Any] = field(default_factory=dict)
    max_ongoing_requests: int = _D["max_ongoing_requests"]
    health_check_period_s: float = _D["health_check_period_s"]
    health_check_timeout_s: float = _D["health_check_timeout_s"]
    graceful_shutdown_timeout_s: float = _D["graceful_shutdown_timeout_s"]
    metrics_interval_s: float = _D["metrics_interval_s"]
    push_metrics: bool = _D["push_metrics"]
    env: Mapping[str, str] = field(default_factory=dict)
    resources: Mapping[str, float] = field(default_factory=dict)
    logging_config: Mapping[str, Any] = field(default_factory=dict)
    user_config: Mapping[str, Any] | None = _D["user_config"]
    runtime_env: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for p in PARAMS:
            check(p.name, getattr(self, p.name))
        object.__setattr__(self, "init_args", tuple(self.init_args))

    def version(self) -> str:
        """A short hash of the settings that need a new process (`Param.restarts`)."""
        doc = {p.name: v for p, v in self._written() if p.restarts}
        data = json.dumps(doc, sort_keys=True, default=str).encode()
        return hashlib.sha256(data).hexdigest()[:10]

    def to_doc(self) -> dict[str, Any]:
        return {p.name: v for p, v in self._written()}

    def _written(self) -> list[tuple[Param, Any]]:
        out = []
        for p in PARAMS:
            value = getattr(self, p.name)
            if not (p.omit_default and value == p.default):
                out.append((p, _jsonable(value)))
        return out

    @staticmethod
    def from_doc(doc: Mapping[str, Any]) -> ReplicaSpec:
        """From JSON (fp_targets); absent fields take their defaults, unknown ones are ignored.
        Raises WireError."""
        if "import_path" not in doc:
            raise WireError(reasons.MISSING_FIELD, "spec.import_path")
        values = {p.name: doc[p.name] for p in PARAMS if p.name in doc}
        for name, value in values.items():
            wrong = BY_NAME[name].type_problem(value)
            if wrong is not None:
                raise WireError(reasons.WRONG_TYPE, f"spec.{name}: {wrong}")
        try:
            return ReplicaSpec(**values)
        except ConfigError as exc:
            raise WireError(reasons.BAD_VALUE, f"spec.{exc}") from None

    def argv(self) -> list[str]:
        """The replica's flags for these settings (parsed back by `from_args`)."""
        out: list[str] = []
        for p in PARAMS:
            value = getattr(self, p.name)
            if p.omit_default and value == p.default:
                continue  # its flag's default is the same; an older replica knows no such flag
            if p.kind == "bool":
                out += [p.flag] if value else []
            elif p.kind in _JSON_KINDS:
                out += [p.flag, json.dumps(_jsonable(value), sort_keys=True)]
            else:
                out += [p.flag, repr(value) if p.kind == "float" else str(value)]
        return out

    @staticmethod
    def from_args(args: argparse.Namespace) -> ReplicaSpec:
        """From flags added by `add_arguments`; raises ConfigError naming the flag."""
        values: dict[str, Any] = {}
        for p in PARAMS:
            raw = getattr(args, p.name)
            if p.kind in _JSON_KINDS:
                raw = _json_flag(raw, p)
            values[p.name] = raw
        return ReplicaSpec(**values)


def _field_default(f: Any) -> Any:
    return f.default_factory() if f.default_factory is not MISSING else f.default


_FIELDS_MATCH = [(f.name, _field_default(f)) for f in fields(ReplicaSpec)][1:] == [
    (p.name, p.default) for p in PARAMS
][1:] and fields(ReplicaSpec)[0].name == PARAMS[0].name
assert _FIELDS_MATCH, "ReplicaSpec's fields and PARAMS must list the same settings and defaults"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The replica's flags for every parameter, with its default and help."""
    for p in PARAMS:
        help_text = f"{p.help} (default: {_show(p.default)})"
        if p.kind == "bool":
            parser.add_argument(p.flag, action="store_true", help=p.help)
        elif p.kind in _JSON_KINDS:
            parser.add_argument(p.flag, default=json.dumps(_jsonable(p.default)), help=help_text)
        elif p.name == "import_path":
            parser.add_argument(p.flag, required=True, help=p.help)
        else:
            kind = {"int": int, "float": float, "str": str}[p.kind]
            parser.add_argument(p.flag, type=kind, default=p.default, help=help_text)


def _json_flag(raw: str, p: Param) -> Any:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not valid JSON: {exc}", field=p.flag) from None
    if p.kind == "config" and value is None:
        return None
    if not isinstance(value, list if p.kind == "list" else dict):
        raise ConfigError(
            f"must be a JSON {'list' if p.kind == 'list' else 'object'}", field=p.flag
        )
    return value


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Mapping):
        return dict(value)
    return value


def _show(value: Any) -> str:
    return json.dumps(_jsonable(value)) if not isinstance(value, str) else repr(value)

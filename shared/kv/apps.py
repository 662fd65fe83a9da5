"""KV `fp_apps`, key `{app}`: a deployed application, as `fleetpulse deploy` wrote it.

The document is `AppConfig` (shared/appconfig.py) as JSON: the app's fields, `deployments` a list
of deployment objects, each with an `autoscaling` object or null and a `rollout` object (absent:
the defaults), and `runtime_env` (shared/runtimeenv.py; absent when empty): the content
addresses of the code packages and the pip/uv requirements. Writer: `fleetpulse deploy`
(revision-checked). Readers: controllers, the proxy, `fleetpulse status`.

Every reader ignores fields it does not know at every level (app, deployment, autoscaling,
rollout), so a newer CLI that adds a setting never makes an older controller drop the app; an
absent field takes its default. The fields and their types are read off the config dataclasses, so a field added
there is written and read with no change here. A value whose fields decode but that is not a
valid app (min_replicas above max_replicas, ...) is `bad_value` as well: the config's own checks
(`__post_init__`) decide, in one place.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from shared import runtimeenv
from shared.appconfig import AppConfig, AutoscalingConfig, DeploymentConfig
from shared.errors import ConfigError, UsageError, WireError
from shared.kv import envelope as e
from shared.rollout import RolloutConfig
from shared.wire import reasons

C = TypeVar("C")


@dataclass(frozen=True, slots=True)
class AppDoc:
    """The fp_apps document of one `AppConfig`."""

    KIND: ClassVar[str] = "app"
    config: AppConfig

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = _plain(dataclasses.asdict(self.config))
        for d in doc["deployments"]:
            if not d.get("runtime_env"):  # added later: absent unless used, so that the values
                d.pop("runtime_env", None)  # written before it stay byte for byte the same
        return doc

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> AppDoc:
        raw = e.listing(doc, "deployments")
        deployments = tuple(
            e.nested(f"app.deployments[{i}]", d, _deployment) for i, d in enumerate(raw)
        )
        for d in deployments:
            if not runtimeenv.resolved(d.runtime_env):
                raise WireError(
                    reasons.BAD_VALUE, f"app.deployments.{d.name}.runtime_env: a package "
                    "reference without sha256 (a local path is never written; deploy uploads it)",
                )  # fmt: skip
        return cls(_build(AppConfig, doc, "app", deployments=deployments))


def encode_app(config: AppConfig) -> bytes:
    return e.encode(AppDoc(config))


def decode_app(data: object) -> AppConfig:
    """Raises WireError with its reason (a config that fails its own checks is `bad_value`)."""
    return e.decode(data, AppDoc).config


def _deployment(doc: dict[str, Any]) -> DeploymentConfig:
    where = str(doc["kind"])
    scaling = doc.get("autoscaling")
    autoscaling = None
    if scaling is not None:
        autoscaling = e.nested(
            f"{where}.autoscaling", scaling, lambda d: _build(AutoscalingConfig, d, d["kind"])
        )
    given: dict[str, Any] = {"autoscaling": autoscaling}
    if "rollout" in doc:  # absent (an older writer): the defaults
        given["rollout"] = e.nested(
            f"{where}.rollout", doc["rollout"], lambda d: _build(RolloutConfig, d, d["kind"])
        )
    return _build(DeploymentConfig, doc, where, **given)


def _build(cls: Callable[..., C], doc: Mapping[str, Any], where: str, **given: Any) -> C:
    """`cls` from the fields of `doc` it declares (others ignored; absent ones default)."""
    values = dict(given)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in values:
            continue
        if f.name in doc:
            values[f.name] = _read(str(f.type), doc[f.name], f"{where}.{f.name}")
        elif _required(f):
            raise WireError(reasons.MISSING_FIELD, f"{where}.{f.name}")
    try:
        return cls(**values)
    except (ConfigError, UsageError) as exc:
        reason = reasons.WRONG_TYPE if "must be a " in str(exc) else reasons.BAD_VALUE
        raise WireError(reason, f"{where}: {exc}") from None
    except (TypeError, ValueError) as exc:  # a field type this reader does not know
        raise WireError(reasons.BAD_VALUE, f"{where}: {exc}") from None


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _read(annotation: str, value: Any, where: str) -> Any:
    """Check a JSON value against a dataclass field's annotation (as written in the source)."""
    kind = annotation.replace(" ", "")
    if kind.endswith("|None"):
        return None if value is None else _read(kind.removesuffix("|None"), value, where)
    if kind == "str":
        ok = isinstance(value, str)
    elif kind == "bool":
        ok = isinstance(value, bool)
    elif kind == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind == "float":
        if isinstance(value, int | float) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise WireError(reasons.BAD_VALUE, f"{where} must be finite")
            return float(value)
        ok = False
    elif kind.startswith("tuple["):
        if isinstance(value, list):
            return tuple(value)
        ok = False
    elif kind.startswith(("Mapping[", "dict[")):
        ok = isinstance(value, dict)
    else:
        return value  # the dataclass's own checks judge it
    if not ok:
        raise WireError(reasons.WRONG_TYPE, f"{where} must be of type {kind}")
    return value


def _plain(value: Any) -> Any:
    """JSON-ready: tuples as lists, mappings as dicts, all the way down."""
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value

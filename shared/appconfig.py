"""Application and deployment configuration: what `fleetpulse deploy` writes to KV `fp_apps`.

The YAML shape follows Ray Serve's config files so that users can carry theirs over (see
docs/deploy.md); so do the autoscaling defaults. Parsing validates everything and raises a
`ConfigError` naming the source, the field path and the problem; nothing half-valid gets through.
Values in KV are JSON (human-inspectable with `nats kv get`), one key per application.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from shared.errors import ConfigError, UsageError
from shared.subjects import validate_name


@dataclass(frozen=True, slots=True)
class AutoscalingConfig:
    """Ray Serve compatible autoscaling policy knobs (same names, same defaults)."""

    min_replicas: int = 1
    max_replicas: int = 1
    initial_replicas: int | None = None
    target_ongoing_requests: float = 2.0
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    downscale_to_zero_delay_s: float | None = None
    look_back_period_s: float = 30.0
    metrics_interval_s: float = 10.0
    upscaling_factor: float = 1.0
    downscaling_factor: float = 1.0
    panic_mode: bool = False
    panic_window_s: float = 6.0
    panic_threshold: float = 2.0

    def __post_init__(self) -> None:
        if self.min_replicas < 0:
            raise ConfigError("must be >= 0", field="min_replicas")
        if self.max_replicas < max(1, self.min_replicas):
            raise ConfigError("must be >= min_replicas and >= 1", field="max_replicas")
        if self.initial_replicas is not None and not (
            self.min_replicas <= self.initial_replicas <= self.max_replicas
        ):
            raise ConfigError("must lie in [min_replicas, max_replicas]", field="initial_replicas")
        for name in (
            "target_ongoing_requests",
            "look_back_period_s",
            "metrics_interval_s",
            "upscaling_factor",
            "downscaling_factor",
            "panic_window_s",
            "panic_threshold",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError("must be a positive number", field=name)
        for name in ("upscale_delay_s", "downscale_delay_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError("must be >= 0", field=name)
        zero = self.downscale_to_zero_delay_s
        if zero is not None and not (math.isfinite(zero) and zero >= 0):
            raise ConfigError("must be >= 0", field="downscale_to_zero_delay_s")

    @property
    def initial(self) -> int:
        return self.min_replicas if self.initial_replicas is None else self.initial_replicas

    @property
    def to_zero_delay_s(self) -> float:
        z = self.downscale_to_zero_delay_s
        return self.downscale_delay_s if z is None else z


@dataclass(frozen=True, slots=True)
class DeploymentConfig:
    name: str
    import_path: str
    init_args: tuple[Any, ...] = ()
    init_kwargs: Mapping[str, Any] = field(default_factory=dict)
    max_ongoing_requests: int = 5
    health_check_period_s: float = 10.0
    health_check_timeout_s: float = 30.0
    graceful_shutdown_timeout_s: float = 20.0
    num_replicas: int | None = None
    """A fixed size (default 1 when no autoscaling_config is given)."""
    autoscaling: AutoscalingConfig | None = None

    def __post_init__(self) -> None:
        validate_name(self.name, "deployment name")
        if ":" not in self.import_path:
            raise ConfigError("must look like 'package.module:Attribute'", field="import_path")
        if self.max_ongoing_requests < 1:
            raise ConfigError("must be >= 1", field="max_ongoing_requests")
        if self.num_replicas is not None and self.autoscaling is not None:
            raise ConfigError(
                "set num_replicas or autoscaling_config, not both", field="num_replicas"
            )
        if self.num_replicas is not None and self.num_replicas < 0:
            raise ConfigError("must be >= 0", field="num_replicas")
        for name in (
            "health_check_period_s",
            "health_check_timeout_s",
            "graceful_shutdown_timeout_s",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError("must be a positive number", field=name)

    @property
    def policy(self) -> AutoscalingConfig:
        """The autoscaling policy; a fixed size is min = max = initial = num_replicas."""
        if self.autoscaling is not None:
            return self.autoscaling
        n = 1 if self.num_replicas is None else self.num_replicas
        return AutoscalingConfig(min_replicas=n, max_replicas=max(n, 1), initial_replicas=n)


@dataclass(frozen=True, slots=True)
class AppConfig:
    name: str
    deployments: tuple[DeploymentConfig, ...]
    route_prefix: str | None = None
    ingress: str | None = None
    version: str = ""

    def __post_init__(self) -> None:
        validate_name(self.name, "application name")
        names = [d.name for d in self.deployments]
        if not names:
            raise ConfigError("an application needs at least one deployment", field="deployments")
        if len(set(names)) != len(names):
            raise ConfigError("deployment names must be unique", field="deployments")
        if self.ingress is not None and self.ingress not in names:
            raise ConfigError(f"{self.ingress!r} is not one of {names}", field="ingress")
        if self.route_prefix is not None and not self.route_prefix.startswith("/"):
            raise ConfigError("must start with '/'", field="route_prefix")

    def deployment(self, name: str) -> DeploymentConfig:
        for d in self.deployments:
            if d.name == name:
                return d
        raise UsageError(f"application {self.name!r} has no deployment {name!r}")

    def to_json(self) -> bytes:
        doc = asdict(self)
        for d in doc["deployments"]:
            d["init_args"] = list(d["init_args"])
            d["init_kwargs"] = dict(d["init_kwargs"])
        return json.dumps({"v": 1, "kind": "app", **doc}, sort_keys=True).encode()

    @staticmethod
    def from_json(data: bytes) -> AppConfig:
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"not JSON: {exc}", source="fp_apps") from None
        if not isinstance(doc, dict) or doc.get("v") != 1 or doc.get("kind") != "app":
            raise ConfigError("not a v1 app document", source="fp_apps")
        try:
            deployments = []
            for d in doc["deployments"]:
                scaling = d.get("autoscaling")
                deployments.append(
                    DeploymentConfig(
                        **{
                            **d,
                            "init_args": tuple(d.get("init_args", ())),
                            "init_kwargs": dict(d.get("init_kwargs", {})),
                            "autoscaling": AutoscalingConfig(**scaling) if scaling else None,
                        }
                    )
                )
            return AppConfig(
                name=doc["name"],
                deployments=tuple(deployments),
                route_prefix=doc.get("route_prefix"),
                ingress=doc.get("ingress"),
                version=doc.get("version", ""),
            )
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"malformed app document: {exc}", source="fp_apps") from None

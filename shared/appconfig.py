"""Application and deployment configuration: what `fleetpulse deploy` writes to KV `fp_apps`.

The YAML shape follows Ray Serve's config files so that users can carry theirs over (see
docs/deploy.md); so do the autoscaling defaults. Parsing validates everything and raises a
`ConfigError` naming the source, the field path and the problem; nothing half-valid gets through.
Values in KV are JSON (human-inspectable with `nats kv get`), one key per application.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from shared import replicaspec, settings
from shared.errors import ConfigError, UsageError
from shared.replicaspec import ReplicaSpec
from shared.rollout import RolloutConfig
from shared.subjects import validate_name

IMPORT_PATH_RE = settings.IMPORT_PATH_RE
_AUTO: Mapping[str, Any] = settings.defaults(settings.AUTOSCALING)
_CROSS = frozenset({"max_replicas", "initial_replicas"})
"""Checked against min_replicas (and each other) by AutoscalingConfig itself."""


@dataclass(frozen=True, slots=True)
class AutoscalingConfig:
    """Ray Serve compatible autoscaling policy knobs (same names, same defaults), declared in
    shared.settings.AUTOSCALING: defaults and checks come from there."""

    min_replicas: int = _AUTO["min_replicas"]
    max_replicas: int = _AUTO["max_replicas"]
    initial_replicas: int | None = _AUTO["initial_replicas"]
    target_ongoing_requests: float = _AUTO["target_ongoing_requests"]
    upscale_delay_s: float = _AUTO["upscale_delay_s"]
    downscale_delay_s: float = _AUTO["downscale_delay_s"]
    downscale_to_zero_delay_s: float | None = _AUTO["downscale_to_zero_delay_s"]
    look_back_period_s: float = _AUTO["look_back_period_s"]
    metrics_interval_s: float = _AUTO["metrics_interval_s"]
    upscaling_factor: float = _AUTO["upscaling_factor"]
    downscaling_factor: float = _AUTO["downscaling_factor"]
    panic_mode: bool = _AUTO["panic_mode"]
    panic_window_s: float = _AUTO["panic_window_s"]
    panic_threshold: float = _AUTO["panic_threshold"]
    policy: str | None = _AUTO["policy"]
    """A custom policy's import path, 'package.module:function' (YAML: Ray Serve's
    `policy: {policy_function: ...}`); None: the default policy (services/controller/policy.py)."""

    def __post_init__(self) -> None:
        settings.AUTOSCALING_BY_NAME["min_replicas"].check(self.min_replicas)
        if self.max_replicas < max(1, self.min_replicas):
            raise ConfigError("must be >= min_replicas and >= 1", field="max_replicas")
        if self.initial_replicas is not None and not (
            self.min_replicas <= self.initial_replicas <= self.max_replicas
        ):
            raise ConfigError("must lie in [min_replicas, max_replicas]", field="initial_replicas")
        for s in settings.AUTOSCALING[1:]:
            if s.name not in _CROSS:
                s.check(getattr(self, s.name))

    @property
    def initial(self) -> int:
        return self.min_replicas if self.initial_replicas is None else self.initial_replicas

    @property
    def to_zero_delay_s(self) -> float:
        z = self.downscale_to_zero_delay_s
        return self.downscale_delay_s if z is None else z


assert [f.name for f in fields(AutoscalingConfig)] == [s.name for s in settings.AUTOSCALING], (
    "AutoscalingConfig's fields and settings.AUTOSCALING must list the same settings"
)

REPLICA_FIELDS = tuple(p.name for p in replicaspec.PARAMS if p.name != "metrics_interval_s")
"""The deployment settings that are replica settings (shared.replicaspec declares them); the
replicas' metrics interval is the autoscaling policy's `metrics_interval_s`."""
_DEFAULT: Mapping[str, Any] = {p.name: p.default for p in replicaspec.PARAMS}


@dataclass(frozen=True, slots=True)
class DeploymentConfig:
    name: str
    import_path: str
    # the replica settings: defaults, rules and meaning declared once, in shared.replicaspec
    init_args: tuple[Any, ...] = _DEFAULT["init_args"]
    init_kwargs: Mapping[str, Any] = field(default_factory=dict)
    max_ongoing_requests: int = _DEFAULT["max_ongoing_requests"]
    health_check_period_s: float = _DEFAULT["health_check_period_s"]
    health_check_timeout_s: float = _DEFAULT["health_check_timeout_s"]
    graceful_shutdown_timeout_s: float = _DEFAULT["graceful_shutdown_timeout_s"]
    push_metrics: bool = _DEFAULT["push_metrics"]
    resources: Mapping[str, float] = field(default_factory=dict)
    """What one replica asks of its agent (YAML: `ray_actor_options`; shared.resources)."""
    logging_config: Mapping[str, Any] = field(default_factory=dict)
    """Canonical `logging_config` (shared.logconfig); empty: not given."""
    max_replicas_per_node: int | None = None
    """At most this many of its replicas on one agent (None: no limit)."""
    max_queued_requests: int = -1
    """Requests each router may queue for it (-1: the router's own bound; see docs/deploy.md)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """The replicas' environment variables (the app file's runtime_env.env_vars)."""
    user_config: Mapping[str, Any] | None = None
    """Given to the class's reconfigure() at start and whenever only it changes (no restart)."""
    num_replicas: int | None = None
    """A fixed size (default 1 when no autoscaling_config is given)."""
    autoscaling: AutoscalingConfig | None = None
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """How a new version rolls out (fleetpulse's own key; shared.rollout)."""
    runtime_env: Mapping[str, Any] = field(default_factory=dict)
    """Code packages and pip/uv requirements of its replicas (shared/runtimeenv.py; YAML: Ray's
    `runtime_env`, app level merged with `ray_actor_options.runtime_env`)."""

    def __post_init__(self) -> None:
        validate_name(self.name, "deployment name")
        if self.num_replicas is not None and self.autoscaling is not None:
            raise ConfigError(
                "set num_replicas or autoscaling_config, not both", field="num_replicas"
            )
        if self.num_replicas is not None and self.num_replicas < 0:
            raise ConfigError("must be >= 0", field="num_replicas")
        for name in REPLICA_FIELDS:
            replicaspec.check(name, getattr(self, name))
        per_node = self.max_replicas_per_node
        if per_node is not None and per_node < 1:
            raise ConfigError("must be >= 1 (or left out: no limit)", field="max_replicas_per_node")
        if self.max_queued_requests != -1 and self.max_queued_requests < 1:
            raise ConfigError(
                "must be -1 (no bound of its own) or >= 1", field="max_queued_requests"
            )

    def replica_spec(self) -> ReplicaSpec:
        """What this deployment's replicas are started with (its metrics interval included)."""
        return ReplicaSpec(
            **{name: getattr(self, name) for name in REPLICA_FIELDS},
            metrics_interval_s=self.policy.metrics_interval_s,
        )

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

    def version_of(self, d: DeploymentConfig) -> str:
        """The version `d`'s replicas run: the app's own label, else the hash of the settings
        that need a new process (so a change of user_config alone keeps it)."""
        return self.version or d.replica_spec().version()

    def deployment(self, name: str) -> DeploymentConfig:
        for d in self.deployments:
            if d.name == name:
                return d
        raise UsageError(f"application {self.name!r} has no deployment {name!r}")

    def to_json(self) -> bytes:
        """The fp_apps value (shared.kv.apps): the same config always gives the same bytes."""
        from shared.kv.apps import encode_app  # it builds on this module

        return encode_app(self)

    @staticmethod
    def from_json(data: bytes) -> AppConfig:
        """Decode an fp_apps value; unknown fields are ignored at every level. Raises
        ConfigError (source fp_apps) for anything that is not a valid app: the WireError with
        its reason is the cause."""
        from shared.errors import WireError
        from shared.kv.apps import decode_app

        try:
            return decode_app(data)
        except WireError as exc:
            raise ConfigError(f"not a valid app document: {exc}", source="fp_apps") from exc

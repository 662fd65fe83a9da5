"""Settings a user or operator sets, each declared once: the table every other form derives from.

`shared/replicaspec.py` `PARAMS` showed the way for the replica's settings; this module does the
same for the rest. A `Setting` row holds the name (the config field and YAML key), the type, the
default, the bounds (or a validator), the help, and, for a service setting, its flag and
environment variable. From the rows come:
- `AUTOSCALING`: the defaults and checks of `shared.appconfig.AutoscalingConfig`, the YAML key
  table and value conversions of `shared.appkeys`, and docs/deploy.md's `autoscaling_config` table
  (scripts/gen_settings_docs.py);
- the service rows (`SERVICE`, `CONTROLLER`): the one flag each (`add_flag`, the
  same default, help and behaviour in every service) and the value a service's `main()` builds its
  config with (`resolve`: the flag, else the environment variable, read then and only then, else
  the default), and docs/operations.md's service settings table.

Messages: `problem` says what is wrong in the words the config classes have always used
("must be a positive number", "must be >= 0"); `resolve` raises a ConfigError naming the flag or
the environment variable that gave the bad value.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from shared.errors import ConfigError, UsageError
from shared.subjects import DEFAULT_NAMESPACE, validate_name
from shared.wire.address import format_http_address

Kind = Literal["int", "float", "bool", "str"]

IMPORT_PATH_RE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
"""`package.module:Attribute` (the attribute may be dotted, `module:Class.method`)."""

Validator = Callable[[Any], str | None]
"""What is wrong with a (non-null) value beyond its type and bounds, or None."""


@dataclass(frozen=True, slots=True)
class Setting:
    name: str
    """The config field; the YAML key where the setting has one."""
    kind: Kind
    default: Any
    help: str
    low: float | None = 0.0
    """Numbers: the least value allowed (exclusive when `strict`); None: unbounded."""
    strict: bool = False
    nullable: bool = False
    """`null` is a value of its own (YAML `key: null` is kept, not read as "not set")."""
    validate: Validator | None = None
    flag: str | None = None
    env: str | None = None
    """The environment variable a service reads when its flag is not given."""
    metavar: str | None = None
    doc_type: str | None = None
    """The type column of the docs, when it is not what `kind` and the bounds say."""
    doc_default: str | None = None
    """The default column of the docs (and the flag's help), when the value alone would mislead."""
    choices: tuple[Any, ...] | None = None
    """The only values the flag accepts (refused by the parser, as a usage error)."""

    def problem(self, value: Any) -> str | None:
        """What is wrong with `value`, or None (a None value is fine when null is allowed)."""
        if value is None and (self.nullable or self.default is None):
            return None
        if self.kind in ("int", "float") and self.low is not None and not self._in_range(value):
            if self.strict and self.low == 0:
                return "must be a positive number"
            return f"must be {'>' if self.strict else '>='} {self.low:g}"
        if self.choices is not None and value not in self.choices:
            return f"must be one of {', '.join(_show(c) for c in self.choices)}"
        return None if self.validate is None else self.validate(value)

    def _in_range(self, value: float) -> bool:
        low = 0.0 if self.low is None else self.low
        return math.isfinite(value) and (value > low if self.strict else value >= low)

    def check(self, value: Any) -> None:
        """Raise ConfigError naming the field unless `value` is valid."""
        problem = self.problem(value)
        if problem is not None:
            raise ConfigError(problem, field=self.name)

    # -- docs -----------------------------------------------------------------------------

    def type_text(self) -> str:
        if self.doc_type is not None:
            return self.doc_type
        text = {"int": "integer", "float": "number", "bool": "boolean", "str": "string"}[self.kind]
        if self.kind in ("int", "float") and self.low is not None:
            text += f" {'>' if self.strict else '>='} {self.low:g}"
        return text + (" or `null`" if self.nullable else "")

    def default_text(self) -> str:
        if self.doc_default is not None:
            return self.doc_default
        return f"`{_show(self.default)}`"

    # -- services: one flag, one behaviour --------------------------------------------------

    def add_flag(self, p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
        """The setting's flag. Its default is None: `resolve` fills it in when the config is
        built, from the environment variable or the default (never when the parser is built)."""
        assert self.flag is not None, f"{self.name} has no flag"
        shown = self.default_text().strip("`")
        where = f"${self.env} or {shown}" if self.env else shown
        if self.kind == "bool":
            p.add_argument(self.flag, action="store_true", default=None, help=self.help)
            return
        p.add_argument(
            self.flag,
            type=_PARSE[self.kind],
            choices=self.choices,
            default=None,
            metavar=self.metavar,
            help=f"{self.help} (default: {where})",
        )

    def resolve(self, given: Any, env: Mapping[str, str]) -> Any:
        """The flag's value if given, else the environment variable's (parsed), else the
        default; ConfigError naming the flag or the variable if the value is bad."""
        if given is not None:
            value, field = given, self.flag or self.name
        elif self.env is not None and env.get(self.env):
            raw = env[self.env]
            try:
                value = _PARSE[self.kind](raw)
            except ValueError:
                raise ConfigError(
                    f"cannot parse {raw!r}", source="environment", field=self.env
                ) from None
            field = self.env
        else:
            return self.default
        problem = self.problem(value)
        if problem is not None:
            source = "environment" if field == self.env else ""
            raise ConfigError(f"{problem}, not {value!r}", source=source, field=field)
        return value


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


_PARSE: Mapping[str, Callable[[str], Any]] = {"int": int, "float": float, "str": str, "bool": _bool}


def _show(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return f"{value:g}" if isinstance(value, float) else str(value)


def _import_path(value: Any) -> str | None:
    if isinstance(value, str) and IMPORT_PATH_RE.fullmatch(value):
        return None
    return "must look like 'package.module:function'"


def _name(value: Any) -> str | None:
    try:
        validate_name(value, "namespace")
    except UsageError as exc:
        return str(exc)
    return None


def _host(value: Any) -> str | None:
    """A host a replica binds or announces: a name, an IPv4 address or a bare IPv6 address."""
    if not value:
        return "must not be empty"
    try:
        format_http_address(value, 1)
    except ValueError:
        return "must be a host name or an IP address (no port, scheme or path)"
    return None


def _port(value: Any) -> str | None:
    return None if 0 <= value <= 65535 else "must be in 0..65535"


def defaults(table: tuple[Setting, ...]) -> Mapping[str, Any]:
    return {s.name: s.default for s in table}


# -- autoscaling_config: Ray Serve's knobs (same names, same defaults) ---------------------------

AUTOSCALING: tuple[Setting, ...] = (
    Setting("min_replicas", "int", 1, "never fewer replicas. `0` allows scale to zero: the app "
            "stays reachable, the first request wakes it."),
    Setting("max_replicas", "int", 1, "never more; must be >= `min_replicas`.", low=1),
    Setting("initial_replicas", "int", None, "replicas to start with; within [`min_replicas`, "
            "`max_replicas`].", nullable=True, doc_type="integer or `null`",
            doc_default="`null` (= `min_replicas`)"),
    Setting("target_ongoing_requests", "float", 2.0, "desired requests per replica (running + "
            "queued). Desired replicas = ceil(demand / target).", strict=True),
    Setting("upscale_delay_s", "float", 30.0, "demand must call for more replicas this long "
            "before scaling up (not from zero: demand at zero replicas scales at once to what "
            "it needs, at least 1)."),
    Setting("downscale_delay_s", "float", 600.0, "demand must call for fewer replicas this long "
            "before scaling down."),
    Setting("downscale_to_zero_delay_s", "float", None, "the delay for the last step, 1 -> 0.",
            nullable=True, doc_default="`null` (= `downscale_delay_s`)"),
    Setting("look_back_period_s", "float", 30.0, "demand is the time-weighted mean over this "
            "window; a rise above what the current replicas serve is averaged from its onset "
            "(below).", strict=True),
    Setting("metrics_interval_s", "float", 10.0, "how often the deployment's reports are sent, "
            "and the cadence the controller expects. Every router that sends to the deployment "
            "(handles, the proxy, the gateway, in-process handles in other replicas) follows it: "
            "the controller writes it into each member value in `fp_membership`, and a change "
            "takes effect at the routers within a KV round trip (all members are rewritten "
            "once). Their own setting (`--metrics-interval`, `FLEETPULSE_METRICS_INTERVAL_S`, "
            "default 10 s) applies only until the deployment has had a replica. Replicas that "
            "push their own reports (`push_metrics`) take it when they start: a change applies "
            "to replicas started after it.", strict=True),
    Setting("upscaling_factor", "float", 1.0, "multiplies each upscaling step (smoothing below "
            "1, faster above 1).", strict=True, doc_default="`1.0`"),
    Setting("downscaling_factor", "float", 1.0, "the same for downscaling.", strict=True,
            doc_default="`1.0`"),
    Setting("panic_mode", "bool", False, "Knative-style panic: short-window demand at "
            "`panic_threshold` x the running replicas' capacity scales up at once and blocks "
            "scale-down until it calms."),
    Setting("panic_window_s", "float", 6.0, "the short window panic mode looks at.", strict=True),
    Setting("panic_threshold", "float", 2.0, "demand / capacity ratio that starts a panic.",
            strict=True),
    Setting("policy", "str", None, "a custom autoscaling policy, Ray Serve's shape: "
            '`{policy_function: "package.module:function"}`. See [Custom metrics and policies]'
            "(#custom-metrics-and-policies).", validate=_import_path, doc_type="mapping",
            doc_default="none"),
)  # fmt: skip
AUTOSCALING_BY_NAME: Mapping[str, Setting] = {s.name: s for s in AUTOSCALING}


# -- service settings: one flag and one environment variable each, read in main() ----------------

NAMESPACE = Setting(
    "namespace",
    "str",
    DEFAULT_NAMESPACE,
    "subject namespace",
    validate=_name,
    flag="--namespace",
    env="FLEETPULSE_NAMESPACE",
)
ROUTER_METRICS_INTERVAL = Setting(
    "metrics_interval_s",
    "float",
    AUTOSCALING_BY_NAME["metrics_interval_s"].default,
    "handle report cadence until a deployment's members carry its metrics_interval_s",
    strict=True,
    flag="--metrics-interval",
    env="FLEETPULSE_METRICS_INTERVAL_S",
    metavar="SECONDS",
)
SERVICE: tuple[Setting, ...] = (NAMESPACE, ROUTER_METRICS_INTERVAL)

# logging and Prometheus metrics: every service
LOG_LEVEL = Setting(
    "log_level", "str", None, "DEBUG, INFO, WARNING or ERROR", flag="--log-level",
    env="FLEETPULSE_LOG_LEVEL",
    doc_default="`INFO` for services, `WARNING` for the deploy/delete/status tools",
)  # fmt: skip
METRICS_PORT = Setting(
    "metrics_port", "int", 0, "serve Prometheus /metrics on this port, on $FLEETPULSE_METRICS_HOST",
    low=None, validate=_port, flag="--metrics-port", env="FLEETPULSE_METRICS_PORT",
    metavar="PORT", doc_default="`0`: off",
)  # fmt: skip
METRICS_HOST = Setting(
    "metrics_host", "str", "127.0.0.1", "the address /metrics listens on: loopback unless asked "
    "(compose's image sets 0.0.0.0, where Prometheus scrapes over the compose network and "
    "nothing is published)", env="FLEETPULSE_METRICS_HOST",
)  # fmt: skip
OBSERVABILITY: tuple[Setting, ...] = (LOG_LEVEL, METRICS_PORT, METRICS_HOST)

# the routers' (handles in any process read the environment once; the gateway also has flags)
COLUMNAR_MIN_REPLICAS = Setting(
    "columnar_min_replicas", "int", 128, "report width from which reports go columnar (Arrow), "
    "narrower ones msgpack (128: the ingest benchmark's crossover, rounded up)", low=1,
    flag="--columnar-min-replicas", env="FLEETPULSE_COLUMNAR_MIN_REPLICAS",
)  # fmt: skip
ROUTER_ADMISSION_TIMEOUT = Setting(
    "admission_timeout_s", "float", 2.0, "no admission within this long: the request was never "
    "admitted; retry elsewhere", strict=True, flag="--admission-timeout", metavar="SECONDS",
)  # fmt: skip
ROUTER_MAX_QUEUED = Setting(
    "max_queued_requests", "int", 1000, "requests waiting for a replica at one deployment's "
    "router; one more is refused (back pressure)", flag="--max-queued",
)  # fmt: skip
DRAIN_TIMEOUT = Setting(
    "drain_timeout_s", "float", 10.0, "on SIGTERM, how long in-flight requests may take",
    strict=True, flag="--drain-timeout", metavar="SECONDS",
)  # fmt: skip
ROUTER: tuple[Setting, ...] = (
    COLUMNAR_MIN_REPLICAS, ROUTER_ADMISSION_TIMEOUT, ROUTER_MAX_QUEUED, DRAIN_TIMEOUT,
)  # fmt: skip

# the controller's own settings with an environment variable (compose sets them per member)
CONTROLLER_MEMBER_ID = Setting(
    "member_id",
    "str",
    None,
    "this member's name in the consumer group",
    flag="--member-id",
    env="FLEETPULSE_MEMBER_ID",
    doc_default="generated, `c-` and 8 hex digits",
)
CONTROLLER_OWNER_EPOCH = Setting(
    "owner_epoch",
    "int",
    1,
    "fencing epoch written with every KV value (a successor must use a higher one)",
    low=None,
    flag="--owner-epoch",
    env="FLEETPULSE_OWNER_EPOCH",
)
CONTROLLER_STREAM_REPLICAS = Setting(
    "stream_replicas",
    "int",
    1,
    "FP_REPORTS replicas (3 on a 3-node cluster); KV buckets follow $FLEETPULSE_KV_REPLICAS",
    low=None,
    flag="--stream-replicas",
    env="FLEETPULSE_STREAM_REPLICAS",
)
CONTROLLER_DECODE_THREADS = Setting(
    "decode_threads",
    "int",
    0,
    "1: decode columnar reports on a worker thread, applied in order (0: on the event loop; "
    "see docs/benchmarks.md)",
    low=None,
    choices=(0, 1),
    flag="--decode-threads",
    env="FLEETPULSE_DECODE_THREADS",
)

# the HTTP proxy's and the router gateway's
PROXY_HOST = Setting(
    "host", "str", "127.0.0.1", "the HTTP proxy's listen address", flag="--host",
    env="FLEETPULSE_PROXY_HOST",
)  # fmt: skip
PROXY_PORT = Setting(
    "port", "int", 8000, "the HTTP proxy's listen port, 0 for any free one", low=None,
    validate=lambda v: None if 0 <= v <= 65535 else "must be in 0..65535", flag="--port",
    env="FLEETPULSE_PROXY_PORT",
)  # fmt: skip
GATEWAY_QUEUE_GROUP = Setting(
    "queue_group", "str", "fp-gateway", "the router gateway's queue group (call endpoint)",
    flag="--queue-group", env="FLEETPULSE_GATEWAY_QUEUE_GROUP",
)  # fmt: skip
GATEWAY_DEADLINE = Setting(
    "deadline_s", "float", 30.0, "the router gateway's request deadline, unless a request's "
    "Fp-Deadline-S header says otherwise", strict=True, flag="--deadline",
    env="FLEETPULSE_GATEWAY_DEADLINE_S", metavar="SECONDS",
)  # fmt: skip
PROXY_MAX_HELD = Setting(
    "max_held_per_app", "int", 1000, "requests one app may hold while it wakes from zero; one "
    "more gets 503 at once", flag="--max-held", metavar="N",
)  # fmt: skip
PROXY_MAX_WAIT = Setting(
    "max_wait_s", "float", 60.0, "longest wait for a replica before 503", strict=True,
    flag="--max-wait", metavar="SECONDS",
)  # fmt: skip
PROXY_RETRY_AFTER = Setting(
    "retry_after_s", "int", 5, "Retry-After of a 503", flag="--retry-after", metavar="SECONDS",
)  # fmt: skip
PROXY_REQUEST_TIMEOUT = Setting(
    "request_timeout_s", "float", None, "deadline of a request unless its Fp-Deadline-S header "
    "says otherwise", strict=True, flag="--request-timeout", metavar="SECONDS",
    doc_default="none",
)  # fmt: skip
PROXY_NO_PUBLISH_ROUTES = Setting(
    "no_publish_routes", "bool", False, "do not write the registry to KV fp_routes (e.g. without "
    "permission to)", flag="--no-publish-routes",
)  # fmt: skip
PROXY_FRONT = Setting(
    "front", "str", "haproxy", "the HTTP front door: haproxy (HAProxy on the public port sends "
    "requests straight to replicas that serve HTTP; the Python proxy behind it holds requests at "
    "zero) or python (the Python proxy alone, every request over NATS)", choices=("haproxy",
    "python"), flag="--front", env="FLEETPULSE_PROXY_FRONT",
)  # fmt: skip
INGRESS: tuple[Setting, ...] = (
    PROXY_HOST, PROXY_PORT, PROXY_FRONT, PROXY_MAX_HELD, PROXY_MAX_WAIT, PROXY_RETRY_AFTER,
    PROXY_REQUEST_TIMEOUT, PROXY_NO_PUBLISH_ROUTES, GATEWAY_QUEUE_GROUP, GATEWAY_DEADLINE,
)  # fmt: skip

# the auth callout service's (`fleetpulse auth`)
AUTH_ISSUER_SEED = Setting(
    "issuer_seed", "str", None, "the account nkey seed that signs the user JWTs; the server's "
    "auth_callout `issuer` is its public key", flag="--issuer-seed",
    env="FLEETPULSE_AUTH_ISSUER_SEED_FILE", metavar="FILE", doc_default="none (required)",
)  # fmt: skip
AUTH_REPLICA_KEYS_FILE = Setting(
    "replica_keys_file", "str", None, "agent replica keys to trust, one per line (what "
    "`fleetpulse auth-init` writes); read at start, added to --replica-key",
    flag="--replica-keys-file", env="FLEETPULSE_AUTH_REPLICA_KEYS_FILE", metavar="FILE",
    doc_default="none",
)  # fmt: skip
AUTH_ROLE_PASSWORDS_DIR = Setting(
    "role_passwords_dir", "str", None, "one file per role (DIR/operator, ...) holding its "
    "password, as `fleetpulse auth-init --role-password` writes them; a role without a file "
    "takes FP_{ROLE}_PASSWORD", flag="--role-passwords-dir",
    env="FLEETPULSE_AUTH_ROLE_PASSWORDS_DIR", metavar="DIR", doc_default="none",
)  # fmt: skip
AUTH_ACCOUNT = Setting(
    "account", "str", None, "the account connections land in", flag="--account",
    env="FLEETPULSE_AUTH_ACCOUNT",
    doc_default="`$G`, the account of a server without an accounts block",
)  # fmt: skip
AUTH_PUBLISHED_NATS_URL = Setting(
    "published_nats_url", "str", None, "`fleetpulse auth-credentials`: the server URL as the "
    "caller reaches it (exported as FLEETPULSE_NATS_URL)", flag="--nats-url",
    env="FP_PUBLISHED_NATS_URL", metavar="URL", doc_default="none (not exported)",
)  # fmt: skip
AUTH: tuple[Setting, ...] = (
    AUTH_ISSUER_SEED, AUTH_REPLICA_KEYS_FILE, AUTH_ROLE_PASSWORDS_DIR, AUTH_ACCOUNT,
    AUTH_PUBLISHED_NATS_URL,
)  # fmt: skip

# the agent's (and its replicas')
AGENT_ID = Setting(
    "agent_id",
    "str",
    None,
    "the agent's id (an agent's own; a replica's: the agent that started it)",
    flag="--agent-id",
    env="FLEETPULSE_AGENT_ID",
    doc_default="an agent: hostname plus a random suffix; a replica: none",
)
AGENT_REPLICA_KEY_SEED = Setting(
    "replica_key_seed",
    "str",
    None,
    "with the auth callout: the nkey seed (`fleetpulse auth-key replica FILE`) that signs each "
    "replica's own credential; replaces --replica-nats-*",
    flag="--replica-key-seed",
    env="FLEETPULSE_AGENT_REPLICA_KEY_FILE",
    metavar="FILE",
    doc_default="none",
)
AGENT_MAX_REPLICAS = Setting(
    "max_replicas", "int", 8, "most replica processes run at once", flag="--max-replicas",
)  # fmt: skip
AGENT_WORKDIR = Setting(
    "workdir", "str", ".", "replicas' working directory", flag="--workdir",
)  # fmt: skip
AGENT_LOG_DIR = Setting(
    "log_dir", "str", None, "per-replica log files", flag="--log-dir", doc_default="a temp dir",
)  # fmt: skip
AGENT_PYTHON = Setting(
    "python", "str", None, "interpreter for replicas", flag="--python",
    doc_default="the agent's own",
)  # fmt: skip
AGENT_CACHE_DIR = Setting(
    "cache_dir", "str", None, "runtime environments: unpacked code packages and built Python "
    "environments, by content hash (kept across restarts)", flag="--cache-dir",
    env="FLEETPULSE_AGENT_CACHE_DIR", doc_default="~/.cache/fleetpulse/agent-{agent id}",
)  # fmt: skip
AGENT_CACHE_MB = Setting(
    "cache_mb", "int", 4096, "bound of the package cache (MiB); least recently used packages "
    "no replica runs are removed past it", low=1, flag="--cache-mb",
    env="FLEETPULSE_AGENT_CACHE_MB",
)  # fmt: skip
AGENT_MAX_ENV_BUILDS = Setting(
    "max_env_builds", "int", 2, "pip/uv environments built at once", low=1,
    flag="--max-env-builds",
)  # fmt: skip
AGENT_ENV_GRACE = Setting(
    "env_grace_s", "float", 86400.0, "a built pip/uv environment that no replica on this agent "
    "has used this long is removed (built again if asked for again)", strict=True,
    flag="--env-grace-s", env="FLEETPULSE_AGENT_ENV_GRACE_S",
)  # fmt: skip
DEPLOY_MAX_PACKAGE_MB = Setting(
    "max_package_mb", "int", 512, "`fleetpulse deploy`/`up --config`: a working_dir or "
    "py_modules package larger than this (MiB, after excludes) is refused (Ray's own limit)",
    low=1, flag="--max-package-mb", env="FLEETPULSE_MAX_PACKAGE_MB",
)  # fmt: skip
AGENT_SPARE_REPLICAS = Setting(
    "spare_replicas", "int", 1, "replica processes kept started ahead, their imports done: "
    "a replica starts in one (a wake from zero skips the interpreter start and imports); 0: off",
    low=0, flag="--spare-replicas", env="FLEETPULSE_AGENT_SPARE_REPLICAS",
)  # fmt: skip
AGENT_KILL_MARGIN = Setting(
    "kill_margin_s", "float", 5.0, "SIGKILL this long after a replica's "
    "graceful_shutdown_timeout_s ran out", flag="--kill-margin-s",
)  # fmt: skip
AGENT_CREDENTIAL_TTL = Setting(
    "credential_ttl_s", "float", 600.0, "how long a replica credential lets it connect; renewed "
    "with a third left", strict=True, flag="--credential-ttl-s",
)  # fmt: skip
REPLICA_HTTP_HOST = Setting(
    "replica_http_host", "str", "127.0.0.1", "where the replicas of an app's ingress deployment "
    "serve HTTP themselves: the address their server binds, on a free port (0.0.0.0: every "
    "interface)", validate=_host, flag="--replica-http-host", env="FLEETPULSE_REPLICA_HTTP_HOST",
    metavar="HOST",
)  # fmt: skip
REPLICA_HTTP_ADVERTISE = Setting(
    "replica_http_advertise", "str", None, "the host those replicas announce in their "
    "http_address, where the proxy's HAProxy connects (set it when the bind address is "
    "0.0.0.0 or not reachable as it is)", validate=_host, flag="--replica-http-advertise",
    env="FLEETPULSE_REPLICA_HTTP_ADVERTISE", metavar="HOST",
    doc_default="the bind host; for 0.0.0.0 or ::, the machine's host name",
)  # fmt: skip
AGENT: tuple[Setting, ...] = (
    AGENT_ID, AGENT_REPLICA_KEY_SEED, AGENT_MAX_REPLICAS, AGENT_WORKDIR, AGENT_LOG_DIR,
    AGENT_PYTHON, AGENT_KILL_MARGIN, AGENT_SPARE_REPLICAS, AGENT_CREDENTIAL_TTL, REPLICA_HTTP_HOST,
    REPLICA_HTTP_ADVERTISE, AGENT_CACHE_DIR, AGENT_CACHE_MB,
    AGENT_MAX_ENV_BUILDS, AGENT_ENV_GRACE,
)  # fmt: skip

CONTROLLER_PARTITIONS = Setting(
    "partitions", "int", 16, "FP_REPORTS partitions", low=None, flag="--partitions",
)  # fmt: skip
CONTROLLER_RETENTION = Setting(
    "retention_s", "float", 600.0, "stream retention", low=None, flag="--retention-s",
)  # fmt: skip
CONTROLLER_REBUILD = Setting(
    "rebuild_s", "float", 60.0, "history replayed from the stream at start (>= the longest "
    "look-back window)", low=None, flag="--rebuild-s",
)  # fmt: skip
CONTROLLER_CONTROL_INTERVAL = Setting(
    "control_interval_s", "float", 0.1, "how often the controller ticks", low=None,
    flag="--control-interval-s",
)  # fmt: skip
CONTROLLER_MEMBER_TTL = Setting(
    "member_ttl_s", "float", 2.0, "a member not heard from this long is gone and its partitions "
    "are taken over", low=None, flag="--member-ttl-s",
)  # fmt: skip
CONTROLLER_HEARTBEAT = Setting(
    "heartbeat_s", "float", 0.5, "how often a member refreshes its group entry (keep several "
    "per TTL)", low=None, flag="--heartbeat-s",
)  # fmt: skip
CONTROLLER_POLICY_TIMEOUT = Setting(
    "policy_timeout_s", "float", 0.5, "deadline of one custom autoscaling policy call; past it "
    "the default policy decides that tick, the policy worker process is restarted, and a policy "
    "that misses it 3 times in a row is quarantined (docs/deploy.md)", strict=True,
    flag="--custom-policy-timeout-s", env="FLEETPULSE_CUSTOM_POLICY_TIMEOUT_S",
)  # fmt: skip
CONTROLLER_STATS_FILE = Setting(
    "stats_file", "str", "", "append per-tick loop stats as JSON lines (benchmarks; see "
    "controller/machinery/)", flag="--stats-file", doc_default="none",
)  # fmt: skip
# the recorder's (`fleetpulse record`, also run as a compose service)
RECORD_PREFIX = Setting("prefix", "str", "fleetpulse", "file name prefix", flag="--prefix")
RECORD_BATCH_ROWS = Setting(
    "batch_rows", "int", 1000, "rows per batch", low=None, flag="--batch-rows",
)  # fmt: skip
RECORD_FLUSH_INTERVAL = Setting(
    "flush_interval_s", "float", 1.0, "write a batch at least this often (a crash loses at most "
    "one batch)", low=None, flag="--flush-interval-s",
)  # fmt: skip
RECORD_ROTATE_MB = Setting(
    "rotate_mb", "float", 256.0, "start a new file at this size (MiB)", strict=True,
    flag="--rotate-mb",
)  # fmt: skip
RECORD_ROTATE_S = Setting(
    "rotate_s", "float", 3600.0, "start a new file at this age", low=None, flag="--rotate-s",
)  # fmt: skip
RECORD_ZSTD = Setting(
    "zstd", "bool", False, "compress record batches with zstd", flag="--zstd",
)  # fmt: skip
RECORD_PROGRESS_INTERVAL = Setting(
    "progress_interval_s", "float", 5.0, "print progress this often (0: off)", low=None,
    flag="--progress-interval-s",
)  # fmt: skip
RECORDER: tuple[Setting, ...] = (
    RECORD_PREFIX, RECORD_BATCH_ROWS, RECORD_FLUSH_INTERVAL, RECORD_ROTATE_MB, RECORD_ROTATE_S,
    RECORD_ZSTD, RECORD_PROGRESS_INTERVAL,
)  # fmt: skip
CONTROLLER_PREPARE_TIMEOUT = Setting(
    "prepare_timeout_s", "float", 1800.0, "a deployment whose runtime_env an agent still "
    "prepares (fetches its packages, builds its pip/uv environment) this long after it first "
    "said so is DEPLOY_FAILED; that time does not count in the replica's start timeout (120 s, "
    "from the process start)", strict=True, flag="--prepare-timeout-s",
    env="FLEETPULSE_PREPARE_TIMEOUT_S",
)  # fmt: skip

CONTROLLER: tuple[Setting, ...] = (
    CONTROLLER_MEMBER_ID,
    CONTROLLER_OWNER_EPOCH,
    CONTROLLER_STREAM_REPLICAS,
    CONTROLLER_DECODE_THREADS,
    CONTROLLER_POLICY_TIMEOUT,
    CONTROLLER_PREPARE_TIMEOUT,
    CONTROLLER_PARTITIONS,
    CONTROLLER_RETENTION,
    CONTROLLER_REBUILD,
    CONTROLLER_CONTROL_INTERVAL,
    CONTROLLER_MEMBER_TTL,
    CONTROLLER_HEARTBEAT,
    CONTROLLER_STATS_FILE,
)

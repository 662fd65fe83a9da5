"""AgentConfig: one frozen config for the node agent, built once from flags and env."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import socket
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from shared import resources, settings
from shared.errors import ConfigError
from shared.kv.targets import UNPLACED
from shared.metrics_catalog import add_metrics_port_argument, metrics_port
from shared.natsauth import REPLICA_ENV_PREFIX, NatsAuth, process_auth
from shared.natsjwt import KeyPair, read_seed
from shared.replicacred import DEFAULT_TTL_S
from shared.subjects import DEFAULT_NAMESPACE, validate_name

from .core import KILL_MARGIN_S

log = logging.getLogger(__name__)

DEFAULT_MAX_REPLICAS: int = settings.AGENT_MAX_REPLICAS.default
_HOST_PREFIX_CHARS = 40  # leaves room for the random suffix within the 64-character token limit
_NOT_TOKEN = re.compile(r"[^A-Za-z0-9_-]+")
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::"})
"""Bind hosts that name every interface: no peer can connect to them as they are."""


def default_agent_id(hostname: str | None = None) -> str:
    """`{hostname}-{6 hex}`: readable in `nats kv ls`, unique across restarts on one host."""
    host = _NOT_TOKEN.sub("-", hostname if hostname is not None else socket.gethostname())
    host = host.strip("-")[:_HOST_PREFIX_CHARS] or "agent"
    return f"{host}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True, slots=True)
class AgentConfig:
    nats_url: str
    agent_id: str = field(default_factory=default_agent_id)
    max_replicas: int = DEFAULT_MAX_REPLICAS
    resources: Mapping[str, float] = field(default_factory=dict)
    """Resources given with `--resource` (`gpus`, `cpus`, `memory`, custom); what the agent
    offers placement is `offer` (the machine's cpus and memory filled in)."""
    workdir: str = settings.AGENT_WORKDIR.default
    """The replicas' working directory (user code there imports: `python -m` puts it on sys.path)."""
    pythonpath: tuple[str, ...] = ()
    """Extra PYTHONPATH entries for the replicas, ahead of the inherited PYTHONPATH."""
    log_dir: str | None = None
    """Per-replica log files go here (default: a fresh temporary directory)."""
    namespace: str = DEFAULT_NAMESPACE
    python: str = sys.executable
    kill_margin_s: float = KILL_MARGIN_S
    spare_replicas: int = settings.AGENT_SPARE_REPLICAS.default
    """Replica processes started ahead of need (spare.py)."""
    metrics_port: int = settings.METRICS_PORT.default
    replica_auth: NatsAuth = field(default_factory=NatsAuth)
    """The NATS identity (and TLS) the replicas connect with: their own role's, not ours."""
    replica_key: KeyPair | None = field(default=None, repr=False)
    """With the auth callout: the key that signs each replica's own credential (then
    `replica_auth` carries TLS settings only)."""
    credential_ttl_s: float = DEFAULT_TTL_S
    cache_dir: str | None = None
    """Runtime environments' packages and Python environments (None: ~/.cache/fleetpulse/...)."""
    cache_mb: int = settings.AGENT_CACHE_MB.default
    max_env_builds: int = settings.AGENT_MAX_ENV_BUILDS.default
    env_grace_s: float = settings.AGENT_ENV_GRACE.default
    replica_http_host: str = settings.REPLICA_HTTP_HOST.default
    """Where the replicas of an ingress deployment bind their own HTTP server."""
    replica_http_advertise: str | None = None
    """The host they announce in their http_address (None: the bind host)."""

    def __post_init__(self) -> None:
        validate_name(self.agent_id, "agent id")
        if self.agent_id == UNPLACED:
            raise ConfigError(
                f"{UNPLACED!r} is reserved (replicas not placed on any agent)", field="agent_id"
            )
        validate_name(self.namespace, "namespace")
        if not self.credential_ttl_s > 0:
            raise ConfigError("must be > 0", field="credential_ttl_s")
        settings.AGENT_MAX_REPLICAS.check(self.max_replicas)
        settings.AGENT_KILL_MARGIN.check(self.kill_margin_s)
        settings.AGENT_SPARE_REPLICAS.check(self.spare_replicas)
        settings.REPLICA_HTTP_HOST.check(self.replica_http_host)
        settings.REPLICA_HTTP_ADVERTISE.check(self.replica_http_advertise)
        if not Path(self.workdir).is_dir():
            raise ConfigError(f"{self.workdir!r} is not a directory", field="workdir")
        for name, amount in self.resources.items():
            validate_name(name, "resource name")
            problem = resources.amount_problem(amount)
            if problem is not None:
                raise ConfigError(problem, field=f"--resource {name}")
        gpus = self.resources.get(resources.GPUS, 0.0)
        if gpus != int(gpus):
            raise ConfigError(
                f"must be a whole number of GPU devices, got {gpus:g}", field="--resource gpus"
            )

    @property
    def offer(self) -> dict[str, float]:
        """What this agent offers placement: `--resource` amounts, and for `cpus` and `memory`
        (bytes) the machine's own unless given; `gpus` only when given."""
        return dict(sorted({**machine_resources(), **self.resources}.items()))

    def replica_http_env(self, hostname: str | None = None) -> dict[str, str]:
        """The replicas' HTTP settings, in the variables they read (shared/replicahttp.py): set
        for every replica (only an ingress deployment's use them), so what the agent was given
        by flag and what a replica inherited from the agent's environment cannot differ. The
        advertised host is the bind host, unless that is a wildcard (0.0.0.0, ::): then this
        machine's host name (in a container, a name its network resolves)."""
        host_env, advertise_env = (
            settings.REPLICA_HTTP_HOST.env,
            settings.REPLICA_HTTP_ADVERTISE.env,
        )
        assert host_env is not None and advertise_env is not None
        advertise = self.replica_http_advertise or self.replica_http_host
        if advertise in WILDCARD_HOSTS:
            advertise = hostname if hostname is not None else socket.gethostname()
        return {host_env: self.replica_http_host, advertise_env: advertise}


def machine_resources() -> dict[str, float]:
    """This machine's CPUs (those this process may run on) and physical memory in bytes."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    out = {resources.CPUS: float(cpus)}
    # not knowable everywhere: a memory request then needs --resource memory=BYTES
    with contextlib.suppress(AttributeError, ValueError, OSError):
        out[resources.MEMORY] = float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    return out


def add_agent_arguments(p: argparse.ArgumentParser) -> None:
    settings.AGENT_ID.add_flag(p)
    settings.AGENT_MAX_REPLICAS.add_flag(p)
    p.add_argument(
        "--resource",
        action="append",
        default=[],
        metavar="NAME=AMOUNT",
        help="a resource this machine offers, e.g. gpus=2 (whole devices), cpus=8, "
        "memory=BYTES or any name (repeatable; default: the machine's cpus and memory)",
    )
    settings.AGENT_WORKDIR.add_flag(p)
    p.add_argument(
        "--pythonpath",
        action="append",
        default=[],
        metavar="DIR",
        help=f"extra PYTHONPATH entry for replicas (repeatable, or '{os.pathsep}'-separated)",
    )
    settings.AGENT_LOG_DIR.add_flag(p)
    settings.NAMESPACE.add_flag(p)
    settings.AGENT_PYTHON.add_flag(p)
    settings.AGENT_KILL_MARGIN.add_flag(p)
    settings.AGENT_SPARE_REPLICAS.add_flag(p)
    settings.AGENT_CACHE_DIR.add_flag(p)
    settings.AGENT_CACHE_MB.add_flag(p)
    settings.AGENT_MAX_ENV_BUILDS.add_flag(p)
    settings.AGENT_ENV_GRACE.add_flag(p)
    for name, metavar in (("user", "NAME"), ("password", "SECRET"), ("token", "SECRET"),
                          ("creds", "FILE")):  # fmt: skip
        env = REPLICA_ENV_PREFIX + name.upper()
        p.add_argument(
            f"--replica-nats-{name}",
            default=None,
            metavar=metavar,
            help=f"the replicas' NATS {name} (${env}; default: the agent's own, with a warning)",
        )
    settings.AGENT_REPLICA_KEY_SEED.add_flag(p)
    settings.AGENT_CREDENTIAL_TTL.add_flag(p)
    settings.REPLICA_HTTP_HOST.add_flag(p)
    settings.REPLICA_HTTP_ADVERTISE.add_flag(p)
    add_metrics_port_argument(p)


def parse_resources(items: Sequence[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items:
        name, sep, amount = item.partition("=")
        try:
            if not sep:
                raise ValueError
            out[name.strip()] = float(amount)
        except ValueError:
            raise ConfigError(f"expected NAME=AMOUNT, got {item!r}", field="--resource") from None
    return out


def _split_paths(items: Sequence[str]) -> tuple[str, ...]:
    # absolute, so that they mean the same from the replicas' working directory
    return tuple(
        str(Path(part).resolve()) for item in items for part in item.split(os.pathsep) if part
    )


def config_from_args(args: argparse.Namespace) -> AgentConfig:
    env = os.environ
    agent_id = settings.AGENT_ID.resolve(args.agent_id, env)
    extra = {"agent_id": agent_id} if agent_id else {}
    seed = settings.AGENT_REPLICA_KEY_SEED.resolve(args.replica_key_seed, env)
    log_dir = settings.AGENT_LOG_DIR.resolve(args.log_dir, env)
    key = read_seed(seed, "--replica-key-seed") if seed else None
    return AgentConfig(
        nats_url=args.nats,
        max_replicas=settings.AGENT_MAX_REPLICAS.resolve(args.max_replicas, env),
        resources=parse_resources(args.resource),
        workdir=str(Path(settings.AGENT_WORKDIR.resolve(args.workdir, env)).resolve()),
        pythonpath=_split_paths(args.pythonpath),
        log_dir=str(Path(log_dir).resolve()) if log_dir else None,
        namespace=settings.NAMESPACE.resolve(args.namespace, env),
        python=settings.AGENT_PYTHON.resolve(args.python, env) or sys.executable,
        kill_margin_s=settings.AGENT_KILL_MARGIN.resolve(args.kill_margin_s, env),
        spare_replicas=settings.AGENT_SPARE_REPLICAS.resolve(args.spare_replicas, env),
        metrics_port=metrics_port(args),
        replica_auth=replica_auth(
            NatsAuth.from_env(prefix=REPLICA_ENV_PREFIX).overridden(
                user=args.replica_nats_user,
                password=args.replica_nats_password,
                token=args.replica_nats_token,
                creds=args.replica_nats_creds,
            ),
            process_auth(),
            minted=key is not None,
        ),
        replica_key=key,
        credential_ttl_s=settings.AGENT_CREDENTIAL_TTL.resolve(args.credential_ttl_s, env),
        replica_http_host=settings.REPLICA_HTTP_HOST.resolve(args.replica_http_host, env),
        replica_http_advertise=settings.REPLICA_HTTP_ADVERTISE.resolve(
            args.replica_http_advertise, env
        ),
        cache_dir=settings.AGENT_CACHE_DIR.resolve(args.cache_dir, env),
        cache_mb=settings.AGENT_CACHE_MB.resolve(args.cache_mb, env),
        max_env_builds=settings.AGENT_MAX_ENV_BUILDS.resolve(args.max_env_builds, env),
        env_grace_s=settings.AGENT_ENV_GRACE.resolve(args.env_grace_s, env),
        **extra,
    )


def replica_auth(own: NatsAuth, agent: NatsAuth, *, minted: bool = False) -> NatsAuth:
    """The replicas' settings: their own identity if given, else the agent's (least privilege
    wants their own: the agent's role may write fp_agents); TLS settings the agent's unless set.
    `minted`: each replica gets its own credential instead (services/agent/credentials.py)."""
    if minted:
        own = NatsAuth(tls_ca=own.tls_ca, tls_cert=own.tls_cert, tls_key=own.tls_key)
    elif not own.has_identity and agent.has_identity:
        log.warning(
            "no replica NATS credentials given (--replica-nats-* or %s*): replicas connect "
            "as the agent (%s)",
            REPLICA_ENV_PREFIX,
            agent.describe(),
        )
        own = replace(own, user=agent.user, password=agent.password, token=agent.token,
                      creds=agent.creds, password_file=agent.password_file)  # fmt: skip
    return replace(
        own,
        tls_ca=own.tls_ca or agent.tls_ca,
        tls_cert=own.tls_cert or agent.tls_cert,
        tls_key=own.tls_key or agent.tls_key,
    ).validate()

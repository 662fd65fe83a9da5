"""The agent's decisions, pure: which replica processes to start, to stop (SIGTERM), to kill.

How it works: the shell hands `plan()` what the targets want on this agent (`wanted`, replica id
-> ReplicaSpec, in target order) and the children it has (`running`, replica id -> ChildState),
with its capacity and the monotonic `now`, and carries out the actions it gets back:

- a wanted replica with no child is started, in `wanted` order, while live children (running,
  stopping or killed but not yet exited) number fewer than `capacity`; the rest are reported once
  per plan in `OverCapacity`. A draining child still holds its slot: its process (and its memory,
  its GPU) is there until it exits, so a replacement waits for it.
- a RUNNING child no longer wanted gets `Stop` (SIGTERM: the replica drains) with a deadline of
  its graceful_shutdown_timeout_s plus a margin; a STOPPING child past its deadline gets `Kill`.
- an exited child is never restarted: while it is still wanted, its record stays so that it is
  not started again (the controller replaces it under a new id); once it is no longer wanted, the
  record is dropped (`Forget`).

Nothing here does I/O or reads a clock, so a plan is a function of its inputs: applying the
actions and planning again with the same inputs yields no further start, stop or kill.
The module also turns a `TargetSet` into the specs of this agent's replicas, and a spec into the
replica's command line (both pure).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from shared.appconfig import AutoscalingConfig, DeploymentConfig
from shared.control import TargetSet
from shared.errors import FleetpulseError, WireError
from shared.subjects import Subjects, validate_name
from shared.wire import reasons

KILL_MARGIN_S = 5.0
"""SIGKILL comes this long after a replica's graceful_shutdown_timeout_s has run out: the replica
needs a moment past its drain to unsubscribe and report "exited"."""


class Phase(enum.Enum):
    RUNNING = "running"
    STOPPING = "stopping"  # SIGTERM sent, draining until the deadline
    KILLED = "killed"  # SIGKILL sent, waiting for the process to be reaped


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """How to run one replica: everything its command line needs."""

    app: str
    deployment: str
    replica_id: str
    version: str
    rpc_subject: str
    import_path: str
    init_args: tuple[Any, ...] = ()
    init_kwargs: Mapping[str, Any] = field(default_factory=dict)
    max_ongoing_requests: int = 5
    health_check_period_s: float = 10.0
    health_check_timeout_s: float = 30.0
    graceful_shutdown_timeout_s: float = 20.0


@dataclass(frozen=True, slots=True)
class ChildState:
    """One replica process this agent started and has not forgotten."""

    spec: ReplicaSpec
    phase: Phase = Phase.RUNNING
    stop_deadline: float | None = None
    exit_code: int | None = None
    """Set once the process is reaped (negative: killed by that signal)."""

    @property
    def exited(self) -> bool:
        return self.exit_code is not None

    def stopping(self, deadline: float) -> ChildState:
        return replace(self, phase=Phase.STOPPING, stop_deadline=deadline)

    def killed(self) -> ChildState:
        return replace(self, phase=Phase.KILLED)

    def exited_with(self, code: int) -> ChildState:
        return replace(self, exit_code=code)


@dataclass(frozen=True, slots=True)
class Start:
    spec: ReplicaSpec


@dataclass(frozen=True, slots=True)
class Stop:
    replica_id: str
    deadline: float
    """Monotonic time after which the child gets SIGKILL."""


@dataclass(frozen=True, slots=True)
class Kill:
    replica_id: str


@dataclass(frozen=True, slots=True)
class Forget:
    """Drop the record of an exited child that is no longer wanted."""

    replica_id: str


@dataclass(frozen=True, slots=True)
class OverCapacity:
    """Wanted replicas left unstarted for lack of a free slot (the shell logs it)."""

    skipped: tuple[str, ...]
    assigned: int
    """Wanted replicas without an exited child: more than capacity means over-assignment."""
    draining: int
    """Slots held by children that are stopping (a replacement waits for them)."""


Action = Start | Stop | Kill | Forget | OverCapacity


def plan(
    wanted: Mapping[str, ReplicaSpec],
    running: Mapping[str, ChildState],
    capacity: int,
    now: float,
    *,
    kill_margin_s: float = KILL_MARGIN_S,
) -> list[Action]:
    """The actions that bring `running` towards `wanted` (see the module docstring)."""
    actions: list[Action] = []
    live = 0
    draining = 0
    for rid, child in running.items():
        if child.exited:
            if rid not in wanted:
                actions.append(Forget(rid))
            continue
        live += 1
        if child.phase is Phase.RUNNING:
            if rid not in wanted:
                grace = child.spec.graceful_shutdown_timeout_s
                actions.append(Stop(rid, now + grace + kill_margin_s))
                draining += 1
        elif child.phase is Phase.STOPPING:
            draining += 1
            if child.stop_deadline is None or now >= child.stop_deadline:
                actions.append(Kill(rid))
        else:
            draining += 1  # KILLED: the slot is free once the process is reaped
    free = capacity - live
    skipped: list[str] = []
    for rid, spec in wanted.items():
        if rid in running:
            continue
        if free > 0:
            actions.append(Start(spec))
            free -= 1
        else:
            skipped.append(rid)
    if skipped:
        assigned = sum(1 for rid in wanted if rid not in running or not running[rid].exited)
        actions.append(OverCapacity(tuple(skipped), assigned, draining))
    return actions


def apply(running: Mapping[str, ChildState], actions: Sequence[Action]) -> dict[str, ChildState]:
    """`running` after every action succeeded (the shell's bookkeeping, and the tests' model)."""
    out = dict(running)
    for action in actions:
        if isinstance(action, Start):
            out[action.spec.replica_id] = ChildState(action.spec)
        elif isinstance(action, Stop):
            out[action.replica_id] = out[action.replica_id].stopping(action.deadline)
        elif isinstance(action, Kill):
            out[action.replica_id] = out[action.replica_id].killed()
        elif isinstance(action, Forget):
            del out[action.replica_id]
    return out


# -- from targets to specs ---------------------------------------------------------------------

_CONFIG_FIELDS = frozenset(f.name for f in fields(DeploymentConfig))
_SCALING_FIELDS = frozenset(f.name for f in fields(AutoscalingConfig))


def deployment_config(raw: Mapping[str, Any]) -> DeploymentConfig:
    """A TargetSet's `config` as a validated DeploymentConfig; unknown fields are ignored."""
    try:
        doc = {k: v for k, v in raw.items() if k in _CONFIG_FIELDS}
        scaling = doc.get("autoscaling")
        if scaling is not None:
            doc["autoscaling"] = AutoscalingConfig(
                **{k: v for k, v in dict(scaling).items() if k in _SCALING_FIELDS}
            )
        doc["init_args"] = tuple(doc.get("init_args", ()))
        doc["init_kwargs"] = dict(doc.get("init_kwargs", {}))
        return DeploymentConfig(**doc)
    except (FleetpulseError, TypeError, ValueError) as exc:
        raise WireError(reasons.BAD_VALUE, f"targets.config: {exc}") from None


def specs_for_agent(
    targets: TargetSet, agent_id: str, subjects: Subjects | None = None
) -> list[ReplicaSpec]:
    """The replicas of `targets` assigned to `agent_id`, in target order (WireError if the
    config is invalid; nothing to run means no config check)."""
    mine = [r for r in targets.replicas if r.agent_id == agent_id]
    if not mine:
        return []
    cfg = deployment_config(targets.config)
    subjects = subjects or Subjects()
    try:
        validate_name(targets.app, "app")
        validate_name(targets.deployment, "deployment")
    except FleetpulseError as exc:
        raise WireError(reasons.BAD_VALUE, f"targets: {exc}") from None
    out = []
    for r in mine:
        if not isinstance(r.version, str) or not isinstance(r.rpc_subject, str):
            raise WireError(reasons.WRONG_TYPE, "targets.replicas: version and rpc_subject")
        try:
            # the names become subject tokens and command-line arguments: check them here
            rpc = r.rpc_subject or subjects.rpc(targets.app, targets.deployment, r.replica_id)
            validate_name(r.replica_id, "replica_id")
        except FleetpulseError as exc:
            raise WireError(reasons.BAD_VALUE, f"targets.replicas: {exc}") from None
        out.append(
            ReplicaSpec(
                app=targets.app,
                deployment=targets.deployment,
                replica_id=r.replica_id,
                version=r.version or targets.version,
                rpc_subject=rpc,
                import_path=cfg.import_path,
                init_args=cfg.init_args,
                init_kwargs=cfg.init_kwargs,
                max_ongoing_requests=cfg.max_ongoing_requests,
                health_check_period_s=cfg.health_check_period_s,
                health_check_timeout_s=cfg.health_check_timeout_s,
                graceful_shutdown_timeout_s=cfg.graceful_shutdown_timeout_s,
            )
        )
    return out


def merge_wanted(per_key: Mapping[str, Sequence[ReplicaSpec]]) -> dict[str, ReplicaSpec]:
    """All deployments' specs in one order: by KV key, then target order (first id wins)."""
    out: dict[str, ReplicaSpec] = {}
    for key in sorted(per_key):
        for spec in per_key[key]:
            out.setdefault(spec.replica_id, spec)
    return out


def replica_argv(
    spec: ReplicaSpec, *, python: str, nats_url: str, agent_id: str, namespace: str
) -> list[str]:
    """The command line of the replica process (`python -m services.replica ...`)."""
    return [
        python,
        "-m",
        "services.replica",
        "--nats",
        nats_url,
        "--namespace",
        namespace,
        "--app",
        spec.app,
        "--deployment",
        spec.deployment,
        "--replica-id",
        spec.replica_id,
        "--import-path",
        spec.import_path,
        "--init-args",
        json.dumps(list(spec.init_args)),
        "--init-kwargs",
        json.dumps(dict(spec.init_kwargs)),
        "--max-ongoing-requests",
        str(spec.max_ongoing_requests),
        "--health-check-period-s",
        repr(spec.health_check_period_s),
        "--health-check-timeout-s",
        repr(spec.health_check_timeout_s),
        "--graceful-shutdown-timeout-s",
        repr(spec.graceful_shutdown_timeout_s),
        "--agent-id",
        agent_id,
        "--version",
        spec.version,
    ]

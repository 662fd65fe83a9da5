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

A child's phase moves only through `CHILD_LIFECYCLE`, one table of (phase, event) -> phase
(shared.transitions): a child is born RUNNING when its process is spawned (the agent says the
contract's `LifecycleState.STARTING` for it), STOP (SIGTERM) makes it STOPPING, KILL (SIGKILL)
KILLED, and REAPED, from any of the three, EXITED (the agent says `LifecycleState.EXITED`, with the
exit code). `advance()` steps a child; an event the table does not allow leaves the child as it
was and comes back as a `Refused`, which the shell counts and logs rate-limited (a second reap of
one child, say, does not report "exited" twice). `plan()` only ever asks for legal steps.

    RUNNING --stop--> STOPPING --kill--> KILLED     (and RUNNING --kill--> KILLED)
    RUNNING, STOPPING or KILLED --reaped--> EXITED (forgotten once no longer wanted)

Nothing here does I/O or reads a clock, so a plan is a function of its inputs: applying the
actions and planning again with the same inputs yields no further start, stop or kill.
The module also checks a target read from KV (`wanted_target`) and turns it into the replica's
command line (`replica_argv`; the settings' flags come from shared.replicaspec). Both pure.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final

from shared import resources, settings
from shared.kv.targets import ReplicaTarget, TargetKey
from shared.subjects import Subjects
from shared.transitions import Machine, Refused

KILL_MARGIN_S: float = settings.AGENT_KILL_MARGIN.default
"""SIGKILL comes this long after a replica's graceful_shutdown_timeout_s has run out: the replica
needs a moment past its drain to unsubscribe and report "exited"."""


class Phase(enum.Enum):
    RUNNING = "running"
    STOPPING = "stopping"  # SIGTERM sent, draining until the deadline
    KILLED = "killed"  # SIGKILL sent, waiting for the process to be reaped
    EXITED = "exited"  # reaped, with its exit code


class ChildEvent(enum.Enum):
    STOP = "stop"
    KILL = "kill"
    REAPED = "reaped"


CHILD_TABLE: Final[dict[tuple[Phase, ChildEvent], Phase]] = {
    (Phase.RUNNING, ChildEvent.STOP): Phase.STOPPING,
    (Phase.STOPPING, ChildEvent.KILL): Phase.KILLED,
    (Phase.RUNNING, ChildEvent.KILL): Phase.KILLED,  # no drain first (plan always stops first)
    (Phase.RUNNING, ChildEvent.REAPED): Phase.EXITED,  # crashed, or exited on its own
    (Phase.STOPPING, ChildEvent.REAPED): Phase.EXITED,
    (Phase.KILLED, ChildEvent.REAPED): Phase.EXITED,
}

CHILD_LIFECYCLE: Final[Machine[Phase, ChildEvent]] = Machine(
    "agent_child", tuple(Phase), tuple(ChildEvent), Phase.RUNNING, CHILD_TABLE
)


@dataclass(frozen=True, slots=True)
class ChildState:
    """One replica process this agent started and has not forgotten. (`stopping`, `killed` and
    `exited_with` build a child in a phase; the agent moves its children only by `advance`.)"""

    target: ReplicaTarget
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
        return replace(self, phase=Phase.EXITED, exit_code=code)


def advance(
    child: ChildState, event: ChildEvent, *, deadline: float | None = None, code: int = 0
) -> tuple[ChildState, Refused | None]:
    """`child` after `event` (STOP with its kill `deadline`, REAPED with the exit `code`), or
    `child` unchanged and why the table refused the event."""
    phase, refused = CHILD_LIFECYCLE.step(child.phase, event)
    if refused is not None:
        return child, refused
    if phase is Phase.EXITED:
        return child.exited_with(code), None
    return replace(
        child, phase=phase, stop_deadline=child.stop_deadline if deadline is None else deadline
    ), None


@dataclass(frozen=True, slots=True)
class Start:
    target: ReplicaTarget


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
    wanted: Mapping[str, ReplicaTarget],
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
                grace = child.target.spec.graceful_shutdown_timeout_s
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
    """`running` after every action succeeded (the shell's bookkeeping, and the tests' model;
    `plan` asks for no step the table refuses)."""
    out = dict(running)
    for action in actions:
        if isinstance(action, Start):
            out[action.target.replica_id] = ChildState(action.target)
        elif isinstance(action, Stop):
            rid = action.replica_id
            out[rid] = advance(out[rid], ChildEvent.STOP, deadline=action.deadline)[0]
        elif isinstance(action, Kill):
            out[action.replica_id] = advance(out[action.replica_id], ChildEvent.KILL)[0]
        elif isinstance(action, Forget):
            del out[action.replica_id]
    return out


# -- from targets to command lines ---------------------------------------------------------------


def wanted_target(
    key: str, target: ReplicaTarget, agent_id: str, subjects: Subjects
) -> ReplicaTarget | None:
    """The target read under `key` if it is this agent's to run (None: another agent's);
    WireError when the key is not a target key or names another replica than the value."""
    where = TargetKey.parse(key)
    target.check_key(key)
    if where.agent_id != agent_id:
        return None
    if not target.rpc_subject:
        rpc = subjects.rpc(target.app, target.deployment, target.replica_id)
        return replace(target, rpc_subject=rpc)
    return target


def merge_wanted(per_key: Mapping[str, ReplicaTarget]) -> dict[str, ReplicaTarget]:
    """All wanted replicas by id, in start order (by deployment, then order; first id wins)."""
    out: dict[str, ReplicaTarget] = {}
    for t in sorted(per_key.values(), key=lambda t: (t.app, t.deployment, t.order, t.slot)):
        out.setdefault(t.replica_id, t)
    return out


def replica_argv(
    target: ReplicaTarget, *, python: str, nats_url: str, agent_id: str, namespace: str
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
        target.app,
        "--deployment",
        target.deployment,
        "--replica-id",
        target.replica_id,
        *target.spec.argv(),
        "--agent-id",
        agent_id,
        "--version",
        target.version,
    ]


def replica_env(target: ReplicaTarget, own_devices: str | None) -> dict[str, str]:
    """The variables the replica gets over the agent's environment: its spec's `env`, and for a
    replica given GPUs, `CUDA_VISIBLE_DEVICES` naming its devices (shared.resources; `own_devices`
    is the agent's own CUDA_VISIBLE_DEVICES, whose entries the indices then refer to)."""
    env = dict(target.spec.env)
    if target.devices:
        env[resources.GPU_ENV] = resources.visible_devices(target.devices, own_devices)
    return env

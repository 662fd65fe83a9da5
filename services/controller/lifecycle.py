"""A replica's lifecycle as the controller keeps it: every transition of a `ReplicaRecord`.

How it works: a record's state (records.ReplicaState) moves only through `REPLICA_LIFECYCLE`
(shared.transitions), on two kinds of event: what the replica or its agent says on the bus (the
contract's `LifecycleState`: starting, ready, draining, exited) and what the controller itself
decides (`Decision`: drain it, drop one never placed, its start timed out, its agent was lost).
PENDING is "in fp_targets, not heard from yet"; GONE is "record removed" (no record holds it).

    PENDING --starting--> STARTING --ready--> RUNNING --draining / drain--> DRAINING --exited--> GONE
       |  \\____________ready____________/^       |                                          ^
       \\--- exited, start_timeout, drop (never placed), lost -----------------------------------/

Some pairs are legal no-ops (the state stays, nothing is counted): a replica's "starting" comes
twice by design (the agent's at spawn, the replica's own after its imports), a message may be
redelivered, and a replica the controller drained while it started still says "starting" or
"ready" afterwards. A pair missing from the table is refused: DeploymentState leaves the record
as it was and returns a `transition_refused` event, which the shell counts and logs rate-limited
(today that is a late "starting" after "ready": the agent's and the replica's messages are not
ordered with each other).
"""

from __future__ import annotations

import enum
from typing import Final

from shared.transitions import Machine
from shared.wire.messages import LifecycleState

from .records import ReplicaState


class Decision(enum.Enum):
    """Transitions the controller makes on its own (no message says them)."""

    DRAIN = "drain"
    """Scale down, replaced by a new version, or an unhealthy verdict: the replica drains."""
    DROP = "drop"
    """A replica never placed on an agent is no longer wanted: no process runs it, it goes."""
    START_TIMEOUT = "start_timeout"
    LOST = "lost"
    """Its agent is gone (or the process is known dead otherwise): the record goes."""


Event = LifecycleState | Decision

_P, _S, _R, _D, _G = (
    ReplicaState.PENDING,
    ReplicaState.STARTING,
    ReplicaState.RUNNING,
    ReplicaState.DRAINING,
    ReplicaState.GONE,
)
_L = LifecycleState

REPLICA_TABLE: Final[dict[tuple[ReplicaState, Event], ReplicaState]] = {
    # what the replica or its agent says
    (_P, _L.STARTING): _S,
    (_S, _L.STARTING): _S,  # said twice by design: the agent at spawn, the replica after imports
    (_D, _L.STARTING): _D,  # drained before its agent's spawn was heard of
    (_P, _L.READY): _R,  # its "starting" was lost or is late
    (_S, _L.READY): _R,
    (_R, _L.READY): _R,  # redelivered
    (_D, _L.READY): _D,  # drained while it started: it stays drained
    (_P, _L.DRAINING): _D,
    (_S, _L.DRAINING): _D,
    (_R, _L.DRAINING): _D,
    (_D, _L.DRAINING): _D,  # the controller drained it first
    (_P, _L.EXITED): _G,
    (_S, _L.EXITED): _G,
    (_R, _L.EXITED): _G,
    (_D, _L.EXITED): _G,
    # what the controller decides
    (_P, Decision.DRAIN): _D,
    (_S, Decision.DRAIN): _D,
    (_R, Decision.DRAIN): _D,
    (_D, Decision.DRAIN): _D,  # a verdict on a replica already draining
    (_P, Decision.DROP): _G,
    (_P, Decision.START_TIMEOUT): _G,
    (_S, Decision.START_TIMEOUT): _G,
    (_P, Decision.LOST): _G,
    (_S, Decision.LOST): _G,
    (_R, Decision.LOST): _G,
    (_D, Decision.LOST): _G,
}

REPLICA_LIFECYCLE: Final[Machine[ReplicaState, Event]] = Machine(
    "controller_replica",
    tuple(ReplicaState),
    (*LifecycleState, *Decision),
    ReplicaState.PENDING,
    REPLICA_TABLE,
)

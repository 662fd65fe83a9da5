"""The replica process's own lifecycle: what runtime.py may announce, and when.

How it works: the process is NEW until `start()` runs, and from then on in one of the contract's
`LifecycleState`s, each announced on the bus (a `Lifecycle` message) the moment it is entered.
`PROCESS_LIFECYCLE` (shared.transitions) is the one table of (state, step) -> state:

    NEW --start--> STARTING --ready--> READY --drain--> DRAINING --stop--> EXITED
                       \\--drain--> DRAINING     (any state but EXITED) --stop--> EXITED

A step the table refuses changes nothing and announces nothing: the shell counts it and logs it
rate-limited. So "ready" never follows "draining" (a drain that came while the replica started),
"exited" goes out once however often `stop()` is called, and a second drain is a no-op.
"""

from __future__ import annotations

import enum
from typing import Final

from shared.transitions import Machine
from shared.wire.messages import LifecycleState


class Fresh(enum.Enum):
    NEW = "new"
    """Built, not started: nothing announced yet."""


ProcessState = Fresh | LifecycleState


class Step(enum.Enum):
    START = "start"
    READY = "ready"
    DRAIN = "drain"
    STOP = "stop"


_L = LifecycleState

PROCESS_TABLE: Final[dict[tuple[ProcessState, Step], ProcessState]] = {
    (Fresh.NEW, Step.START): _L.STARTING,
    (_L.STARTING, Step.READY): _L.READY,
    (_L.STARTING, Step.DRAIN): _L.DRAINING,  # "ready" is then refused: it never follows
    (_L.READY, Step.DRAIN): _L.DRAINING,
    (Fresh.NEW, Step.STOP): _L.EXITED,
    (_L.STARTING, Step.STOP): _L.EXITED,  # start failed, or stopped before it was ready
    (_L.READY, Step.STOP): _L.EXITED,
    (_L.DRAINING, Step.STOP): _L.EXITED,
}

PROCESS_LIFECYCLE: Final[Machine[ProcessState, Step]] = Machine(
    "replica_process", (Fresh.NEW, *LifecycleState), tuple(Step), Fresh.NEW, PROCESS_TABLE
)

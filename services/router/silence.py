"""Liveness decisions, pure: a silent response reader's next step, and what a probe reply says.

How it works: a response reader that heard nothing on its request for `liveness_interval_s`
starts a `SilentRead` (none exists while messages flow, so the request path pays nothing for it)
and asks it `timed_out(now, mark)`, where `mark` is the replica's heard-counter (liveness.py)
now. The answer is a `Step`:
- `DEADLINE`: the request's deadline passed (the reader fails it);
- `ASK`: the `silent`-th silent interval is `ask_at` (`ASK_FIRST`, then 2x, 4x, ... the silence
  so far, at most `ASK_MAX_GAP` intervals apart): probe naming the request, unshared;
- `SPOKE`: the counter moved since the last look, the replica spoke on another request, so its
  connection is alive: no probe;
- `PROBE`: else ask whether the replica's connection is gone (a probe shared per replica).
The shell runs the probe and hands the outcome to `answered(lost, mark, interruptions)`, which
says `READ_ON`, `GONE` (read once more for `LOST_GRACE_S`, then the replica is lost) or
`INTERRUPTED` (our own connection dropped mid-request and `INTERRUPTED_PROBES` silent probes were
answered since: what the replica sent while we were away is gone). A message on the request ends
the silence: the reader drops its `SilentRead`.

`probe_reply(data, request_id)` reads a probe's answer: gone or not, the health to fold, or the
`WireError` to count. No clock, bus or logger here; time arrives as `now`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

from shared.errors import WireError
from shared.probes import NOT_HELD
from shared.wire import reasons
from shared.wire.codec import decode
from shared.wire.messages import ErrorReply, HealthStatus

LOST_GRACE_S: Final = 0.25
"""After a probe found the replica gone: how long a result already in flight may still arrive."""
INTERRUPTED_PROBES: Final = 3
"""Silent probes, each answered, after our connection dropped mid-request, before the request is
taken for lost: what the replica sent while we were away is gone for good (seen when a NATS node
was restarted during a rolling upgrade: the request waited for ever on a live replica)."""
ASK_FIRST: Final = 3
"""Silent intervals on one request before a probe asks the replica whether it still holds that
request: a reply lost after the replica's own connection (or a NATS route) dropped would
otherwise wait for ever, since the replica keeps answering for its other requests."""
ASK_MAX_GAP: Final = 30
"""Later asks come after twice the silence so far, at most this many intervals apart: a long
request costs its replica a few probes a minute, not one per interval."""


class Step(enum.Enum):
    """What a reader does after a silent interval."""

    DEADLINE = "deadline"
    ASK = "ask"
    SPOKE = "spoke"
    PROBE = "probe"


class After(enum.Enum):
    """What a reader does once the step's probe (if any) answered."""

    READ_ON = "read_on"
    GONE = "gone"
    INTERRUPTED = "interrupted"


class SilentRead:
    """One silent stretch of one request's response (see the module docstring)."""

    __slots__ = ("alive_but_silent", "ask_at", "deadline", "interruptions_seen", "seen", "silent")

    def __init__(self, *, deadline: float, seen: int, interruptions_seen: int) -> None:
        self.deadline = deadline
        self.seen = seen
        """The replica's heard-counter at the last look (only compared for change)."""
        self.interruptions_seen = interruptions_seen
        """Our connection's interruptions when the request last heard from its replica."""
        self.silent = 0
        self.ask_at = ASK_FIRST
        self.alive_but_silent = 0

    def timed_out(self, now: float, mark: int) -> Step:
        if now >= self.deadline:
            return Step.DEADLINE
        self.silent += 1
        if self.silent == self.ask_at:
            self.ask_at += min(self.ask_at, ASK_MAX_GAP)
            return Step.ASK
        return Step.SPOKE if mark != self.seen else Step.PROBE

    def answered(self, lost: bool, mark: int, interruptions: int) -> After:
        """`lost`: the probe found the replica gone, or not holding the request (False for
        `SPOKE`, which sent none)."""
        self.seen = mark
        if lost:
            return After.GONE
        if interruptions > self.interruptions_seen:
            self.alive_but_silent += 1
            if self.alive_but_silent >= INTERRUPTED_PROBES:
                return After.INTERRUPTED
        return After.READ_ON


@dataclass(frozen=True, slots=True)
class ProbeReply:
    """What one probe's answer says."""

    gone: bool
    """The replica is gone or, asked about a request, does not hold it."""
    health: HealthStatus | None = None
    """The replica's health, to fold into the carried health."""
    bad: WireError | None = None
    """The answer broke the protocol: count it and drop it (the replica is taken as alive)."""


ALIVE: Final = ProbeReply(False)
GONE: Final = ProbeReply(True)
"""Also the verdict on "no responders": nothing is subscribed to the probe subject."""


def probe_reply(data: bytes, request_id: str | None) -> ProbeReply:
    """Read the answer to a probe (naming `request_id`, or none)."""
    try:
        answer = decode(data)
        if isinstance(answer, ErrorReply) and answer.code == NOT_HELD:
            return GONE if request_id is not None else ALIVE
        if not isinstance(answer, HealthStatus):
            raise WireError(reasons.UNEXPECTED_KIND, f"{answer.KIND!r}, not a health message")
    except WireError as exc:
        return ProbeReply(False, bad=exc)
    return ProbeReply(False, health=answer)

"""A unary result riding on its admission: one message back instead of three.

How it works: a replica answers every admitted request with an admission, then the result as
chunk 0, then an end. For a call that finishes before the replica's loop turns (the common fast
handler) the three leave together anyway, so a router that says `accepts_inline_result` gets one
admission carrying the result instead (`Admission.inline_result`, docs/wire.md). The admission is
held, not skipped: the request's task schedules `due()` for the next turn of the loop, and
whichever comes first decides.

    WAITING --ride()--> RIDDEN    the result was ready first: it goes out on the admission
    WAITING --due()---> SENDING   the loop turned (the call awaits something): the admission is
                                  sent on its own, and the result follows as chunk 0 and end
    SENDING --sent()--> SENT      the admission left; chunks and frames may follow it

So a slow call's admission leaves one loop turn later than before (microseconds), never later
than any chunk, error or health frame of its stream: those wait for `sent` first.
"""

from __future__ import annotations

import enum

from shared.wire.messages import Admission, HealthStatus


class State(enum.Enum):
    WAITING = "waiting"
    RIDDEN = "ridden"
    SENDING = "sending"
    SENT = "sent"


class PendingAdmission:
    """An accepted admission not sent yet: its fields, so the message is built once, either
    with the result riding on it or on its own."""

    __slots__ = ("frames", "health", "models", "num_ongoing", "state")

    def __init__(
        self,
        num_ongoing: int,
        health: HealthStatus,
        frames: bool,
        models: tuple[str, ...] | None,
    ) -> None:
        self.num_ongoing = num_ongoing
        self.health = health
        self.frames = frames
        self.models = models
        self.state = State.WAITING

    @property
    def admission(self) -> Admission:
        """The admission on its own (`due`: the result follows as chunk 0 and end)."""
        return Admission(True, self.num_ongoing, self.health, self.frames, self.models)

    def ride(self, result: bytes) -> Admission | None:
        """The admission with `result` on it if it has not left yet (send it and nothing more);
        None when it left or is leaving (send the result as chunk 0 and end)."""
        if self.state is not State.WAITING:
            return None
        self.state = State.RIDDEN
        return Admission(True, self.num_ongoing, self.health, self.frames, self.models, result)

    def due(self) -> bool:
        """The admission must leave now on its own; False when it left or rode already."""
        if self.state is not State.WAITING:
            return False
        self.state = State.SENDING
        return True

    def sent(self) -> None:
        self.state = State.SENT

    @property
    def gone(self) -> bool:
        """Nothing may follow on the stream before this is true (frames, chunks, errors)."""
        return self.state is State.SENT or self.state is State.RIDDEN

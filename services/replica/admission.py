"""Admission control: at most `max_ongoing_requests` at once, nothing new while draining.

One counter for every carrier: requests over NATS (runtime.py) and HTTP requests and WebSockets
the replica serves itself (http_server.py) take and release the same slots. An HTTP request that
reaches a draining replica is still run, within the limit (`while_draining`): its server takes no
new connections by then, so only requests already on their way arrive."""

from __future__ import annotations


class Admission:
    __slots__ = ("draining", "max_ongoing", "ongoing")

    def __init__(self, max_ongoing: int) -> None:
        if max_ongoing < 1:
            raise ValueError("max_ongoing_requests must be at least 1")
        self.max_ongoing = max_ongoing
        self.ongoing = 0
        self.draining = False

    def try_admit(self, *, while_draining: bool = False) -> bool:
        """`while_draining`: a request the replica runs even while draining, within the limit
        (an HTTP request already on a connection its server is closing)."""
        if (self.draining and not while_draining) or self.ongoing >= self.max_ongoing:
            return False
        self.ongoing += 1
        return True

    def release(self) -> None:
        if self.ongoing <= 0:
            raise RuntimeError("release() without a matching admit")
        self.ongoing -= 1

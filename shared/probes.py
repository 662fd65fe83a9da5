"""The replica side of a liveness probe that names a request (docs/wire.md, "Probes").

A router whose reader has heard nothing on one request asks the replica whether it still holds
it (`services/router/liveness.py`); the replica answers with `not_held` when it does not. Both
sides need the code, so it lives here.
"""

from __future__ import annotations

from collections.abc import Container

from shared.wire.codec import decode_as
from shared.wire.messages import ErrorReply, ProbeRequest

NOT_HELD = "not_held"
"""`ErrorReply.code` of a probe naming a request the replica does not hold (docs/wire.md)."""


def not_held(probe: bytes, held: Container[str]) -> ErrorReply | None:
    """A replica's answer to a probe that names a request not in `held`; None: answer with
    health. An empty payload is a plain probe (the controller's). Raises WireError when the
    payload is neither empty nor a `probe` message."""
    if not probe:
        return None
    request_id = decode_as(probe, ProbeRequest).request_id
    if request_id is None or request_id in held:
        return None
    return ErrorReply(NOT_HELD, f"request {request_id} is not running here", True)

"""HTTP-style calls through a router, shared by the gateway (NATS callers) and the HTTP proxy.

Both front ends send an `HttpRequest` (body kind "http", docs/dataplane.md) and turn what comes
back, or what went wrong, into an HTTP-like status:

- `send_http` sends the request and returns the response reader once a replica admitted it;
  `read_head` reads chunk 0, the `HttpResponse` head (for a unary result it holds the whole body;
  for a generator, status and headers, with later chunks carrying raw body bytes). The caller
  reads the rest from the reader. Two steps, so that a caller can bound the wait for a replica
  apart from the time the user code takes.
- `call_http` is the unary form (the gateway's): chunk 0 only.
- `failure_of` maps every error these calls raise to an `HttpFailure` (status, a stable token,
  the message, retryable); the table is the one in docs/dataplane.md.
- `response_header_items` keeps the response headers that can be passed on safely.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from services.router.call import BAD_RESPONSE, ResponseReader, open_call
from services.router.errors import (
    BackPressureError,
    DeadlineExceeded,
    ReplicaLostError,
    RequestFailed,
    ResponseLostError,
    RouterClosedError,
    RouterError,
)
from services.router.router import Router
from shared.bus import MaxPayloadExceeded
from shared.errors import BusError, UsageError, WireError
from shared.multiplexing import model_id_from_headers
from shared.wire.codec import decode_as, encode
from shared.wire.messages import HttpRequest, HttpResponse

HDR_DEADLINE: Final = "Fp-Deadline-S"
HDR_ERROR: Final = "Fp-Error"
HDR_RETRYABLE: Final = "Fp-Retryable"

_HEADER_NAME_RE: Final = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")

# RequestFailed.code -> status
_REPLICA_STATUS: Final = {
    "bad_request": 400,
    "method_not_found": 404,
    "user_error": 500,
    "deadline_exceeded": 504,
    "replica_shutdown": 503,
    BAD_RESPONSE: 502,
}


@dataclass(frozen=True, slots=True)
class HttpFailure:
    """Why a call produced no response, as an HTTP-like status."""

    status: int
    token: str
    """Stable, machine-readable: `backpressure`, `deadline_exceeded`, `user_error`, ..."""
    message: str
    retryable: bool


def failure_of(exc: RouterError | WireError | BusError) -> HttpFailure:
    """The status of an error raised by the calls here (docs/dataplane.md)."""
    if isinstance(exc, RequestFailed):
        status = _REPLICA_STATUS.get(exc.code, 500)
        return HttpFailure(status, exc.code, exc.message or exc.code, exc.retryable)
    if isinstance(exc, BackPressureError):
        return HttpFailure(503, "backpressure", str(exc), True)
    if isinstance(exc, DeadlineExceeded):
        return HttpFailure(504, "deadline_exceeded", str(exc), False)
    if isinstance(exc, ReplicaLostError):
        return HttpFailure(502, "replica_lost", str(exc), True)
    if isinstance(exc, ResponseLostError):
        # the replica answered and the answer went astray: a bad gateway, not an unavailable
        # service; retryable like replica_lost (the message says the request ran)
        return HttpFailure(502, "response_lost", str(exc), True)
    if isinstance(exc, RouterClosedError):
        return HttpFailure(503, "shutting_down", str(exc), True)
    if isinstance(exc, RouterError):
        return HttpFailure(500, "router_error", str(exc), exc.retryable)
    if isinstance(exc, WireError):
        return HttpFailure(502, BAD_RESPONSE, f"bad HttpResponse: {exc}", False)
    if isinstance(exc, MaxPayloadExceeded):
        # retrying cannot help: the request does not fit in one NATS message
        return HttpFailure(413, "payload_too_large", str(exc), False)
    return HttpFailure(503, "bus_error", str(exc), True)


def parse_deadline(raw: str | None, default: float | None) -> float | None:
    """A deadline in seconds from the `Fp-Deadline-S` header (UsageError if it is not one)."""
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"{HDR_DEADLINE}: not a number: {raw!r}") from None
    if not 0 < value < float("inf"):
        raise UsageError(f"{HDR_DEADLINE}: must be a positive number of seconds, not {raw!r}")
    return value


def valid_header(name: str, value: str) -> bool:
    """A header that can be passed on without breaking (or injecting into) the message."""
    return bool(_HEADER_NAME_RE.match(name)) and "\r" not in value and "\n" not in value


def response_header_items(response: HttpResponse) -> list[tuple[str, str]]:
    """The response's headers that are safe to pass on, in order, repeats kept."""
    return [(name, value) for name, value in response.headers if valid_header(name, value)]


async def send_http(
    router: Router,
    request: HttpRequest,
    *,
    method: str,
    deadline_s: float | None,
    stream: bool,
) -> ResponseReader:
    """Send `request` and return its reader once a replica admitted it (waiting in the router's
    queue while none can). Raises RouterError or BusError."""
    return await open_call(
        router,
        method=method,
        body=encode(request),
        body_kind="http",
        stream=stream,
        deadline_s=deadline_s,
        # the serve_multiplexed_model_id header: routed to a replica holding that model
        model_id=model_id_from_headers(request.headers),
    )


async def read_head(reader: ResponseReader) -> HttpResponse:
    """Chunk 0, the response head (the whole response when unary). The reader is closed when
    this raises (RouterError, WireError for a broken head)."""
    try:
        chunk = await reader.next_chunk()
        if chunk is None:
            raise RequestFailed(BAD_RESPONSE, "the response ended without a result", False)
        return decode_as(chunk.data, HttpResponse)
    except BaseException as exc:
        reader.failed(exc)
        await reader.close()
        raise


async def call_http(
    router: Router, request: HttpRequest, *, method: str, deadline_s: float | None
) -> HttpResponse:
    """A unary HTTP-style call: the response in chunk 0."""
    reader = await send_http(router, request, method=method, deadline_s=deadline_s, stream=False)
    response = await read_head(reader)
    await reader.close()
    return response

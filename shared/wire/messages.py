"""Wire message types: what crosses the bus, as frozen dataclasses.

These are wire types, kept apart from domain types: the codec (`shared.wire.codec`) validates a
msgpack map and builds one of these, and code past the decoder trusts it. Constructing one in
process does no validation (that would cost on the request path); the receiving decoder is the
gate. On the wire each is a msgpack map with "v": 1 and "kind": `KIND`; field names on the wire
are the attribute names below. A nested `HealthStatus` is a plain map of its four fields (no "v"
or "kind" needed). docs/wire.md and schemas/v1/<kind>.schema.json are the language-neutral form.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final


class LifecycleState(enum.StrEnum):
    """What a `Lifecycle` message says, in the order a replica passes through the states. On the
    wire (and in `Lifecycle.state`) each is its plain string value."""

    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    EXITED = "exited"


LIFECYCLE_STATES: Final = tuple(s.value for s in LifecycleState)
"""Legal values of `Lifecycle.state`, in the order a replica passes through them."""

BODY_KINDS: Final = ("args", "http")
"""Legal values of `Request.body_kind`: msgpack `CallArgs`, or an encoded `HttpRequest`."""


@dataclass(frozen=True, slots=True)
class HealthStatus:
    """Result of a replica's own health check. `checked_at` is the replica's wall clock (unix s):
    receivers order entries by it but judge freshness by their own receipt time."""

    KIND: ClassVar[str] = "health"
    replica_id: str
    healthy: bool
    checked_at: float
    consecutive_failures: int


@dataclass(frozen=True, slots=True)
class Request:
    """RequestMeta plus body, router -> replica on `fp.v1.rpc.{app}.{deployment}.{replica}`.

    `body` is `encode(CallArgs(...))` when `body_kind` is "args", `encode(HttpRequest(...))` when
    it is "http"; the replica decodes it only after admission. `deadline` is unix seconds.
    """

    KIND: ClassVar[str] = "request"
    request_id: str
    method: str
    supports_health_frames: bool
    stream: bool
    deadline: float | None
    body: bytes
    body_kind: str
    multiplexed_model_id: str | None = None
    """Optional (added after v1, left out of the bytes when None): the model the request is for
    (`handle.options(multiplexed_model_id=...)`, or the `serve_multiplexed_model_id` HTTP
    header); user code reads it with `serve.get_multiplexed_model_id()`. None: no model."""
    accepts_inline_result: bool = False
    """Optional (added after v1, left out of the bytes when False): the router takes a unary
    result riding on the admission (`Admission.inline_result`) in place of admission, chunk 0
    and end: one message back instead of three for a call that finishes before the replica's
    loop turns. False: the replica always sends the three."""


@dataclass(frozen=True, slots=True)
class CallArgs:
    """Positional and keyword arguments of a call. Values are any msgpack values; arrays decode
    as lists (the top-level `args` as a tuple), bin as bytes, str as str."""

    KIND: ClassVar[str] = "args"
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """An HTTP request forwarded by the proxy. Headers keep order and repeats."""

    KIND: ClassVar[str] = "http_request"
    method: str
    path: str
    query: str
    headers: tuple[tuple[str, str], ...]
    body: bytes


@dataclass(frozen=True, slots=True)
class HttpResponse:
    """The reply to an `HttpRequest`, carried in `Chunk` data."""

    KIND: ClassVar[str] = "http_response"
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    more: bool = False
    """Optional (added after v1, left out of the bytes when False): the body goes on in later
    chunks (a streamed response), so a proxy starts sending at once instead of waiting to see
    whether the stream ends here. False or absent: read on to find out (older replicas)."""


@dataclass(frozen=True, slots=True)
class Admission:
    """First message of every response stream. A rejected admission ends the stream.

    `will_send_health_frames` answers the request's `supports_health_frames` and is binding for
    that request; `health` rides along so routers can fold it into their handle reports.
    """

    KIND: ClassVar[str] = "admission"
    accepted: bool
    num_ongoing: int
    health: HealthStatus
    will_send_health_frames: bool
    models: tuple[str, ...] | None = None
    """Optional (added after v1, left out of the bytes when None): the multiplexed models of the
    replica's admitted requests in flight (each loads its model there), then those it holds or
    is loading, newest first (at most `MAX_MODELS`), so routers send a model's requests where it
    is loaded. None: the deployment multiplexes no models."""
    inline_result: bytes | None = None
    """Optional (added after v1, left out of the bytes when None): the whole unary result, chunk
    0's data, when the request `accepts_inline_result` and the call finished before the
    admission left; nothing follows it on the stream. Only on an accepted admission."""


MAX_MODELS: Final = 1024
"""Most model ids one `Admission.models` may list (a replica holding more lists its newest)."""


@dataclass(frozen=True, slots=True)
class HealthFrame:
    """Health pushed on an open response stream while a request is held long."""

    KIND: ClassVar[str] = "health_frame"
    health: HealthStatus


@dataclass(frozen=True, slots=True)
class Chunk:
    """One piece of the result; `seq` counts from 0 within a response stream."""

    KIND: ClassVar[str] = "chunk"
    seq: int
    data: bytes


@dataclass(frozen=True, slots=True)
class End:
    """Normal end of a response stream.

    `chunks` (optional, added after v1, left out of the bytes when None): how many chunks the
    replica sent before it. A reader that got fewer knows the missing ones were lost in transit
    (a NATS node restarted between them) instead of taking a short response for a whole one.
    None: the sender does not say (an older replica)."""

    KIND: ClassVar[str] = "end"
    chunks: int | None = None


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """Abnormal end of a response stream. `retryable` says the caller may try another replica."""

    KIND: ClassVar[str] = "error"
    code: str
    message: str
    retryable: bool


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    """A replica's own metrics on `fp.v1.report.replica.{app}.{deployment}.{replica}`.

    `running_requests` is a window average, hence a float. `health` is the preferred health
    channel; None when the replica has nothing new to say.
    """

    KIND: ClassVar[str] = "replica_report"
    replica_id: str
    sent_at: float
    seq: int
    running_requests: float
    custom: dict[str, float]
    health: HealthStatus | None = None


@dataclass(frozen=True, slots=True)
class RequestStats:
    """A router's request counters for one deployment, cumulative since the router started.

    Optional in `HandleReport` (absent from routers that predate it; old readers ignore it). It
    is what the what-if queueing model calibrates from (docs/recording.md): arrivals per report
    interval, and the service time (dispatch of the admitted attempt to the end of its response)
    of completed requests with its second moment. Counters only grow, so a lost report costs
    resolution, not totals. On the wire it is a map with its own "v": `VERSION`; a reader skips
    a map of another version.
    """

    VERSION: ClassVar[int] = 1
    arrived: int
    """Requests that entered this router (each call once, whatever its retries)."""
    completed: int
    service_s: float
    """Sum of the service times of completed requests."""
    service_sq_s2: float
    """Sum of their squares (the spread of service times)."""
    wait_s: float
    """Sum of the time completed requests spent before their admitted attempt (queue, retries)."""
    rejected: int
    """Refused by back-pressure (`max_queued_requests`)."""
    timed_out: int
    """Deadline exceeded, queued or in service."""
    concurrency_sum: int
    """Sum over completed requests of the replica's requests in flight when it admitted them
    (itself included: `Admission.num_ongoing`), ..."""
    concurrency_sq_sum: int
    """... of its square ..."""
    concurrency_service_s: float
    """... and of it times the request's service time: with `completed`, `service_s` these are
    the sums of a least-squares fit of service time against concurrency."""


@dataclass(frozen=True, slots=True)
class HandleReport:
    """A router's view of one deployment, object path (narrow reports; wide ones go columnar).

    `running` maps replica_id to requests this handle has in flight there; `custom` maps a metric
    name to {replica_id: value}; `health` is what the router carried from admissions.
    """

    KIND: ClassVar[str] = "handle_report"
    handle_id: str
    app: str
    deployment: str
    sent_at: float
    seq: int
    queued_requests: float
    running: dict[str, float]
    health: tuple[HealthStatus, ...]
    membership_epoch: int
    custom: dict[str, dict[str, float]] = field(default_factory=dict)
    stats: RequestStats | None = None
    """Optional, see `RequestStats`; None: the sender does not count (or an older router)."""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Standalone health, sent only when no other channel carried it within the freshness window."""

    KIND: ClassVar[str] = "heartbeat"
    health: HealthStatus
    sent_at: float


@dataclass(frozen=True, slots=True)
class Lifecycle:
    """A replica process changed state. `exit_code` is set only for "exited" (negative = signal).

    The time from an agent's "starting" to the replica's "ready" is the replica's start time,
    which the what-if model reads from recordings."""

    KIND: ClassVar[str] = "lifecycle"
    replica_id: str
    agent_id: str
    state: str
    at: float
    rpc_subject: str
    version: str
    exit_code: int | None
    app: str
    deployment: str
    max_ongoing_requests: int | None = None
    """Optional: the replica's admission limit (sent by replicas on "ready"; None when unknown)."""
    http_address: str | None = None
    """Optional: "host:port" where the replica serves HTTP itself (sent on "ready" by replicas of
    an app's ingress deployment; None: it serves none). Rules: shared.wire.address."""


@dataclass(frozen=True, slots=True)
class ProbeRequest:
    """Pull health probe on `fp.v1.probe.{replica}`; the reply is a `HealthStatus` message.

    With `request_id` (optional, left out of the bytes when None) a router asks about one
    request it waits on: a replica that does not hold that request any more replies with an
    `ErrorReply` `not_held` instead, so a reply lost on the way reads as lost, not as slow."""

    KIND: ClassVar[str] = "probe"
    sent_at: float
    request_id: str | None = None


WireMessage = (
    HealthStatus
    | Request
    | CallArgs
    | HttpRequest
    | HttpResponse
    | Admission
    | HealthFrame
    | Chunk
    | End
    | ErrorReply
    | ReplicaReport
    | HandleReport
    | Heartbeat
    | Lifecycle
    | ProbeRequest
)
"""Any message `decode` can return."""

MESSAGE_TYPES: Final[tuple[type[WireMessage], ...]] = (
    HealthStatus,
    Request,
    CallArgs,
    HttpRequest,
    HttpResponse,
    Admission,
    HealthFrame,
    Chunk,
    End,
    ErrorReply,
    ReplicaReport,
    HandleReport,
    Heartbeat,
    Lifecycle,
    ProbeRequest,
)

KINDS: Final[dict[str, type[WireMessage]]] = {t.KIND: t for t in MESSAGE_TYPES}
"""Message class by wire kind."""

RESPONSE_STREAM_TYPES: Final = (Admission, HealthFrame, Chunk, End, ErrorReply)
"""Messages a replica sends on a request's reply inbox (Admission first, End/ErrorReply last)."""

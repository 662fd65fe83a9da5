"""msgpack codec for every wire message.

How it works: `encode` looks up a per-type function that builds the wire map directly (no
reflection per call) and packs it with msgpack. `decode` first refuses anything larger than
MAX_MESSAGE_BYTES, then unpacks with every declared length bounded by the payload size, so a
header claiming 4 GiB of string fails fast instead of allocating. It checks "v" and "kind" and
hands the map to a per-kind decoder that reads each field with a strict type check (see
`_fields`). Unknown fields are ignored; missing or ill-typed ones raise `WireError`. Nothing but
`WireError` escapes a decoder.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar, cast

import msgpack

from shared.errors import UsageError, WireError
from shared.wire import _fields as f
from shared.wire import reasons, uservalues
from shared.wire.address import http_address_problem
from shared.wire.limits import MAX_CONTAINERS, MAX_MESSAGE_BYTES, WIRE_VERSION
from shared.wire.messages import (
    BODY_KINDS,
    LIFECYCLE_STATES,
    MAX_MODELS,
    Admission,
    CallArgs,
    Chunk,
    End,
    ErrorReply,
    HandleReport,
    HealthFrame,
    HealthStatus,
    Heartbeat,
    HttpRequest,
    HttpResponse,
    Lifecycle,
    ProbeRequest,
    ReplicaReport,
    Request,
    RequestStats,
    WireMessage,
)

M = TypeVar("M", bound=WireMessage)
Map = dict[str, Any]

HTTP_STATUS_MIN = 100
HTTP_STATUS_MAX = 599
_V = WIRE_VERSION


# ---------------------------------------------------------------------------------------------
# encode


def _health_map(h: HealthStatus) -> Map:
    return {
        "replica_id": h.replica_id,
        "healthy": h.healthy,
        "checked_at": h.checked_at,
        "consecutive_failures": h.consecutive_failures,
    }


def _e_health(m: HealthStatus) -> Map:
    d = {"v": _V, "kind": "health"}
    d.update(_health_map(m))
    return d


def _e_request(m: Request) -> Map:
    return _request_map(
        m.request_id, m.method, m.supports_health_frames, m.stream, m.deadline, m.body,
        m.body_kind, m.multiplexed_model_id, m.accepts_inline_result,
    )  # fmt: skip


def _request_map(
    request_id: str,
    method: str,
    supports_health_frames: bool,
    stream: bool,
    deadline: float | None,
    body: bytes,
    body_kind: str,
    multiplexed_model_id: str | None,
    accepts_inline_result: bool,
) -> Map:
    out: Map = {
        "v": _V,
        "kind": "request",
        "request_id": request_id,
        "method": method,
        "supports_health_frames": supports_health_frames,
        "stream": stream,
        "deadline": deadline,
        "body": body,
        "body_kind": body_kind,
    }
    if multiplexed_model_id is not None:  # optional: absent keeps older readers as they were
        out["multiplexed_model_id"] = multiplexed_model_id
    if accepts_inline_result:  # optional: absent is False
        out["accepts_inline_result"] = True
    return out


def _e_args(m: CallArgs) -> Map:
    return {"v": _V, "kind": "args", "args": m.args, "kwargs": m.kwargs}


def _e_http_request(m: HttpRequest) -> Map:
    return {
        "v": _V,
        "kind": "http_request",
        "method": m.method,
        "path": m.path,
        "query": m.query,
        "headers": m.headers,
        "body": m.body,
    }


def _e_http_response(m: HttpResponse) -> Map:
    out: Map = {
        "v": _V,
        "kind": "http_response",
        "status": m.status,
        "headers": m.headers,
        "body": m.body,
    }
    if m.more:  # optional: absent is False
        out["more"] = True
    return out


def _e_admission(m: Admission) -> Map:
    out: Map = {
        "v": _V,
        "kind": "admission",
        "accepted": m.accepted,
        "num_ongoing": m.num_ongoing,
        "health": _health_map(m.health),
        "will_send_health_frames": m.will_send_health_frames,
    }
    if m.models is not None:  # optional: only multiplexing replicas send it
        out["models"] = m.models
    if m.inline_result is not None:  # optional: a unary result riding on the admission
        out["inline_result"] = m.inline_result
    return out


def _e_health_frame(m: HealthFrame) -> Map:
    return {"v": _V, "kind": "health_frame", "health": _health_map(m.health)}


def _e_chunk(m: Chunk) -> Map:
    return {"v": _V, "kind": "chunk", "seq": m.seq, "data": m.data}


def _e_end(m: End) -> Map:
    if m.chunks is None:
        return {"v": _V, "kind": "end"}
    return {"v": _V, "kind": "end", "chunks": m.chunks}


def _e_error(m: ErrorReply) -> Map:
    return {
        "v": _V,
        "kind": "error",
        "code": m.code,
        "message": m.message,
        "retryable": m.retryable,
    }


def _e_replica_report(m: ReplicaReport) -> Map:
    return {
        "v": _V,
        "kind": "replica_report",
        "replica_id": m.replica_id,
        "sent_at": m.sent_at,
        "seq": m.seq,
        "running_requests": m.running_requests,
        "custom": m.custom,
        "health": None if m.health is None else _health_map(m.health),
    }


def stats_map(s: RequestStats) -> Map:
    """The wire map of `HandleReport.stats` (msgpack, and JSON in columnar metadata)."""
    return {
        "v": RequestStats.VERSION,
        "arrived": s.arrived,
        "completed": s.completed,
        "service_s": s.service_s,
        "service_sq_s2": s.service_sq_s2,
        "wait_s": s.wait_s,
        "rejected": s.rejected,
        "timed_out": s.timed_out,
        "concurrency_sum": s.concurrency_sum,
        "concurrency_sq_sum": s.concurrency_sq_sum,
        "concurrency_service_s": s.concurrency_service_s,
    }


def _e_handle_report(m: HandleReport) -> Map:
    out: Map = {
        "v": _V,
        "kind": "handle_report",
        "handle_id": m.handle_id,
        "app": m.app,
        "deployment": m.deployment,
        "sent_at": m.sent_at,
        "seq": m.seq,
        "queued_requests": m.queued_requests,
        "running": m.running,
        "health": [_health_map(h) for h in m.health],
        "membership_epoch": m.membership_epoch,
        "custom": m.custom,
    }
    if m.stats is not None:  # optional: absent keeps older vectors and readers as they were
        out["stats"] = stats_map(m.stats)
    return out


def _e_heartbeat(m: Heartbeat) -> Map:
    return {"v": _V, "kind": "heartbeat", "health": _health_map(m.health), "sent_at": m.sent_at}


def _e_lifecycle(m: Lifecycle) -> Map:
    out: Map = {
        "v": _V,
        "kind": "lifecycle",
        "replica_id": m.replica_id,
        "agent_id": m.agent_id,
        "state": m.state,
        "at": m.at,
        "rpc_subject": m.rpc_subject,
        "version": m.version,
        "exit_code": m.exit_code,
        "app": m.app,
        "deployment": m.deployment,
    }
    if m.max_ongoing_requests is not None:
        out["max_ongoing_requests"] = m.max_ongoing_requests
    if m.http_address is not None:
        out["http_address"] = m.http_address
    return out


def _e_probe(m: ProbeRequest) -> Map:
    out: Map = {"v": _V, "kind": "probe", "sent_at": m.sent_at}
    if m.request_id is not None:
        out["request_id"] = m.request_id
    return out


_ENCODERS: dict[type, Callable[[Any], Map]] = {
    HealthStatus: _e_health,
    Request: _e_request,
    CallArgs: _e_args,
    HttpRequest: _e_http_request,
    HttpResponse: _e_http_response,
    Admission: _e_admission,
    HealthFrame: _e_health_frame,
    Chunk: _e_chunk,
    End: _e_end,
    ErrorReply: _e_error,
    ReplicaReport: _e_replica_report,
    HandleReport: _e_handle_report,
    Heartbeat: _e_heartbeat,
    Lifecycle: _e_lifecycle,
    ProbeRequest: _e_probe,
}


def to_wire_map(msg: WireMessage) -> Map:
    """The msgpack map `encode` would pack (shares containers with `msg`; do not mutate)."""
    try:
        enc = _ENCODERS[type(msg)]
    except KeyError:
        raise UsageError(f"not a wire message: {type(msg).__name__}") from None
    return enc(msg)


def encode(msg: WireMessage) -> bytes:
    """Encode one message. Raises `UsageError` (local misuse, not a peer's fault) when a value
    is not msgpack-serialisable or the result exceeds MAX_MESSAGE_BYTES."""
    return _packed(to_wire_map(msg), msg.KIND)


def _packed(wire: Map, kind: str) -> bytes:
    try:
        data = uservalues.pack(wire)  # the same options, a packer kept per thread
    except (TypeError, ValueError, OverflowError) as exc:
        raise UsageError(f"cannot encode {kind} message: {exc}") from exc
    if len(data) > MAX_MESSAGE_BYTES:
        raise UsageError(
            f"{kind} message is {len(data)} bytes, over MAX_MESSAGE_BYTES={MAX_MESSAGE_BYTES}"
        )
    return data


def encode_request(
    request_id: str,
    method: str,
    supports_health_frames: bool,
    stream: bool,
    deadline: float | None,
    body: bytes,
    body_kind: str,
    multiplexed_model_id: str | None = None,
    accepts_inline_result: bool = False,
) -> bytes:
    """`encode(Request(...))`, the same bytes, without building the message first (a router
    sends one per call and never reads it back: the frozen dataclass was half the encode)."""
    wire = _request_map(
        request_id, method, supports_health_frames, stream, deadline, body, body_kind,
        multiplexed_model_id, accepts_inline_result,
    )  # fmt: skip
    return _packed(wire, Request.KIND)


# ---------------------------------------------------------------------------------------------
# decode


def _health(raw: object, where: str) -> HealthStatus:
    if type(raw) is not dict:
        f.wrong_type(where, "health", "map", raw)
    return _d_health(raw, f"{where}.health")


def _health_entries(raw: list[Any], where: str) -> tuple[HealthStatus, ...]:
    """A list of health maps. The usual entry is checked inline; any other goes through
    `_health`, which accepts it as before or raises with its position (a report carries one
    entry per replica, and building each entry's label up front was a tenth of its decode)."""
    out = []
    for m in raw:
        if type(m) is dict:
            rid, ok, at, n = (
                m.get("replica_id"), m.get("healthy"), m.get("checked_at"),
                m.get("consecutive_failures"),
            )  # fmt: skip
            if (
                type(rid) is str and type(ok) is bool and type(at) is float and math.isfinite(at)
                and type(n) is int and n >= 0
            ):  # fmt: skip
                out.append(HealthStatus(rid, ok, at, n))
                continue
        out.append(_health(m, f"{where}[{len(out)}]"))
    return tuple(out)


def _d_health(m: Map, where: str = "health") -> HealthStatus:
    return HealthStatus(
        replica_id=f.get_str(m, "replica_id", where),
        healthy=f.get_bool(m, "healthy", where),
        checked_at=f.get_float(m, "checked_at", where),
        consecutive_failures=f.get_count(m, "consecutive_failures", where),
    )


def _d_request(m: Map) -> Request:
    # the usual request, checked inline (one per call on the request path); anything else,
    # including every error, takes the field readers below
    rid, method, frames, stream, deadline, body, kind = (
        m.get("request_id"), m.get("method"), m.get("supports_health_frames"), m.get("stream"),
        m.get("deadline"), m.get("body"), m.get("body_kind"),
    )  # fmt: skip
    inline = m.get("accepts_inline_result", False)
    if (
        type(rid) is str and type(method) is str and type(frames) is bool
        and type(stream) is bool and type(body) is bytes and type(kind) is str
        and kind in BODY_KINDS and type(inline) is bool and m.get("multiplexed_model_id") is None
        and (deadline is None or (type(deadline) is float and math.isfinite(deadline)))
    ):  # fmt: skip
        return Request(rid, method, frames, stream, deadline, body, kind, None, inline)
    return _d_request_checked(m)


def _d_request_checked(m: Map) -> Request:
    w = "request"
    return Request(
        request_id=f.get_str(m, "request_id", w),
        method=f.get_str(m, "method", w),
        supports_health_frames=f.get_bool(m, "supports_health_frames", w),
        stream=f.get_bool(m, "stream", w),
        deadline=f.get_opt_float(m, "deadline", w),
        body=f.get_bytes(m, "body", w),
        body_kind=f.get_choice(m, "body_kind", w, BODY_KINDS),
        multiplexed_model_id=_opt_model_id(m, "multiplexed_model_id", w),
        accepts_inline_result=_opt_bool(m, "accepts_inline_result", w),
    )


def _opt_bool(m: Map, key: str, w: str) -> bool:
    return False if m.get(key) is None else f.get_bool(m, key, w)


def _opt_model_id(m: Map, key: str, w: str) -> str | None:
    v = m.get(key)
    if v is None:
        return None
    if type(v) is not str:
        f.wrong_type(w, key, "str or nil", v)
    if not v:
        f.fail(reasons.BAD_VALUE, w, key, "a model id is not empty")
    return v


def _opt_models(m: Map, w: str) -> tuple[str, ...] | None:
    raw = m.get("models")
    if raw is None:
        return None
    if type(raw) is not list:
        f.wrong_type(w, "models", "list of str or nil", raw)
    if len(raw) > MAX_MODELS:
        f.fail(reasons.BAD_VALUE, w, "models", f"{len(raw)} ids, at most {MAX_MODELS}")
    for v in raw:
        if type(v) is not str or not v:
            f.wrong_type(w, "models", "non-empty str items", v)
    return tuple(raw)


def _d_args(m: Map) -> CallArgs:
    args, kwargs = m.get("args"), m.get("kwargs")
    if type(args) is list and type(kwargs) is dict and not kwargs:  # positional only: checked
        return CallArgs(args=tuple(args), kwargs=kwargs)
    return _d_args_checked(m)


def _d_args_checked(m: Map) -> CallArgs:
    args = f.get_list(m, "args", "args")
    kwargs = f.get_map(m, "kwargs", "args")
    for k in kwargs:
        if type(k) is not str:
            f.wrong_type("args", "kwargs", "str keys", k)
    return CallArgs(args=tuple(args), kwargs=kwargs)


def _d_http_request(m: Map) -> HttpRequest:
    w = "http_request"
    return HttpRequest(
        method=f.get_str(m, "method", w),
        path=f.get_str(m, "path", w),
        query=f.get_str(m, "query", w),
        headers=f.get_headers(m, "headers", w),
        body=f.get_bytes(m, "body", w),
    )


def _d_http_response(m: Map) -> HttpResponse:
    w = "http_response"
    status = f.get_int(m, "status", w)
    if not HTTP_STATUS_MIN <= status <= HTTP_STATUS_MAX:
        f.fail(reasons.BAD_VALUE, w, "status", f"{status} is not an HTTP status")
    return HttpResponse(
        status=status,
        headers=f.get_headers(m, "headers", w),
        body=f.get_bytes(m, "body", w),
        more=_opt_bool(m, "more", w),
    )


def _d_admission(m: Map) -> Admission:
    # the usual admission, checked inline (one per call); anything else takes the readers below
    accepted, n, health, frames = (
        m.get("accepted"),
        m.get("num_ongoing"),
        m.get("health"),
        m.get("will_send_health_frames"),
    )
    if (
        type(accepted) is bool and type(n) is int and n >= 0 and type(frames) is bool
        and type(health) is dict and m.get("models") is None
    ):  # fmt: skip
        rid, ok, at, fails = (
            health.get("replica_id"), health.get("healthy"), health.get("checked_at"),
            health.get("consecutive_failures"),
        )  # fmt: skip
        result = m.get("inline_result")
        if (
            type(rid) is str and type(ok) is bool and type(at) is float and math.isfinite(at)
            and type(fails) is int and fails >= 0
            and (result is None or (accepted and type(result) is bytes))
        ):  # fmt: skip
            status = HealthStatus(rid, ok, at, fails)
            return Admission(accepted, n, status, frames, None, result)
    return _d_admission_checked(m)


def _d_admission_checked(m: Map) -> Admission:
    w = "admission"
    return Admission(
        accepted=f.get_bool(m, "accepted", w),
        num_ongoing=f.get_count(m, "num_ongoing", w),
        health=_health(f.require(m, "health", w), w),
        will_send_health_frames=f.get_bool(m, "will_send_health_frames", w),
        models=_opt_models(m, w),
        inline_result=_inline_result(m, w),
    )


def _inline_result(m: Map, w: str) -> bytes | None:
    if m.get("inline_result") is None:
        return None
    if not f.get_bool(m, "accepted", w):
        f.fail(
            reasons.BAD_VALUE, w, "inline_result", "a result rides only on an accepted admission"
        )
    return f.get_bytes(m, "inline_result", w)


def _d_health_frame(m: Map) -> HealthFrame:
    return HealthFrame(health=_health(f.require(m, "health", "health_frame"), "health_frame"))


def _d_chunk(m: Map) -> Chunk:
    return Chunk(seq=f.get_count(m, "seq", "chunk"), data=f.get_bytes(m, "data", "chunk"))


def _d_end(m: Map) -> End:
    n = m.get("chunks")
    if type(n) is int and n >= 0:  # the usual value, checked inline: one per response
        return End(n)
    return End(None if n is None else f.get_count(m, "chunks", "end"))


def _d_error(m: Map) -> ErrorReply:
    return ErrorReply(
        code=f.get_str(m, "code", "error"),
        message=f.get_str(m, "message", "error"),
        retryable=f.get_bool(m, "retryable", "error"),
    )


def _d_replica_report(m: Map) -> ReplicaReport:
    w = "replica_report"
    raw_health = m.get("health")
    return ReplicaReport(
        replica_id=f.get_str(m, "replica_id", w),
        sent_at=f.get_float(m, "sent_at", w),
        seq=f.get_count(m, "seq", w),
        running_requests=f.get_nonneg_float(m, "running_requests", w),
        custom=f.get_custom(m, w),
        health=None if raw_health is None else _health(raw_health, w),
    )


def decode_stats(raw: object, w: str) -> RequestStats | None:
    """The optional `stats` map; None when absent or of a version this reader does not know.
    The one validator of both report formats."""
    if raw is None:
        return None
    if type(raw) is not dict:
        f.wrong_type(w, "stats", "map", raw)
    if raw.get("v") != RequestStats.VERSION:
        return None
    w = f"{w}.stats"
    return RequestStats(
        arrived=f.get_count(raw, "arrived", w),
        completed=f.get_count(raw, "completed", w),
        service_s=f.get_nonneg_float(raw, "service_s", w),
        service_sq_s2=f.get_nonneg_float(raw, "service_sq_s2", w),
        wait_s=f.get_nonneg_float(raw, "wait_s", w),
        rejected=f.get_count(raw, "rejected", w),
        timed_out=f.get_count(raw, "timed_out", w),
        concurrency_sum=f.get_count(raw, "concurrency_sum", w),
        concurrency_sq_sum=f.get_count(raw, "concurrency_sq_sum", w),
        concurrency_service_s=f.get_nonneg_float(raw, "concurrency_service_s", w),
    )


def _d_handle_report(m: Map) -> HandleReport:
    w = "handle_report"
    health = _health_entries(f.get_list(m, "health", w), f"{w}.health")
    raw_custom = m.get("custom")
    custom: dict[str, dict[str, float]] = {}
    if raw_custom is not None:
        if type(raw_custom) is not dict:
            f.wrong_type(w, "custom", "map", raw_custom)
        for name, per_replica in raw_custom.items():
            if type(name) is not str:
                f.wrong_type(w, "custom", "str keys", name)
            custom[name] = f.float_map(per_replica, w, f"custom[{name!r}]", nonneg=False)
        f.check_custom_names(custom, w)
    return HandleReport(
        handle_id=f.get_str(m, "handle_id", w),
        app=f.get_str(m, "app", w),
        deployment=f.get_str(m, "deployment", w),
        sent_at=f.get_float(m, "sent_at", w),
        seq=f.get_count(m, "seq", w),
        queued_requests=f.get_nonneg_float(m, "queued_requests", w),
        running=f.float_map(f.require(m, "running", w), w, "running", nonneg=True),
        health=health,
        membership_epoch=f.get_count(m, "membership_epoch", w),
        custom=custom,
        stats=decode_stats(m.get("stats"), w),
    )


def _d_heartbeat(m: Map) -> Heartbeat:
    w = "heartbeat"
    return Heartbeat(
        health=_health(f.require(m, "health", w), w), sent_at=f.get_float(m, "sent_at", w)
    )


def _d_lifecycle(m: Map) -> Lifecycle:
    w = "lifecycle"
    return Lifecycle(
        replica_id=f.get_str(m, "replica_id", w),
        agent_id=f.get_str(m, "agent_id", w),
        state=f.get_choice(m, "state", w, LIFECYCLE_STATES),
        at=f.get_float(m, "at", w),
        rpc_subject=f.get_str(m, "rpc_subject", w),
        version=f.get_str(m, "version", w),
        exit_code=f.get_opt_int(m, "exit_code", w),
        app=f.get_str(m, "app", w),
        deployment=f.get_str(m, "deployment", w),
        max_ongoing_requests=_opt_positive(m, "max_ongoing_requests", w),
        http_address=_opt_http_address(m, "http_address", w),
    )


def _opt_http_address(m: Map, key: str, w: str) -> str | None:
    v = m.get(key)
    if v is None:
        return None
    if type(v) is not str:
        f.wrong_type(w, key, "str or nil", v)
    problem = http_address_problem(v)
    if problem is not None:
        f.fail(reasons.BAD_VALUE, w, key, problem)
    return v


def _opt_positive(m: Map, key: str, w: str) -> int | None:
    v = f.get_opt_int(m, key, w)
    if v is not None and v < 1:
        f.fail(reasons.BAD_VALUE, w, key, f"must be >= 1, got {v}")
    return v


def _d_probe(m: Map) -> ProbeRequest:
    w = "probe"
    request_id = None if m.get("request_id") is None else f.get_str(m, "request_id", w)
    return ProbeRequest(sent_at=f.get_float(m, "sent_at", w), request_id=request_id)


_DECODERS: dict[str, Callable[[Map], WireMessage]] = {
    "health": _d_health,
    "request": _d_request,
    "args": _d_args,
    "http_request": _d_http_request,
    "http_response": _d_http_response,
    "admission": _d_admission,
    "health_frame": _d_health_frame,
    "chunk": _d_chunk,
    "end": _d_end,
    "error": _d_error,
    "replica_report": _d_replica_report,
    "handle_report": _d_handle_report,
    "heartbeat": _d_heartbeat,
    "lifecycle": _d_lifecycle,
    "probe": _d_probe,
}


def unpack_map(data: bytes) -> Map:
    """Bounded msgpack unpack of one top-level map (the first step of `decode`)."""
    if type(data) is bytes:  # the usual payload: its length is its size
        n = len(data)
    elif isinstance(data, bytes | bytearray | memoryview):
        n = memoryview(data).nbytes
    else:
        raise WireError(reasons.NOT_BYTES, f"payload is {type(data).__name__}, not bytes")
    if n > MAX_MESSAGE_BYTES:
        raise WireError(reasons.OVERSIZE, f"{n} bytes > MAX_MESSAGE_BYTES={MAX_MESSAGE_BYTES}")
    # every array or map takes at least one byte, so a payload no longer than the container
    # limit cannot exceed it: small messages (the request path) skip the per-container hook
    # msgpack >= 1.0 bounds every declared length by the payload's size on its own (its
    # unpackb defaults), and its defaults are raw=False, strict_map_key, use_list: spelled out,
    # they cost as much again as the unpack of a request
    try:
        # ext_hook: numpy arrays in user values (ext type 1); any other ext stays opaque
        if n <= MAX_CONTAINERS:
            obj = msgpack.unpackb(data, ext_hook=uservalues.EXT_HOOK)
        else:
            count = _container_counter()
            obj = msgpack.unpackb(
                data, ext_hook=uservalues.EXT_HOOK, list_hook=count, object_hook=count
            )
    except WireError:
        raise
    except Exception as exc:  # msgpack raises ValueError, its own subclasses, TypeError...
        text = str(exc)
        reason = reasons.TRUNCATED if "incomplete input" in text else reasons.MALFORMED
        raise WireError(reason, f"msgpack: {type(exc).__name__}: {text[:200]}") from None
    if type(obj) is not dict:
        raise WireError(reasons.NOT_A_MAP, f"top-level value is {type(obj).__name__}")
    return obj


def _container_counter() -> Callable[[Any], Any]:
    """A msgpack hook that raises past MAX_CONTAINERS arrays/maps (made only for payloads long
    enough to hold that many)."""
    containers = 0

    def count(obj: Any) -> Any:
        nonlocal containers
        containers += 1
        if containers > MAX_CONTAINERS:
            raise WireError(reasons.MALFORMED, f"more than {MAX_CONTAINERS} arrays/maps")
        return obj

    return count


def _kind(m: Map) -> str:
    v, kind = m.get("v"), m.get("kind")
    if type(v) is int and v == WIRE_VERSION and type(kind) is str and kind in _DECODERS:
        return kind  # the usual message; anything else is checked field by field below
    return _kind_checked(m)


def _kind_checked(m: Map) -> str:
    if "v" not in m:
        f.fail(reasons.MISSING_FIELD, "message", "v", "required field is missing")
    v = m["v"]
    if type(v) is not int or v != WIRE_VERSION:
        f.fail(reasons.UNSUPPORTED_VERSION, "message", "v", f"{v!r} (this side speaks 1)")
    kind = f.get_str(m, "kind", "message")
    if kind not in _DECODERS:
        f.fail(reasons.UNKNOWN_KIND, "message", "kind", repr(kind[:64]))
    return kind


def decode(data: bytes) -> WireMessage:
    """Decode any message. Raises only `WireError` (see `shared.wire.reasons`)."""
    m = unpack_map(data)
    return _DECODERS[_kind(m)](m)


def decode_as(data: bytes, cls: type[M]) -> M:
    """Decode a message that must be of type `cls`; another valid kind is "unexpected_kind"."""
    m = unpack_map(data)
    kind = _kind(m)
    if kind != cls.KIND:
        f.fail(reasons.UNEXPECTED_KIND, "message", "kind", f"{kind!r}, expected {cls.KIND!r}")
    return cast(M, _DECODERS[kind](m))


def decode_body(req: Request) -> CallArgs | HttpRequest:
    """Decode a request's body according to its `body_kind`."""
    if req.body_kind == "http":
        return decode_as(req.body, HttpRequest)
    return decode_as(req.body, CallArgs)

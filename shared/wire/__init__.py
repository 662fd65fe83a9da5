"""Wire contracts: message types, the msgpack codec and the Arrow-columnar handle report.

`schemas/v1` and docs/wire.md are the language-neutral form of what lives here. Message types and
the msgpack codec import eagerly; the Arrow parts (`columnar`, `arrow_schemas`) load on first use,
so a process that never touches Arrow (most replicas) does not pay for importing pyarrow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from shared.errors import WireError
from shared.wire.codec import decode, decode_as, decode_body, encode, to_wire_map
from shared.wire.limits import DEFAULT_MAX_PAYLOAD, MAX_MESSAGE_BYTES, WIRE_VERSION
from shared.wire.messages import (
    BODY_KINDS,
    KINDS,
    LIFECYCLE_STATES,
    MESSAGE_TYPES,
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

if TYPE_CHECKING:
    from shared.wire.arrow_schemas import (
        HANDLE_REPORT_FIXED_FIELDS,
        RECORDING_SCHEMA,
    )
    from shared.wire.columnar import (
        COLUMNAR_MAGIC,
        DEFAULT_COLUMNAR_MIN_REPLICAS,
        ColumnarHandleReport,
        columnar_parts_to_handle_report,
        columnar_to_handle_report,
        decode_handle_report_columnar,
        detect_format,
        encode_handle_report_columnar,
        handle_report_to_columnar,
    )

_LAZY = {
    "HANDLE_REPORT_FIXED_FIELDS": "shared.wire.arrow_schemas",
    "RECORDING_SCHEMA": "shared.wire.arrow_schemas",
    "COLUMNAR_MAGIC": "shared.wire.columnar",
    "DEFAULT_COLUMNAR_MIN_REPLICAS": "shared.wire.columnar",
    "ColumnarHandleReport": "shared.wire.columnar",
    "columnar_parts_to_handle_report": "shared.wire.columnar",
    "columnar_to_handle_report": "shared.wire.columnar",
    "decode_handle_report_columnar": "shared.wire.columnar",
    "detect_format": "shared.wire.columnar",
    "encode_handle_report_columnar": "shared.wire.columnar",
    "handle_report_to_columnar": "shared.wire.columnar",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shared.wire' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "BODY_KINDS",
    "COLUMNAR_MAGIC",
    "DEFAULT_COLUMNAR_MIN_REPLICAS",
    "DEFAULT_MAX_PAYLOAD",
    "HANDLE_REPORT_FIXED_FIELDS",
    "KINDS",
    "LIFECYCLE_STATES",
    "MAX_MESSAGE_BYTES",
    "MESSAGE_TYPES",
    "RECORDING_SCHEMA",
    "WIRE_VERSION",
    "Admission",
    "CallArgs",
    "Chunk",
    "ColumnarHandleReport",
    "End",
    "ErrorReply",
    "HandleReport",
    "HealthFrame",
    "HealthStatus",
    "Heartbeat",
    "HttpRequest",
    "HttpResponse",
    "Lifecycle",
    "ProbeRequest",
    "ReplicaReport",
    "Request",
    "RequestStats",
    "WireError",
    "WireMessage",
    "columnar_parts_to_handle_report",
    "columnar_to_handle_report",
    "decode",
    "decode_as",
    "decode_body",
    "decode_handle_report_columnar",
    "detect_format",
    "encode",
    "encode_handle_report_columnar",
    "handle_report_to_columnar",
    "to_wire_map",
]

"""JSON rendering of wire data, as used by the golden vectors in schemas/vectors.

A msgpack message renders as its wire map with every bin value replaced by
{"$bytes_b64": "<standard base64>"}; JSON has no bytes, and a one-key object with a `$` name
cannot clash with a field. A columnar part renders as its typed report-level fields, the raw
metadata strings, the column names and one JSON object per row. `message_from_json` goes back
through the validating decoder, so a JSON vector can never produce a message the wire would not.
"""

from __future__ import annotations

import base64
import math
from typing import TYPE_CHECKING, Any

import msgpack

from shared.errors import UsageError
from shared.wire.codec import decode, stats_map, to_wire_map
from shared.wire.messages import WireMessage

if TYPE_CHECKING:
    from shared.wire.columnar import ColumnarHandleReport

BYTES_KEY = "$bytes_b64"


def to_json_value(v: Any) -> Any:
    """msgpack-shaped data -> JSON-able data (bytes as {"$bytes_b64": ...}, tuples as lists)."""
    if isinstance(v, bytes | bytearray | memoryview):
        return {BYTES_KEY: base64.b64encode(bytes(v)).decode("ascii")}
    if isinstance(v, dict):
        return {k: to_json_value(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [to_json_value(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        raise UsageError(f"{v} has no JSON rendering")
    if v is None or isinstance(v, bool | int | float | str):
        return v
    raise UsageError(f"{type(v).__name__} has no JSON rendering")


def from_json_value(v: Any) -> Any:
    """Inverse of `to_json_value`."""
    if isinstance(v, dict):
        if len(v) == 1 and BYTES_KEY in v:
            return base64.b64decode(v[BYTES_KEY], validate=True)
        return {k: from_json_value(x) for k, x in v.items()}
    if isinstance(v, list):
        return [from_json_value(x) for x in v]
    return v


def message_to_json(msg: WireMessage) -> dict[str, Any]:
    out: dict[str, Any] = to_json_value(to_wire_map(msg))
    return out


def message_from_json(obj: dict[str, Any]) -> WireMessage:
    """Pack the JSON rendering as msgpack and decode it (raises WireError if it is invalid)."""
    return decode(msgpack.packb(from_json_value(obj), use_bin_type=True))


def columnar_to_json(c: ColumnarHandleReport, raw_metadata: dict[bytes, bytes]) -> dict[str, Any]:
    """A decoded FPC1 part plus the raw schema metadata it was decoded from."""
    return {
        "metadata": {
            "handle_id": c.handle_id,
            "app": c.app,
            "deployment": c.deployment,
            "sent_at": c.sent_at,
            "seq": c.seq,
            "queued_requests": c.queued_requests,
            "membership_epoch": c.membership_epoch,
            "part": c.part,
            "parts": c.parts,
            **({} if c.stats is None else {"stats": stats_map(c.stats)}),
        },
        "metadata_raw": {k.decode(): v.decode() for k, v in raw_metadata.items()},
        "columns": list(c.batch.schema.names),
        "rows": c.batch.to_pylist(),
    }

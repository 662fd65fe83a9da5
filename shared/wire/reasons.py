"""Stable `WireError.reason` tokens. Subscribers use them as metric labels, so never rename one.

docs/wire.md lists them with their meaning; golden invalid vectors pin which input yields which.
"""

from __future__ import annotations

from typing import Final

NOT_BYTES: Final = "not_bytes"
"""The payload handed to a decoder is not bytes-like."""
OVERSIZE: Final = "oversize"
"""The payload is larger than MAX_MESSAGE_BYTES."""
TRUNCATED: Final = "truncated"
"""The msgpack input ended in the middle of a value."""
MALFORMED: Final = "malformed"
"""Not parseable: bad msgpack, invalid UTF-8, trailing bytes, broken Arrow IPC."""
NOT_A_MAP: Final = "not_a_map"
"""The top-level msgpack value is not a map."""
UNSUPPORTED_VERSION: Final = "unsupported_version"
"""The "v" field is present but is not 1."""
UNKNOWN_KIND: Final = "unknown_kind"
"""The "kind" field names no message type this version knows."""
UNEXPECTED_KIND: Final = "unexpected_kind"
"""A valid message of another kind than the one the receiver expects on this subject."""
MISSING_FIELD: Final = "missing_field"
"""A required field (or columnar metadata key / column) is absent."""
WRONG_TYPE: Final = "wrong_type"
"""A field has the wrong msgpack type (or a column the wrong Arrow type)."""
BAD_VALUE: Final = "bad_value"
"""A field has the right type but an illegal value: NaN/inf, negative count, unknown enum."""
BAD_MAGIC: Final = "bad_magic"
"""A columnar payload does not start with b"FPC1"."""
BAD_SCHEMA: Final = "bad_schema"
"""A columnar payload's IPC stream has the wrong shape: batch count, compression, columns."""
DUPLICATE_REPLICA: Final = "duplicate_replica"
"""A columnar report lists one replica_id on more than one row."""

ALL_REASONS: Final = (
    NOT_BYTES,
    OVERSIZE,
    TRUNCATED,
    MALFORMED,
    NOT_A_MAP,
    UNSUPPORTED_VERSION,
    UNKNOWN_KIND,
    UNEXPECTED_KIND,
    MISSING_FIELD,
    WRONG_TYPE,
    BAD_VALUE,
    BAD_MAGIC,
    BAD_SCHEMA,
    DUPLICATE_REPLICA,
)

"""Named limits of the wire contract (schemas/v1 and docs/wire.md quote the same numbers).

Every decoder checks the payload size against `MAX_MESSAGE_BYTES` before it parses anything, and
bounds every declared length (msgpack str/bin/array/map headers, Arrow IPC messages) by the size
of the payload it was handed, so a hostile header cannot make a decoder allocate or loop more
than the payload itself justifies.
"""

from __future__ import annotations

from typing import Final

WIRE_VERSION: Final = 1
"""Value of the "v" field of every msgpack message."""

MAX_MESSAGE_BYTES: Final = 8 * 1024 * 1024
"""Largest payload any decoder accepts (8 MiB). NATS defaults to 1 MiB; this leaves room for
servers configured larger without letting one message pin unbounded memory."""

DEFAULT_MAX_PAYLOAD: Final = 1_048_576
"""NATS server default max_payload; the columnar encoder splits reports to fit under it."""

MAX_CONTAINERS: Final = 262_144
"""Most msgpack arrays + maps in one message. An empty array is one byte on the wire but about
64 bytes as a Python list, so without this an 8 MiB payload could cost half a GiB to decode.
Payload size already bounds scalars (at most ~16 bytes of Python per wire byte)."""

MAX_UINT64: Final = 2**64 - 1
"""Largest unsigned integer msgpack can carry; also bounds integers in columnar metadata."""

MAX_INT32: Final = 2**31 - 1

MAX_IPC_MESSAGES: Final = 64
"""Arrow IPC messages accepted in one FPC1 payload (schema + dictionaries + one batch)."""

MAX_COLUMNS: Final = 1024
"""Columns accepted in one FPC1 schema, known or not (bounds per-column work on decode)."""

MAX_CUSTOM_METRICS: Final = 256
"""`custom.<name>` columns an encoder may write into one columnar report."""

MAX_CUSTOM_NAME_LEN: Final = 128
"""Longest custom metric name (UTF-8 bytes) in a `custom.<name>` column."""

MAX_METADATA_VALUE_LEN: Final = 1024
"""Longest value (bytes) of a report-level field in FPC1 schema metadata."""

MAX_PARTS: Final = 65_536
"""Most parts one columnar report may be split into."""

REPORT_PART_MAX_BYTES: Final = 256 * 1024
"""Routers split a handle report into parts of at most this many bytes (or max_payload, if
smaller), so no message on the bus grows with the size of a deployment: a 65,536-replica report
is ~12 parts that each merge on their own, not three near the server's 1 MiB limit."""

COLUMNAR_SPLIT_MARGIN: Final = 0.95
"""The splitter aims parts at this fraction of max_payload so the first estimate usually fits."""

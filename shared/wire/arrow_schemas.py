"""Arrow schemas of the wire and of recording files, and their language-neutral JSON form.

The JSON form follows the field/type layout of Arrow's integration-test JSON (name, nullable,
type {"name": ...}, children, dictionary {indexType, isOrdered}), so a Go, Rust or JS
implementation can build the same schema from schemas/v1/*.arrow.json. Only the types fleetpulse
uses are supported. Tests check that these Python objects and the committed JSON files agree.
"""

from __future__ import annotations

from typing import Any, Final

import pyarrow as pa

from shared.errors import UsageError

# ---------------------------------------------------------------------------------------------
# recording files (fleetpulse record / replay)

RECORDING_VERSION: Final = "1"
RECORDING_VERSION_KEY: Final = b"fleetpulse.recording.version"

RECORDING_SCHEMA: Final = pa.schema(
    [
        pa.field("recv_time", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("subject", pa.dictionary(pa.int32(), pa.utf8()), nullable=False),
        pa.field("reply", pa.utf8(), nullable=True),
        pa.field("headers", pa.map_(pa.utf8(), pa.utf8()), nullable=True),
        pa.field("payload", pa.binary(), nullable=False),
    ],
    metadata={RECORDING_VERSION_KEY: RECORDING_VERSION.encode()},
)
"""One row per received message. `subject` is dictionary-encoded because a recording holds few
distinct subjects; `headers` is null when the message had none."""

# ---------------------------------------------------------------------------------------------
# columnar handle report (FPC1)

REPLICA_ID_TYPE: Final = pa.dictionary(pa.int32(), pa.utf8())
CUSTOM_COLUMN_PREFIX: Final = "custom."
CUSTOM_COLUMN_TYPE: Final = pa.float64()

HANDLE_REPORT_FIXED_FIELDS: Final = (
    pa.field("replica_id", REPLICA_ID_TYPE, nullable=False),
    pa.field("running_requests", pa.float64(), nullable=False),
    pa.field("health_healthy", pa.bool_(), nullable=True),
    pa.field("health_checked_at", pa.float64(), nullable=True),
    pa.field("health_failures", pa.int32(), nullable=True),
)
"""The five columns every FPC1 batch starts with, in this order; `custom.<name>` float64
columns (nullable: null = no value for that replica) follow."""

HANDLE_REPORT_METADATA: Final = (
    ("handle_id", "utf8"),
    ("app", "utf8"),
    ("deployment", "utf8"),
    ("sent_at", "float"),
    ("seq", "uint"),
    ("queued_requests", "float"),
    ("membership_epoch", "uint"),
    ("part", "uint"),
    ("parts", "uint"),
    ("stats", "json"),
)
"""Report-level fields carried as schema metadata: key, and how its UTF-8 value is written
("uint": base-10 digits; "float": a JSON-style decimal number; "utf8": the string itself;
"json": a JSON document). `stats` is optional (the request counters of `HandleReport.stats`)."""


def handle_report_schema(custom_names: tuple[str, ...] = ()) -> pa.Schema:
    """The FPC1 schema for the given custom metric names (metadata not included)."""
    custom = [pa.field(CUSTOM_COLUMN_PREFIX + n, CUSTOM_COLUMN_TYPE) for n in custom_names]
    return pa.schema([*HANDLE_REPORT_FIXED_FIELDS, *custom])


# ---------------------------------------------------------------------------------------------
# JSON description <-> pyarrow

_FLOAT_PRECISION = {16: "HALF", 32: "SINGLE", 64: "DOUBLE"}
_FLOAT_BY_PRECISION = {"HALF": pa.float16(), "SINGLE": pa.float32(), "DOUBLE": pa.float64()}
_UNITS = {"s": "SECOND", "ms": "MILLISECOND", "us": "MICROSECOND", "ns": "NANOSECOND"}
_UNIT_BY_NAME = {v: k for k, v in _UNITS.items()}
_INT_TYPES = {
    (8, True): pa.int8(),
    (16, True): pa.int16(),
    (32, True): pa.int32(),
    (64, True): pa.int64(),
    (8, False): pa.uint8(),
    (16, False): pa.uint16(),
    (32, False): pa.uint32(),
    (64, False): pa.uint64(),
}
_SIMPLE = {"bool": pa.bool_(), "utf8": pa.utf8(), "binary": pa.binary(), "null": pa.null()}


def _int_json(t: pa.DataType) -> dict[str, Any]:
    return {"name": "int", "bitWidth": t.bit_width, "isSigned": pa.types.is_signed_integer(t)}


def _type_json(t: pa.DataType) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(type object, children) of a non-dictionary type."""
    for name, simple in _SIMPLE.items():
        if t == simple:
            return {"name": name}, []
    if pa.types.is_integer(t):
        return _int_json(t), []
    if pa.types.is_floating(t):
        return {"name": "floatingpoint", "precision": _FLOAT_PRECISION[t.bit_width]}, []
    if pa.types.is_timestamp(t):
        return {"name": "timestamp", "unit": _UNITS[t.unit], "timezone": t.tz}, []
    if pa.types.is_map(t):
        entries = pa.field("entries", pa.struct([t.key_field, t.item_field]), nullable=False)
        return {"name": "map", "keysSorted": t.keys_sorted}, [field_to_json(entries)]
    if pa.types.is_struct(t):
        return {"name": "struct"}, [field_to_json(t.field(i)) for i in range(t.num_fields)]
    if pa.types.is_list(t):
        return {"name": "list"}, [field_to_json(t.value_field)]
    raise UsageError(f"arrow type {t} has no JSON description here")


def field_to_json(fld: pa.Field) -> dict[str, Any]:
    """A field in Arrow integration-JSON layout (without dictionary ids)."""
    t = fld.type
    out: dict[str, Any] = {"name": fld.name, "nullable": fld.nullable}
    if pa.types.is_dictionary(t):
        out["type"], out["children"] = _type_json(t.value_type)
        out["dictionary"] = {"indexType": _int_json(t.index_type), "isOrdered": t.ordered}
    else:
        out["type"], out["children"] = _type_json(t)
    return out


def _type_from_json(tj: dict[str, Any], children: list[dict[str, Any]]) -> pa.DataType:
    name = tj["name"]
    if name in _SIMPLE:
        return _SIMPLE[name]
    if name == "int":
        return _INT_TYPES[(tj["bitWidth"], tj["isSigned"])]
    if name == "floatingpoint":
        return _FLOAT_BY_PRECISION[tj["precision"]]
    if name == "timestamp":
        return pa.timestamp(_UNIT_BY_NAME[tj["unit"]], tz=tj.get("timezone"))
    kids = [field_from_json(c) for c in children]
    if name == "map":
        (entries,) = kids
        key, item = entries.type.field(0), entries.type.field(1)
        return pa.map_(key, item, keys_sorted=tj.get("keysSorted", False))
    if name == "struct":
        return pa.struct(kids)
    if name == "list":
        (value,) = kids
        return pa.list_(value)
    raise UsageError(f"JSON arrow type {name!r} is not supported here")


def field_from_json(fj: dict[str, Any]) -> pa.Field:
    t = _type_from_json(fj["type"], fj.get("children", []))
    if "dictionary" in fj:
        d = fj["dictionary"]
        index = _INT_TYPES[(d["indexType"]["bitWidth"], d["indexType"]["isSigned"])]
        t = pa.dictionary(index, t, ordered=d.get("isOrdered", False))
    return pa.field(fj["name"], t, nullable=fj["nullable"])


def schema_to_json(schema: pa.Schema) -> dict[str, Any]:
    meta = schema.metadata or {}
    return {
        "fields": [field_to_json(fld) for fld in schema],
        "metadata": [{"key": k.decode(), "value": v.decode()} for k, v in meta.items()],
    }


def schema_from_json(sj: dict[str, Any]) -> pa.Schema:
    meta = {m["key"].encode(): m["value"].encode() for m in sj.get("metadata", [])}
    return pa.schema([field_from_json(fj) for fj in sj["fields"]], metadata=meta or None)

"""schemas/v1 and schemas/vectors agree with the Python codecs, and the vectors are up to date."""

from __future__ import annotations

import base64
import dataclasses
import importlib.util
import json
from pathlib import Path
from typing import Any

import jsonschema
import msgpack
import pyarrow as pa
import pytest

from shared.errors import UsageError, WireError
from shared.wire import codec, jsonview, reasons
from shared.wire.arrow_schemas import (
    CUSTOM_COLUMN_PREFIX,
    CUSTOM_COLUMN_TYPE,
    HANDLE_REPORT_FIXED_FIELDS,
    HANDLE_REPORT_METADATA,
    RECORDING_SCHEMA,
    field_from_json,
    schema_from_json,
    schema_to_json,
)
from shared.wire.columnar import COLUMNAR_MAGIC, decode_handle_report_columnar
from shared.wire.limits import MAX_CUSTOM_NAME_LEN, MAX_MESSAGE_BYTES
from shared.wire.messages import KINDS

ROOT = Path(__file__).resolve().parents[2]
V1 = ROOT / "schemas" / "v1"
VECTORS = ROOT / "schemas" / "vectors"
INDEX = json.loads((VECTORS / "index.json").read_text())
INVALID = json.loads((VECTORS / "invalid" / "index.json").read_text())


def load(path: Path) -> Any:
    return json.loads(path.read_text())


def validator(name: str) -> jsonschema.Draft202012Validator:
    schema = load(V1 / name)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def message_schema(kind: str) -> jsonschema.Draft202012Validator:
    return validator(f"{kind}.schema.json")


# --- JSON Schemas ------------------------------------------------------------------------------


def test_one_schema_per_kind_and_nothing_else() -> None:
    files = {p.name.removesuffix(".schema.json") for p in V1.glob("*.schema.json")}
    assert files == set(KINDS) | {"handle_report_columnar.vector"}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_schema_matches_the_dataclass_and_the_decoder(kind: str) -> None:
    schema = load(V1 / f"{kind}.schema.json")
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["additionalProperties"] is True
    assert schema["properties"]["kind"] == {"const": kind}
    fields = {f.name for f in dataclasses.fields(KINDS[kind])}
    assert set(schema["properties"]) == fields | {"v", "kind"}
    # A field is required in the schema exactly when the decoder reports it missing.
    entry = next(e for e in INDEX["msgpack"] if e["kind"] == kind and e["canonical"])
    wire = msgpack.unpackb((VECTORS / f"{entry['name']}.msgpack").read_bytes())
    required = set()
    for field in wire:
        try:
            codec.decode(msgpack.packb({k: v for k, v in wire.items() if k != field}))
        except WireError as exc:
            assert exc.reason == reasons.MISSING_FIELD
            required.add(field)
    assert set(schema["required"]) == required


def _json_or_none(obj: Any) -> Any:
    try:
        return jsonview.to_json_value(obj)
    except UsageError:  # NaN and infinities have no JSON form; the decoder test covers them
        return None


def test_schemas_reject_what_the_decoder_rejects() -> None:
    checked = 0
    for entry in INVALID:
        if entry["decoder"] != "msgpack" or entry["reason"] not in (
            reasons.MISSING_FIELD, reasons.WRONG_TYPE, reasons.BAD_VALUE,
            reasons.UNSUPPORTED_VERSION,
        ):  # fmt: skip
            continue
        raw = msgpack.unpackb((VECTORS / "invalid" / entry["file"]).read_bytes())
        as_json = _json_or_none(raw)
        if as_json is None:
            continue
        errors = list(message_schema(raw["kind"]).iter_errors(as_json))
        assert errors, f"schema accepts invalid/{entry['file']}"
        checked += 1
    assert checked >= 5


# --- golden msgpack vectors --------------------------------------------------------------------


def test_the_top_index_lists_every_file_under_schemas_vectors() -> None:
    """An implementer starts at index.json: every folder (invalid/, kv/, kv/invalid/) is in it."""
    listed = {f"{e['name']}.{ext}" for e in INDEX["msgpack"] for ext in ("msgpack", "json")}
    listed |= {f"{e['name']}.{ext}" for e in INDEX["columnar"] for ext in ("fpc1", "json")}
    bad, kv = INDEX["invalid"], INDEX["kv"]
    listed |= {"index.json", bad["index"], kv["index"]}
    listed |= {f"{bad['dir']}/{e['file']}" for e in bad["vectors"]}
    listed |= {f"{kv['dir']}/{e['name']}.json" for e in kv["documents"]}
    listed |= {f"{kv['dir']}/invalid/{e['file']}" for e in kv["invalid"]}
    on_disk = {str(p.relative_to(VECTORS)) for p in VECTORS.rglob("*") if p.is_file()}
    assert on_disk == listed
    # the folders' own indexes hold the same entries
    assert load(VECTORS / bad["index"]) == bad["vectors"] == INVALID
    kv_index = load(VECTORS / kv["index"])
    assert (kv_index["documents"], kv_index["invalid"]) == (kv["documents"], kv["invalid"])
    assert {e["kind"] for e in INDEX["msgpack"] if e["canonical"]} == set(KINDS)
    assert len(INDEX["columnar"]) >= 2


def _plain(v: Any) -> Any:
    """msgpack data -> JSON data as index.json's `json_view` says: written here, independently
    of shared.wire, so a JSON view that hides or adds anything fails."""
    if isinstance(v, bytes):
        return {"$bytes_b64": base64.b64encode(v).decode("ascii")}
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    assert v is None or type(v) in (bool, int, float, str), type(v)
    return v


def _same(a: Any, b: Any, path: str = "$") -> None:
    """Equal, and of the same JSON type (1 is not 1.0, 1 is not true), keys in the same order."""
    assert type(a) is type(b), f"{path}: {a!r} vs {b!r}"
    if isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys {list(a)} vs {list(b)}"
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), f"{path}: {len(a)} items vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"


@pytest.mark.parametrize("path", sorted(VECTORS.glob("*.msgpack")), ids=lambda p: p.stem)
def test_a_json_view_is_exactly_what_its_msgpack_bytes_hold(path: Path) -> None:
    """Decoded with plain msgpack (not the project's decoder), every vector's bytes are its
    JSON view: every key, nil as null, ints as ints, floats as floats, bin as $bytes_b64."""
    raw = msgpack.unpackb(path.read_bytes(), raw=False)
    _same(_plain(raw), load(path.with_suffix(".json")))
    # and the view alone packs back to the very bytes: a client built from the JSON sees it all
    assert msgpack.packb(jsonview.from_json_value(load(path.with_suffix(".json")))) == (
        path.read_bytes()
    )


@pytest.mark.parametrize("entry", INDEX["msgpack"], ids=lambda e: e["name"])
def test_msgpack_vector(entry: dict[str, Any]) -> None:
    data = (VECTORS / f"{entry['name']}.msgpack").read_bytes()
    view = load(VECTORS / f"{entry['name']}.json")
    msg = codec.decode(data)
    assert msg.KIND == entry["kind"] == view["kind"]
    assert jsonview.message_from_json(view) == msg
    if entry["canonical"]:
        assert "decoded" not in entry
        assert codec.encode(msg) == data
        _same(jsonview.message_to_json(msg), view)
    else:
        assert codec.encode(msg) != data
        _same(jsonview.message_to_json(msg), entry["decoded"])
        assert jsonview.message_from_json(entry["decoded"]) == msg
    schema = message_schema(entry["kind"])
    schema.validate(view)  # the schema admits exactly what the bytes hold
    if not entry["canonical"]:
        schema.validate(entry["decoded"])


def _optional_fields() -> list[tuple[str, str]]:
    out = []
    for kind in sorted(KINDS):
        schema = load(V1 / f"{kind}.schema.json")
        out += [(kind, f) for f in schema["properties"] if f not in schema["required"]]
    return out


@pytest.mark.parametrize(("kind", "field"), _optional_fields(), ids=str)
def test_an_optional_field_may_be_absent_or_nil_and_the_vectors_hold_both(
    kind: str, field: str
) -> None:
    """docs/wire.md: absent and nil mean the same, every reader accepts both (older senders
    write nil where newer ones omit, and the other way round), the schema admits both."""
    entry = next(e for e in INDEX["msgpack"] if e["kind"] == kind and e["canonical"])
    wire = msgpack.unpackb((VECTORS / f"{entry['name']}.msgpack").read_bytes())
    absent = {k: v for k, v in wire.items() if k != field}
    nil = {**absent, field: None}
    assert codec.decode(msgpack.packb(absent)) == codec.decode(msgpack.packb(nil))
    schema = message_schema(kind)
    schema.validate(jsonview.to_json_value(absent))
    schema.validate(jsonview.to_json_value(nil))
    forms = set()
    for e in INDEX["msgpack"]:
        if e["kind"] == kind:
            view = load(VECTORS / f"{e['name']}.json")
            forms.add("absent" if field not in view else "nil" if view[field] is None else "set")
    assert forms >= {"absent", "nil"}, f"the vectors of {kind} hold {field} only as {forms}"


@pytest.mark.parametrize("entry", INDEX["columnar"], ids=lambda e: e["name"])
def test_columnar_vector(entry: dict[str, Any]) -> None:
    data = (VECTORS / f"{entry['name']}.fpc1").read_bytes()
    expected = load(VECTORS / f"{entry['name']}.json")
    assert data[:4] == COLUMNAR_MAGIC
    part = decode_handle_report_columnar(data)
    raw = dict(pa.ipc.open_stream(data[4:]).schema.metadata)
    assert jsonview.columnar_to_json(part, raw) == expected
    # and read with plain pyarrow (not the project's decoder): the view shows what the bytes hold
    plain = pa.ipc.open_stream(data[4:]).read_all()
    assert expected["columns"] == plain.schema.names
    assert expected["rows"] == plain.to_pylist()
    meta = {k.decode(): v.decode() for k, v in (plain.schema.metadata or {}).items()}
    assert expected["metadata_raw"] == meta
    validator("handle_report_columnar.vector.schema.json").validate(expected)
    assert len(expected["rows"]) == part.num_rows


@pytest.mark.parametrize("entry", INVALID, ids=lambda e: e["file"])
def test_invalid_vector(entry: dict[str, Any]) -> None:
    data = (VECTORS / "invalid" / entry["file"]).read_bytes()
    assert entry["reason"] in reasons.ALL_REASONS
    decode = codec.decode if entry["decoder"] == "msgpack" else decode_handle_report_columnar
    with pytest.raises(WireError) as info:
        decode(data)
    assert info.value.reason == entry["reason"]


def test_vectors_are_up_to_date() -> None:
    spec = importlib.util.spec_from_file_location(
        "gen_vectors", ROOT / "scripts" / "gen_vectors.py"
    )
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    built = gen.build()
    # Arrow-encoded files are compared through their JSON (checked above), not byte for byte:
    # another pyarrow may lay out the same batch differently, and both stay valid vectors.
    arrow_made = [k for k in built if k.endswith(".fpc1") or k.startswith("invalid/columnar_")]
    stale = [k for k in built if k not in arrow_made and (VECTORS / k).read_bytes() != built[k]]
    assert not stale, "run scripts/gen_vectors.py: " + ", ".join(stale)
    assert all((VECTORS / k).is_file() for k in arrow_made)


# --- Arrow schemas -----------------------------------------------------------------------------


def test_recording_schema_matches_json() -> None:
    doc = load(V1 / "recording.arrow.json")
    assert schema_from_json(doc).equals(RECORDING_SCHEMA, check_metadata=True)
    assert schema_to_json(RECORDING_SCHEMA)["fields"] == doc["fields"]
    assert doc["metadata"] == [{"key": "fleetpulse.recording.version", "value": "1"}]
    assert set(doc["field_notes"]) == set(RECORDING_SCHEMA.names)


def test_recording_schema_writes_and_reads_back() -> None:
    table = pa.table(
        {
            "recv_time": pa.array([1_700_000_000_000_000], pa.timestamp("us", tz="UTC")),
            "subject": pa.array(["fp.v1.report.replica.a.d"]).dictionary_encode(),
            "reply": pa.array([None], pa.utf8()),
            "headers": pa.array([[("k", "v"), ("k", "w")]], pa.map_(pa.utf8(), pa.utf8())),
            "payload": pa.array([b"\x80"]),
        },
        schema=RECORDING_SCHEMA,
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, RECORDING_SCHEMA) as w:
        w.write_table(table)
    back = pa.ipc.open_stream(sink.getvalue()).read_all()
    assert back.schema.equals(RECORDING_SCHEMA, check_metadata=True)
    assert back.column("headers").to_pylist() == [[("k", "v"), ("k", "w")]]


def test_handle_report_schema_matches_json() -> None:
    doc = load(V1 / "handle_report.arrow.json")
    assert doc["magic"].encode() == COLUMNAR_MAGIC
    assert [field_from_json(f) for f in doc["fields"]] == list(HANDLE_REPORT_FIXED_FIELDS)
    custom = doc["custom_fields"]
    assert custom["name_prefix"] == CUSTOM_COLUMN_PREFIX
    assert custom["max_name_bytes"] == MAX_CUSTOM_NAME_LEN
    fld = field_from_json({"name": "x", **custom["field"]})
    assert fld.type == CUSTOM_COLUMN_TYPE and fld.nullable
    assert [(m["key"], m["encoding"]) for m in doc["metadata_fields"]] == list(
        HANDLE_REPORT_METADATA
    )
    assert set(doc["metadata_encodings"]) == {e for _, e in HANDLE_REPORT_METADATA}
    assert doc["max_payload_bytes"] == MAX_MESSAGE_BYTES
    assert set(doc["field_notes"]) == {f.name for f in HANDLE_REPORT_FIXED_FIELDS}


def test_unsupported_arrow_types_are_refused() -> None:
    with pytest.raises(UsageError):
        schema_to_json(pa.schema([pa.field("x", pa.decimal128(5, 2))]))
    with pytest.raises(UsageError):
        field_from_json({"name": "x", "nullable": True, "type": {"name": "decimal"}})


# --- docs --------------------------------------------------------------------------------------


def test_docs_name_every_kind_reason_and_limit() -> None:
    doc = (ROOT / "docs" / "wire.md").read_text()
    for token in [*KINDS, *reasons.ALL_REASONS, "FPC1", "fp.v1.probe.{replica}"]:
        assert f"`{token}`" in doc, token
    assert str(MAX_MESSAGE_BYTES) in doc

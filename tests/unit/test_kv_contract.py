"""schemas/v1/kv and schemas/vectors/kv agree with the control-state documents in shared/kv."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from services.proxy.serviceability import Serviceability
from shared.appconfig import AppConfig
from shared.errors import ConfigError, WireError
from shared.kv import buckets, envelope
from shared.kv.documents import BUCKET_OF, BY_KIND, decode_any
from shared.kv.membership import Member
from shared.kv.routes import SERVICEABILITY
from shared.kv.targets import ReplicaTarget
from shared.wire import reasons

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas" / "v1" / "kv"
VECTORS = ROOT / "schemas" / "vectors" / "kv"
INDEX = json.loads((VECTORS / "index.json").read_text())
DOCUMENTS = INDEX["documents"]
INVALID = INDEX["invalid"]
CROSS_FIELD = {"app_min_above_max", "app_rollout_both_zero"}
"""Invalid values a JSON Schema cannot see (the rule relates two fields)."""


def vector(name: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads((VECTORS / f"{name}.json").read_text())
    return out


def schema(kind: str) -> jsonschema.Draft202012Validator:
    doc = json.loads((SCHEMAS / f"{kind}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(doc)
    return jsonschema.Draft202012Validator(doc)


def as_doc(document: envelope.Document) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(envelope.encode(document))
    return out


def canonical(kind: str) -> dict[str, Any]:
    entry = next(e for e in DOCUMENTS if e["kind"] == kind and e["canonical"])
    return vector(entry["name"])


# --- the registry, the classes and the schemas name the same kinds ------------------------------


def test_every_bucket_kind_has_a_document_class_and_a_schema() -> None:
    kinds = {k for b in buckets.ALL for k in b.kinds}
    assert kinds == set(BY_KIND)
    assert {p.name.removesuffix(".schema.json") for p in SCHEMAS.glob("*.schema.json")} == kinds
    assert {e["kind"] for e in DOCUMENTS if e["canonical"]} == kinds
    assert {e["kind"] for e in INVALID} >= kinds


@pytest.mark.parametrize("kind", sorted(BY_KIND))
def test_schema_matches_the_document_and_its_decoder(kind: str) -> None:
    doc = json.loads((SCHEMAS / f"{kind}.schema.json").read_text())
    assert doc["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert doc["additionalProperties"] is True  # unknown fields are ignored
    assert doc["properties"]["kind"] == {"const": kind}
    assert doc["properties"]["v"]["const"] == envelope.VERSION
    assert (doc["x-bucket"], doc["x-key"]) == (BUCKET_OF[kind].name, BUCKET_OF[kind].key)
    value = json.loads(canonical(kind)["value"])
    assert set(doc["properties"]) == set(value)
    # a field is required in the schema exactly when the decoder reports it missing
    required = set()
    for field in value:
        try:
            decode_any(kind, json.dumps({k: v for k, v in value.items() if k != field}).encode())
        except WireError as exc:
            if exc.reason == reasons.MISSING_FIELD:
                required.add(field)
    assert set(doc["required"]) == required | {"v", "kind"}


def _optional_fields() -> list[tuple[str, str]]:
    out = []
    for kind in sorted(BY_KIND):
        doc = json.loads((SCHEMAS / f"{kind}.schema.json").read_text())
        out += [(kind, f) for f in doc["properties"] if f not in doc["required"]]
    return out


@pytest.mark.parametrize(("kind", "field"), _optional_fields(), ids=str)
def test_an_optional_field_is_null_exactly_where_its_schema_says(kind: str, field: str) -> None:
    """Absent is always fine; null is accepted by the reader exactly when the schema allows it
    (docs/wire.md: "a field may be null only where its type says so")."""
    value = json.loads(canonical(kind)["value"])
    absent = {k: v for k, v in value.items() if k != field}
    decode_any(kind, json.dumps(absent).encode())
    schema(kind).validate(absent)
    null = {**absent, field: None}
    schema_allows = schema(kind).is_valid(null)
    try:
        decode_any(kind, json.dumps(null).encode())
    except WireError as exc:
        assert not schema_allows, f"the schema allows {field}: null, the reader says {exc.reason}"
    else:
        assert schema_allows, f"the reader takes {field}: null, the schema does not say so"


# --- golden vectors ------------------------------------------------------------------------------


def test_index_lists_every_file() -> None:
    listed = {f"{e['name']}.json" for e in DOCUMENTS} | {"index.json"}
    listed |= {f"invalid/{e['file']}" for e in INVALID}
    on_disk = {str(p.relative_to(VECTORS)) for p in VECTORS.rglob("*") if p.is_file()}
    assert on_disk == listed


@pytest.mark.parametrize("entry", DOCUMENTS, ids=lambda e: e["name"])
def test_vector(entry: dict[str, Any]) -> None:
    v = vector(entry["name"])
    kind = entry["kind"]
    assert v["kind"] == kind and v["bucket"] == BUCKET_OF[kind].name
    data = v["value"].encode()
    document = decode_any(kind, data)
    assert as_doc(document) == v["decoded"]
    assert decode_any(kind, envelope.encode(document)) == document
    if entry["canonical"]:
        assert envelope.encode(document) == data  # the writer's exact bytes
    else:
        assert envelope.encode(document) != data
    validator = schema(kind)
    validator.validate(json.loads(data))
    validator.validate(v["decoded"])
    if isinstance(document, Member | ReplicaTarget):
        document.check_key(v["key"])


@pytest.mark.parametrize("entry", INVALID, ids=lambda e: e["file"])
def test_invalid_vector(entry: dict[str, Any]) -> None:
    data = (VECTORS / "invalid" / entry["file"]).read_bytes()
    assert entry["reason"] in reasons.ALL_REASONS
    with pytest.raises(WireError) as info:
        decode_any(entry["kind"], data)
    assert info.value.reason == entry["reason"]
    if entry["kind"] == "app":  # the AppConfig API keeps raising ConfigError, the reason inside
        with pytest.raises(ConfigError) as config_error:
            AppConfig.from_json(data)
        cause = config_error.value.__cause__
        assert isinstance(cause, WireError) and cause.reason == entry["reason"]


def _no(token: str) -> None:
    raise ValueError(token)


def test_schemas_reject_what_the_decoders_reject() -> None:
    checked = 0
    for entry in INVALID:
        name = entry["file"].removesuffix(".bin")
        try:  # strict JSON only: NaN is no JSON number, so no schema can speak of it
            value = json.loads(
                (VECTORS / "invalid" / entry["file"]).read_bytes(), parse_constant=_no
            )
        except ValueError:
            continue
        if name in CROSS_FIELD or not isinstance(value, dict) or value.get("kind") != entry["kind"]:
            continue
        errors = list(schema(entry["kind"]).iter_errors(value))
        assert errors, f"schema accepts kv/invalid/{entry['file']}"
        checked += 1
    assert checked >= 12


# --- each document's readers: bad input gives the typed reason -----------------------------------


def _fields(kind: str) -> list[tuple[str, str]]:
    return [(kind, f) for f in json.loads(canonical(kind)["value"]) if f not in ("v", "kind")]


@pytest.mark.parametrize(
    ("kind", "field"), [kf for kind in sorted(BY_KIND) for kf in _fields(kind)], ids=str
)
def test_a_field_of_another_json_type_is_wrong_type(kind: str, field: str) -> None:
    value = json.loads(canonical(kind)["value"])
    value[field] = "text" if isinstance(value[field], dict) else {"an": "object"}
    with pytest.raises(WireError) as info:
        decode_any(kind, json.dumps(value).encode())
    assert info.value.reason == reasons.WRONG_TYPE


@pytest.mark.parametrize("kind", sorted(BY_KIND))
@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", reasons.MALFORMED),
        (b"null", reasons.NOT_A_MAP),
        (b'{"v": 1}', reasons.UNEXPECTED_KIND),
        (b'{"kind": "x"}', reasons.UNSUPPORTED_VERSION),
        (b" " * (envelope.MAX_DOCUMENT_BYTES + 1), reasons.OVERSIZE),
    ],
)
def test_envelope_errors_for_every_kind(kind: str, data: bytes, reason: str) -> None:
    with pytest.raises(WireError) as info:
        decode_any(kind, data)
    assert info.value.reason == reason
    with pytest.raises(WireError) as info:
        decode_any(kind, data.decode())  # a str is not a value
    assert info.value.reason == reasons.NOT_BYTES


def test_route_serviceability_values_are_the_proxys() -> None:
    assert tuple(s.value for s in Serviceability) == SERVICEABILITY


# --- docs ----------------------------------------------------------------------------------------


def test_wire_md_documents_every_bucket_and_kind() -> None:
    doc = (ROOT / "docs" / "wire.md").read_text()
    section = doc[doc.index("## Control state") :]
    for bucket in buckets.ALL:
        assert f"`{bucket.name}`" in section, bucket.name
        assert f"`{bucket.key}`" in section, bucket.key
        for kind in bucket.kinds:
            assert f"`{kind}`" in section, kind
            assert f"schemas/v1/kv/{kind}.schema.json" in section
    assert "shared.control.Membership" not in (ROOT / "docs" / "dataplane.md").read_text()

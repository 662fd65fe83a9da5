"""The contract as an outside implementer reads it (issue 14): docs, schemas and vectors say what
the code does. Each test pins one place where they disagreed."""

from __future__ import annotations

import dataclasses
import json
import re
import struct
from pathlib import Path
from typing import Any, cast

import msgpack
import pytest

from services.controller.metrics_types import (
    ACCEPTED,
    DUPLICATE,
    NOT_RUNNING,
    STALE,
    UNKNOWN_REPLICA,
)
from shared.errors import WireError
from shared.wire import codec
from shared.wire.messages import KINDS, HealthStatus

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
VECTORS = ROOT / "schemas" / "vectors"


def _doc(name: str) -> str:
    return (DOCS / name).read_text()


def test_error_codes_are_the_ones_the_replica_sends() -> None:
    source = (ROOT / "services" / "replica" / "runtime.py").read_text()
    sent = set(re.findall(r'(?:ErrorReply|_RequestError)\(\s*"([a-z_]+)"', source))
    sent |= set(re.findall(r'outcome = "([a-z_]+)"', source)) & {"user_error", "replica_shutdown"}
    table = _doc("dataplane.md").split("## Error codes", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", table, re.M))
    schema = json.loads((ROOT / "schemas" / "v1" / "error.schema.json").read_text())
    examples = set(schema["properties"]["code"]["examples"])
    assert sent == documented == examples
    vector = json.loads((VECTORS / "error.json").read_text())
    assert vector["code"] in sent


def test_docs_name_the_version_field_v() -> None:
    for page in DOCS.glob("*.md"):
        assert "schema_version" not in page.read_text(), page.name


def test_floats_are_float64_on_the_wire_and_the_docs_say_so() -> None:
    # 0.5 and 2.0 fit a float32 (and 2.0 an int) exactly: still float64
    data = codec.encode(HealthStatus("r", True, 2.0, 0))
    assert b"\xcb" + struct.pack(">d", 2.0) in data
    data = codec.encode(HealthStatus("r", True, 0.5, 0))
    assert b"\xcb" + struct.pack(">d", 0.5) in data
    wire = _doc("wire.md")
    assert "every float as float64" in wire and "smallest\nmsgpack representation" not in wire


def test_truncated_and_malformed_follow_the_documented_rule() -> None:
    rule = _doc("wire.md").split("Truncated or malformed:", 1)[1].split("\n\n", 1)[0]
    invalid = {v["file"]: v for v in json.loads((VECTORS / "invalid" / "index.json").read_text())}
    for name, reason in (
        ("str_past_end", "truncated"),
        ("items_past_end", "truncated"),
        ("count_past_payload", "malformed"),
    ):
        assert f"`{name}`" in rule
        assert invalid[f"{name}.bin"]["reason"] == reason
        try:
            codec.decode((VECTORS / "invalid" / f"{name}.bin").read_bytes())
        except WireError as exc:
            assert exc.reason == reason, name
        else:
            raise AssertionError(f"{name} decoded")


def test_the_response_stream_rule_covers_undecodable_requests() -> None:
    stream = _doc("wire.md").split("### Response stream", 1)[1].split("\n## ", 1)[0]
    assert "also for a request the replica cannot decode" in stream


def test_the_request_vectors_call_a_public_method() -> None:
    for name in ("request_args", "request_http"):
        req = msgpack.unpackb((VECTORS / f"{name}.msgpack").read_bytes())
        method = req["method"]
        assert method == "__call__" or not method.startswith("_"), (name, method)


def test_the_gateway_docs_say_how_repeated_headers_and_short_timeouts_behave() -> None:
    gateway = _doc("dataplane.md").split("## The router gateway", 1)[1].split("\n## ", 1)[0]
    assert "**last** value only" in gateway
    assert "gets its own client's timeout, not a 504" in gateway
    assert "every NATS header is passed to the user code as an HTTP header" not in gateway


def test_the_recording_docs_do_not_promise_transparent_zstd_everywhere() -> None:
    recording = _doc("recording.md")
    assert "readers decompress transparently" not in recording
    assert "registered by hand" in recording


def test_every_what_if_count_label_is_documented() -> None:
    rows = _doc("recording.md").split("have these labels:", 1)[1].split("\n\n", 2)[1]
    patterns = []
    for cell in re.findall(r"^\| ([^|]+) \|", rows, re.M)[1:]:
        for label in re.findall(r"`([^`]+)`", cell):
            rx = re.escape(label).replace(r"\{result\}", "(?P<result>[a-z_]+)")
            rx = rx.replace(r"\{reason\}", "[a-z_]+").replace(r"\{app\}\.\{deployment\}", ".+")
            patterns.append(re.compile(rx + "$"))
    whatif = json.loads((ROOT / "tests" / "replay" / "shop.whatif.json").read_text())
    labels = {*whatif["recording"]["used"], *whatif["recording"]["ignored"]}
    labels |= {
        f"{fmt}_{r}"
        for fmt in ("object", "columnar", "replica")
        for r in (ACCEPTED, STALE, DUPLICATE, NOT_RUNNING, UNKNOWN_REPLICA)
    }
    for label in sorted(labels):
        assert any(p.match(label) for p in patterns), label


SHARED = ("health", "bytes")


def _schema_tables() -> list[tuple[str, str, dict[str, object]]]:
    """(schema file, section, fields) for every object of fields in schemas/v1: the top level,
    each nested object in $defs, and a versioned map's fields (handle_report.stats)."""
    out = []
    for path in sorted((ROOT / "schemas" / "v1").rglob("*.schema.json")):
        if path.name.endswith(".vector.schema.json"):
            continue
        doc = json.loads(path.read_text())
        rel = str(path.relative_to(ROOT))
        out.append(
            (rel, "", {k: v for k, v in doc["properties"].items() if k not in ("v", "kind")})
        )
        for name, node in doc.get("$defs", {}).items():
            # a HealthStatus has its own table (health); bytes is how JSON renderings show bin
            if node.get("type") == "object" and node.get("properties") and name not in SHARED:
                out.append((rel, f"#/$defs/{name}", node["properties"]))
        for name, node in doc["properties"].items():
            if "then" in node:
                out.append((rel, f"#/properties/{name}", node["then"]["properties"]))
    return out


@pytest.mark.parametrize(
    ("schema", "section", "fields"), _schema_tables(), ids=[s + n for s, n, _ in _schema_tables()]
)
def test_every_schema_field_is_a_row_of_its_table_in_wire_md(
    schema: str, section: str, fields: dict[str, object]
) -> None:
    """Checked without the generator (scripts/gen_wire_docs.py): the table that names this
    schema as its source has one row per field, in the schema's order."""
    wire = _doc("wire.md")
    marker = f"from {schema}{section} -->\n"
    assert marker in wire, f"docs/wire.md has no table for {schema}{section}"
    table = wire.split(marker, 1)[1].split("<!-- END GENERATED -->", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \|", table, re.M)
    assert rows == list(fields)


def test_the_docs_name_the_optional_fields_the_encoder_writes_as_nil() -> None:
    """docs/wire.md says which optional fields the Python encoder writes as nil and which it
    leaves out; the encoder agrees (a field that moved from one to the other would change the
    canonical bytes, which the vectors pin)."""
    vectors = json.loads((VECTORS / "index.json").read_text())["msgpack"]
    as_nil: set[str] = set()
    left_out: set[str] = set()
    for kind in sorted(KINDS):
        schema = json.loads((ROOT / "schemas" / "v1" / f"{kind}.schema.json").read_text())
        entry = next(e for e in vectors if e["kind"] == kind and e["canonical"])
        msg = codec.decode((VECTORS / f"{entry['name']}.msgpack").read_bytes())
        for name in schema["properties"]:
            if name in schema["required"] or name == "custom":
                continue
            unset: Any = dataclasses.replace(cast(Any, msg), **{name: None})
            wire = codec.to_wire_map(unset)
            (as_nil if name in wire else left_out).add(f"{kind}.{name}")
            assert wire.get(name) is None
    rule = " ".join(_doc("wire.md").split("What the\n  Python encoder writes", 1)[1].split())
    nil_part, omitted_part = rule.split("; nothing", 1)
    omitted_part = omitted_part.split("; `custom`", 1)[0]
    assert set(re.findall(r"`([a-z_]+\.[a-z_]+)`", nil_part)) == as_nil
    assert set(re.findall(r"`([a-z_]+\.[a-z_]+)`", omitted_part)) == left_out

"""The one envelope rule of every control-state document, and the field readers decoders use.

A KV value is a JSON object (sorted keys, UTF-8; readable with `nats kv get`) with `"v": 1` and
`"kind"` naming the document type. Decoding validates before anything is built:

- not bytes, over the size limit, not JSON, not an object: `not_bytes`, `oversize`, `malformed`,
  `not_a_map`;
- `v` other than 1: `unsupported_version`; another document's `kind`: `unexpected_kind`;
- a required field absent: `missing_field`; of the wrong JSON type: `wrong_type`; of the right
  type with an illegal value (negative count, NaN, a name that is not a subject token):
  `bad_value`.

Unknown fields are ignored by every reader, so a newer writer that adds one never makes an older
reader drop the value. The reasons are the wire's (shared.wire.reasons): one vocabulary for metrics.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol, TypeVar

from shared.errors import UsageError, WireError
from shared.subjects import validate_name
from shared.wire import reasons

VERSION = 1
MAX_DOCUMENT_BYTES = 256 * 1024
"""No control value may be larger: what grows with a deployment is spread over keys."""

Doc = dict[str, Any]
D = TypeVar("D", bound="Document")


class Document(Protocol):
    """A control-state document type: its `KIND`, and a lossless mapping to and from JSON."""

    KIND: ClassVar[str]

    def to_doc(self) -> Doc: ...

    @classmethod
    def from_doc(cls: type[D], doc: Doc) -> D: ...


def encode(document: Document) -> bytes:
    """The value's bytes: the same document always gives the same bytes."""
    body = {"v": VERSION, "kind": document.KIND, **document.to_doc()}
    data = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    if len(data) > MAX_DOCUMENT_BYTES:
        raise UsageError(
            f"{document.KIND} document of {len(data)} bytes exceeds {MAX_DOCUMENT_BYTES}"
        )
    return data


def decode(data: object, cls: type[D]) -> D:
    """Validate `data` as a `cls` document and build it; raises WireError."""
    return cls.from_doc(load(data, cls.KIND))


def load(data: object, kind: str) -> Doc:
    """The envelope checks; returns the JSON object (still with `v` and `kind`)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireError(reasons.NOT_BYTES, f"{kind}: got {type(data).__name__}")
    if len(data) > MAX_DOCUMENT_BYTES:
        raise WireError(reasons.OVERSIZE, f"{kind}: {len(data)} bytes > {MAX_DOCUMENT_BYTES}")
    try:
        doc = json.loads(bytes(data))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WireError(reasons.MALFORMED, f"{kind}: {exc}") from None
    if not isinstance(doc, dict):
        raise WireError(reasons.NOT_A_MAP, f"{kind}: expected a JSON object")
    v = doc.get("v")
    if v != VERSION or isinstance(v, bool):
        raise WireError(reasons.UNSUPPORTED_VERSION, f"{kind}: v={v!r}")
    if doc.get("kind") != kind:
        raise WireError(reasons.UNEXPECTED_KIND, f"expected {kind!r}, got {doc.get('kind')!r}")
    return doc


# -- field readers: each names the field in its error -----------------------------------------


def _where(doc: Mapping[str, Any], name: str) -> str:
    return f"{doc.get('kind', '?')}.{name}"


def required(doc: Mapping[str, Any], name: str) -> Any:
    if name not in doc:
        raise WireError(reasons.MISSING_FIELD, _where(doc, name))
    return doc[name]


def string(doc: Mapping[str, Any], name: str, default: str | None = None) -> str:
    value = doc.get(name, default) if default is not None else required(doc, name)
    if not isinstance(value, str):
        raise WireError(reasons.WRONG_TYPE, f"{_where(doc, name)} must be a string")
    return value


def optional_string(doc: Mapping[str, Any], name: str) -> str | None:
    value = doc.get(name)
    if value is not None and not isinstance(value, str):
        raise WireError(reasons.WRONG_TYPE, f"{_where(doc, name)} must be a string or null")
    return value


def name(doc: Mapping[str, Any], field: str, default: str | None = None) -> str:
    """A string that must be a valid subject token (app, deployment, replica and agent ids)."""
    value = string(doc, field, default)
    if default is not None and value == default:
        return value
    try:
        validate_name(value, field)
    except UsageError as exc:
        raise WireError(reasons.BAD_VALUE, f"{_where(doc, field)}: {exc}") from None
    return value


def count(doc: Mapping[str, Any], field: str, default: int | None = None) -> int:
    """A non-negative integer (JSON true is not one)."""
    value = doc.get(field, default) if default is not None else required(doc, field)
    return whole(value, _where(doc, field))


def whole(value: object, where: str) -> int:
    """`value` as a count (a list item, a map value): an integer >= 0, JSON true is not one."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise WireError(reasons.WRONG_TYPE, f"{where} must be an integer")
    if value < 0:
        raise WireError(reasons.BAD_VALUE, f"{where} must be >= 0")
    return value


def number(doc: Mapping[str, Any], field: str, default: float | None = None) -> float:
    """A finite non-negative number."""
    value = doc.get(field, default) if default is not None else required(doc, field)
    return finite(value, _where(doc, field))


def optional_positive(doc: Mapping[str, Any], field: str) -> float | None:
    """A finite number > 0, or None when absent or null."""
    value = doc.get(field)
    if value is None:
        return None
    if finite(value, _where(doc, field)) == 0:
        raise WireError(reasons.BAD_VALUE, f"{_where(doc, field)} must be > 0")
    return float(value)


def finite(value: object, where: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise WireError(reasons.WRONG_TYPE, f"{where} must be a number")
    if not math.isfinite(value) or value < 0:
        raise WireError(reasons.BAD_VALUE, f"{where} must be finite and >= 0")
    return float(value)


def boolean(doc: Mapping[str, Any], field: str, default: bool | None = None) -> bool:
    value = doc.get(field, default) if default is not None else required(doc, field)
    if not isinstance(value, bool):
        raise WireError(reasons.WRONG_TYPE, f"{_where(doc, field)} must be true or false")
    return value


def mapping(doc: Mapping[str, Any], field: str, *, default_empty: bool = False) -> Doc:
    value = doc.get(field, {}) if default_empty else required(doc, field)
    if not isinstance(value, dict):
        raise WireError(reasons.WRONG_TYPE, f"{_where(doc, field)} must be an object")
    return value


def listing(doc: Mapping[str, Any], field: str, *, default_empty: bool = False) -> list[Any]:
    value = doc.get(field, []) if default_empty else required(doc, field)
    if not isinstance(value, list):
        raise WireError(reasons.WRONG_TYPE, f"{_where(doc, field)} must be a list")
    return value


T = TypeVar("T")


def check_key(key: str, own: str, kind: str) -> None:
    """A value must sit under its own key: a value copied or written under another key is the
    peer's fault (`bad_value`)."""
    if key != own:
        raise WireError(reasons.BAD_VALUE, f"key {key!r} holds the {kind} of {own!r}")


def nested(kind: str, raw: object, build: Callable[[Doc], T]) -> T:
    """Decode a nested object with `build`, its errors naming `kind`."""
    if not isinstance(raw, dict):
        raise WireError(reasons.WRONG_TYPE, f"{kind} must be an object")
    return build({**raw, "kind": kind})

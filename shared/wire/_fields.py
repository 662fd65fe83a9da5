"""Field readers for decoded msgpack maps: each returns a typed value or raises `WireError`.

Type checks use `type(v) is T` rather than isinstance so a msgpack bool never passes as an int.
Float fields also take msgpack ints, because JavaScript encoders write integral numbers (1.0) as
ints; NaN and infinities are refused everywhere. `where` names the message kind (and nesting) so
the error detail points at the offending field.
"""

from __future__ import annotations

import math
from typing import Any, NoReturn

from shared.errors import WireError
from shared.wire import reasons
from shared.wire.limits import MAX_CUSTOM_METRICS, MAX_CUSTOM_NAME_LEN

Map = dict[str, Any]


def fail(reason: str, where: str, key: str, what: str) -> NoReturn:
    raise WireError(reason, f"{where}.{key}: {what}")


def _type_name(v: object) -> str:
    return "nil" if v is None else type(v).__name__


def wrong_type(where: str, key: str, expected: str, got: object) -> NoReturn:
    fail(reasons.WRONG_TYPE, where, key, f"expected {expected}, got {_type_name(got)}")


def require(m: Map, key: str, where: str) -> Any:
    try:
        return m[key]
    except KeyError:
        fail(reasons.MISSING_FIELD, where, key, "required field is missing")


def get_str(m: Map, key: str, where: str) -> str:
    v = require(m, key, where)
    if type(v) is not str:
        wrong_type(where, key, "str", v)
    return v


def get_bool(m: Map, key: str, where: str) -> bool:
    v = require(m, key, where)
    if type(v) is not bool:
        wrong_type(where, key, "bool", v)
    return v


def get_bytes(m: Map, key: str, where: str) -> bytes:
    v = require(m, key, where)
    if type(v) is not bytes:
        wrong_type(where, key, "bin", v)
    return v


def as_float(v: object, where: str, key: str) -> float:
    """A finite float from a msgpack float or int."""
    if type(v) is float:
        if not math.isfinite(v):
            fail(reasons.BAD_VALUE, where, key, f"{v} is not finite")
        return v
    if type(v) is int:
        return float(v)
    wrong_type(where, key, "float", v)


def as_nonneg_float(v: object, where: str, key: str) -> float:
    f = as_float(v, where, key)
    if f < 0.0:
        fail(reasons.BAD_VALUE, where, key, f"{f} is negative")
    return f


def get_float(m: Map, key: str, where: str) -> float:
    return as_float(require(m, key, where), where, key)


def get_nonneg_float(m: Map, key: str, where: str) -> float:
    return as_nonneg_float(require(m, key, where), where, key)


def get_opt_float(m: Map, key: str, where: str) -> float | None:
    v = m.get(key)
    return None if v is None else as_float(v, where, key)


def get_int(m: Map, key: str, where: str) -> int:
    v = require(m, key, where)
    if type(v) is not int:
        wrong_type(where, key, "int", v)
    return v


def get_opt_int(m: Map, key: str, where: str) -> int | None:
    v = m.get(key)
    if v is None:
        return None
    if type(v) is not int:
        wrong_type(where, key, "int or nil", v)
    return v


def get_count(m: Map, key: str, where: str) -> int:
    v = get_int(m, key, where)
    if v < 0:
        fail(reasons.BAD_VALUE, where, key, f"{v} is negative")
    return v


def get_choice(m: Map, key: str, where: str, choices: tuple[str, ...]) -> str:
    v = get_str(m, key, where)
    if v not in choices:
        fail(reasons.BAD_VALUE, where, key, f"{v!r} is not one of {', '.join(choices)}")
    return v


def get_map(m: Map, key: str, where: str) -> Map:
    v = require(m, key, where)
    if type(v) is not dict:
        wrong_type(where, key, "map", v)
    return v


def get_list(m: Map, key: str, where: str) -> list[Any]:
    v = require(m, key, where)
    if type(v) is not list:
        wrong_type(where, key, "array", v)
    return v


def float_map(raw: object, where: str, key: str, *, nonneg: bool) -> dict[str, float]:
    """{str: finite float}; `nonneg` for counts such as running requests."""
    if type(raw) is not dict:
        wrong_type(where, key, "map", raw)
    conv = as_nonneg_float if nonneg else as_float
    out: dict[str, float] = {}
    for k, v in raw.items():
        if type(k) is not str:
            wrong_type(where, key, "str keys", k)
        if type(v) is float and math.isfinite(v) and not (nonneg and v < 0.0):
            out[k] = v  # the usual value: no field label built for an error not raised
        else:
            out[k] = conv(v, where, f"{key}[{k!r}]")
    return out


def check_custom_names(names: dict[str, Any], where: str) -> None:
    """The custom metric name rule, as in `custom.<name>` columns: at most MAX_CUSTOM_METRICS
    names of 1..MAX_CUSTOM_NAME_LEN UTF-8 bytes. It bounds the columns one report can create."""
    if len(names) > MAX_CUSTOM_METRICS:
        fail(
            reasons.BAD_VALUE, where, "custom", f"{len(names)} names, at most {MAX_CUSTOM_METRICS}"
        )
    for name in names:
        if not 0 < len(name.encode()) <= MAX_CUSTOM_NAME_LEN:
            what = f"name of {len(name.encode())} bytes, not 1-{MAX_CUSTOM_NAME_LEN}"
            fail(reasons.BAD_VALUE, where, "custom", what)


def get_custom(m: Map, where: str) -> dict[str, float]:
    """A replica report's `custom` map: optional, {name: finite float}, names by the rule."""
    out = get_opt_float_map(m, "custom", where, nonneg=False)
    check_custom_names(out, where)
    return out


def get_opt_float_map(m: Map, key: str, where: str, *, nonneg: bool) -> dict[str, float]:
    """Like `float_map`, but a missing or nil field is an empty map (optional in the schema)."""
    raw = m.get(key)
    return {} if raw is None else float_map(raw, where, key, nonneg=nonneg)


def get_headers(m: Map, key: str, where: str) -> tuple[tuple[str, str], ...]:
    """An array of [name, value] string pairs, order and repeats preserved."""
    out = []
    for item in get_list(m, key, where):
        if type(item) is not list or len(item) != 2:
            wrong_type(where, key, "[name, value] pairs", item)
        name, value = item
        if type(name) is not str or type(value) is not str:
            wrong_type(
                where, key, "str header name and value", name if type(name) is not str else value
            )
        out.append((name, value))
    return tuple(out)

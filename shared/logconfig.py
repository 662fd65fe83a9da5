"""A deployment's `logging_config` (Ray Serve's keys): what its replicas log, and how.

| key | values | default (when `logging_config` is given) |
|---|---|---|
| `log_level` | DEBUG, INFO, WARNING, ERROR, CRITICAL (or the number) | INFO |
| `encoding` | TEXT or JSON (one JSON object per line) | TEXT |
| `enable_access_log` | true / false: one line per request (method, outcome, duration) | true |
| `logs_dir` | a directory (relative: to the replica's working directory) for a log file per replica, besides stderr | null |

The canonical form (`normalise`) has every key with its default filled in, so equal settings are
equal maps (one version hash). An empty map means no `logging_config` was given: the replica
logs as the agent started it (INFO, text, no access log). Ray's `additional_log_standard_attrs`
is refused (a JSON record carries the standard fields only).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

from shared.errors import ConfigError

LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
ENCODINGS: Final = ("TEXT", "JSON")
DEFAULTS: Final[Mapping[str, Any]] = {
    "log_level": "INFO",
    "encoding": "TEXT",
    "enable_access_log": True,
    "logs_dir": None,
}
KEYS: Final = tuple(DEFAULTS)
REFUSED: Final[Mapping[str, str]] = {
    "additional_log_standard_attrs": (
        "not supported: JSON records carry the standard fields (time, level, logger, message, "
        "app, deployment, replica); remove the key"
    ),
}
MAX_DIR_CHARS: Final = 4096


def normalise(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The canonical `logging_config`: known keys only, defaults filled in, the level a name.
    Raises ConfigError naming the key and what to write instead."""
    out = dict(DEFAULTS)
    for key, value in raw.items():
        if key in REFUSED:
            raise ConfigError(REFUSED[key], field=key)
        if key not in DEFAULTS:
            raise ConfigError(f"unknown key (known keys: {', '.join(KEYS)})", field=key)
        out[key] = check_value(key, value)
    return out


def problem(value: Any) -> str | None:
    """What is wrong with a stored (canonical or empty) logging_config, or None."""
    if not isinstance(value, Mapping):
        return "must be a map"
    if not value:
        return None
    try:
        canonical = normalise(value)
    except ConfigError as exc:
        return str(exc)
    return None if canonical == dict(value) else "must be in canonical form (every key given)"


def check_value(key: str, value: Any) -> Any:
    """One key's value, canonical (ConfigError naming the key if it is wrong)."""
    if key == "log_level":
        return level_name(value)
    if key == "encoding":
        if not isinstance(value, str) or value.upper() not in ENCODINGS:
            raise ConfigError(f"must be TEXT or JSON, got {value!r}", field=key)
        return value.upper()
    if key == "enable_access_log":
        if not isinstance(value, bool):
            raise ConfigError(f"must be true or false, got {value!r}", field=key)
        return value
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_DIR_CHARS or "\0" in value:
        raise ConfigError(f"must be a directory path or null, got {value!r}", field=key)
    return value


def level_name(value: Any) -> str:
    """`"info"`, `"INFO"` or `20` -> `"INFO"` (Ray accepts names and numbers)."""
    if isinstance(value, int) and not isinstance(value, bool):
        name = logging.getLevelName(value)
        if isinstance(name, str) and name in LEVELS:
            return name
    elif isinstance(value, str):
        upper = value.upper()
        if upper == "WARN":
            return "WARNING"
        if upper in LEVELS:
            return upper
    raise ConfigError(f"must be one of {', '.join(LEVELS)}, got {value!r}", field="log_level")

"""A replica's `logging_config` (shared.logconfig), applied once at start in its own process.

The level and the format apply to every handler of the root logger (the agent sends the
replica's stderr to its log file); `logs_dir` adds one more file,
`{logs_dir}/replica_{app}_{deployment}_{replica}.log`. The access log is one INFO line per
request on the `fleetpulse.access` logger (the runtime writes it when enabled).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

ACCESS_LOGGER: Final = "fleetpulse.access"
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with who logged it (app, deployment, replica)."""

    def __init__(self, identity: Mapping[str, str]) -> None:
        super().__init__()
        self.identity = dict(identity)

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **self.identity,
        }
        for key in ("method", "outcome", "duration_ms", "request_id"):
            if hasattr(record, key):
                doc[key] = getattr(record, key)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def apply(config: Mapping[str, Any], *, app: str, deployment: str, replica_id: str) -> Path | None:
    """Apply a canonical logging_config (empty: leave logging as it is). Returns the extra log
    file, if any. Raises OSError when `logs_dir` cannot be created or written."""
    if not config:
        return None
    identity = {"app": app, "deployment": deployment, "replica": replica_id}
    formatter: logging.Formatter = (
        JsonFormatter(identity) if config["encoding"] == "JSON" else logging.Formatter(TEXT_FORMAT)
    )
    root = logging.getLogger()
    root.setLevel(config["log_level"])
    for handler in root.handlers:
        handler.setFormatter(formatter)
    if not config.get("logs_dir"):
        return None
    folder = Path(config["logs_dir"])
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"replica_{app}_{deployment}_{replica_id}.log"
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(formatter)
    root.addHandler(handler)
    return path


def access_enabled(config: Mapping[str, Any]) -> bool:
    return bool(config.get("enable_access_log", False))

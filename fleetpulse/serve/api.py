"""What user code sees for calls from the gateway or the HTTP ingress.

A deployment's `__call__(self, request)` receives a `Request`; it may return bytes, str, a
JSON-serialisable value, or a `Response`. Python callers through a DeploymentHandle pass ordinary
(msgpack-serialisable) arguments instead and get the return value back as it is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    def text(self) -> str:
        return self.body.decode("utf-8")

    @property
    def query_params(self) -> dict[str, list[str]]:
        return parse_qs(self.query)


@dataclass(frozen=True, slots=True)
class Response:
    body: bytes | str = b""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)

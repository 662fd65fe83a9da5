"""What user code sees of an HTTP request, and one way to answer it.

`Request` is Starlette's (`starlette.requests.Request`), as in Ray Serve: awaitable `body()`,
`json()`, `form()`, `stream()`; `query_params` (a multi-dict whose `[name]` is the last value),
`path_params`, `headers`, `client`, `url`. A deployment's `__call__(self, request)` receives one
for every HTTP request, whether it came to the replica's own HTTP server or over NATS (the Python
proxy, the gateway); a `__call__(self)` without a parameter is called without one. It may return
bytes, str, a JSON-serialisable value, a `Response` below, any Starlette/FastAPI response
(`JSONResponse`, `StreamingResponse`, ...), or be a generator whose items are streamed. Python
callers through a DeploymentHandle pass ordinary (msgpack-serialisable) arguments instead and get
the return value back as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from starlette.requests import Request


@dataclass(frozen=True, slots=True)
class Response:
    """A body, a status and headers (Starlette's `Response` does the same, with more)."""

    body: bytes | str = b""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


__all__ = ["Request", "Response"]

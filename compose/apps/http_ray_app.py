"""The deployment scripts/bench/http_ray.py serves on fleetpulse and on Ray Serve alike.

One plain class, no decorator: fleetpulse imports it by `import_path`, Ray wraps it in
`serve.deployment(...)`. Kept to the standard library on purpose: a replica imports this module
when it starts, and a wake from zero waits for that import, so it must not drag in the
benchmark's own dependencies (numpy, aiohttp, matplotlib).

- POST: echoes the body.
- GET: streams `?n=N` chunks of `?size=S` bytes (default 100 x 64 B), as fast as they go.
- `echo(value)`: the handle path, returns its argument.

Which request model it gets depends on the server: a starlette `Request` (Ray Serve, and
fleetpulse replicas that serve ASGI) or fleetpulse's own `Request` dataclass (a body attribute,
a generator return streams). The class answers whichever it is given, so the benchmark runs
unchanged on either fleetpulse HTTP path.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs

DEFAULT_CHUNKS = 100
DEFAULT_CHUNK_BYTES = 64


class BenchEcho:
    async def __call__(self, request: Any) -> Any:
        if hasattr(request, "scope"):  # starlette: the ASGI model
            return await self._asgi(request)
        if request.method == "GET":
            n, size = _stream_shape(request.query)
            return _chunks(n, size)
        return request.body

    async def _asgi(self, request: Any) -> Any:
        from starlette.responses import Response, StreamingResponse

        if request.method == "GET":
            n, size = _stream_shape(request.url.query)
            return StreamingResponse(_chunks(n, size), media_type="application/octet-stream")
        return Response(await request.body(), media_type="application/octet-stream")

    async def echo(self, value: Any) -> Any:
        return value


def _stream_shape(query: str) -> tuple[int, int]:
    q = parse_qs(query)
    n = int(q.get("n", [DEFAULT_CHUNKS])[0])
    size = int(q.get("size", [DEFAULT_CHUNK_BYTES])[0])
    return n, size


async def _chunks(n: int, size: int) -> AsyncIterator[bytes]:
    chunk = b"x" * size
    for _ in range(n):
        yield chunk

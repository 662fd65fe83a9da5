"""Deployments for the ASGI tests that the examples do not cover (loaded by import path)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import StreamingResponse


class Raising:
    async def __call__(self, request: Request) -> StreamingResponse:
        if request.url.path == "/midway":
            return StreamingResponse(self.breaks())
        raise ValueError("no")

    async def breaks(self) -> AsyncIterator[bytes]:
        yield b"first"
        await asyncio.sleep(0)
        raise RuntimeError("broke midway")


class HandleOnly:
    """Reached by handle only (no __call__), as Ray's composition examples' inner deployments."""

    def double(self, x: int) -> int:
        return 2 * x

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

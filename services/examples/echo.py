"""Example deployments: an echo server, a streamer, and a model-like service whose latency grows
with load. Used by the docs, `fleetpulse up` and the tests."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from fleetpulse.serve import Request, Response


class Echo:
    """Echoes what it gets. `__call__` serves the gateway/HTTP; the other methods serve handles."""

    def __init__(self, delay_s: float = 0.0, fail_health_file: str | None = None) -> None:
        self.delay_s = delay_s
        self.fail_health_file = fail_health_file

    async def __call__(self, request: Request) -> Response:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        headers = {"x-echo-method": request.method}
        return Response(body=await request.body(), headers=headers)

    async def echo(self, value: Any) -> Any:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return value

    async def sleep(self, seconds: float) -> float:
        await asyncio.sleep(seconds)
        return seconds

    def sync_echo(self, value: Any) -> Any:
        time.sleep(self.delay_s)
        return value

    async def count(self, n: int, delay_s: float = 0.0) -> AsyncIterator[int]:
        for i in range(n):
            if delay_s:
                await asyncio.sleep(delay_s)
            yield i

    def sync_count(self, n: int) -> Iterator[int]:
        yield from range(n)

    def fail(self, message: str) -> None:
        raise ValueError(message)

    def pid(self) -> int:
        return os.getpid()

    def check_health(self) -> None:
        if self.fail_health_file and os.path.exists(self.fail_health_file):
            raise RuntimeError("health file says fail")


async def echo_function(request: Request) -> bytes:
    return await request.body()

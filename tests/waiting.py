"""Waiting in tests for something to become true, with a message that says what did not."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any


async def eventually(
    check: Callable[[], Any],
    within_s: float = 10.0,
    what: str = "condition",
    *,
    every_s: float = 0.05,
) -> Any:
    """Until `check()` (a value or an awaitable) is truthy; returns that value."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if loop.time() > deadline:
            raise AssertionError(f"not within {within_s:g} s: {what}")
        await asyncio.sleep(every_s)

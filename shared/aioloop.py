"""The event loop every fleetpulse process runs on: uvloop where it is installed, else asyncio's.

One helper, so each service's entry point says `aioloop.run(serve(cfg))` instead of
`asyncio.run(...)` and the choice is made (and measured) in one place: uvloop's loop, its
transports and its timers are in C; nats-py, aiohttp, uvicorn and the subprocess and signal
handling the services use all run on it unchanged. Measured in docs/operations.md
("Replica footprint and wake from zero": scripts/bench/request.py, alternated runs).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on a uvloop loop when uvloop is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)

"""Retrying a service's startup steps while NATS is not ready yet.

A cluster that is still forming, or a KV bucket just created with three replicas, answers
"no response from stream" or times out for a few seconds. A service that gave up would have to be
restarted by someone; one that retries, saying so, comes up on its own. Refused credentials are
not retried: they do not get better.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from shared.errors import BusAuthError, BusError

T = TypeVar("T")

FIRST_DELAY_S = 0.5
MAX_DELAY_S = 5.0


async def retrying(
    what: str,
    step: Callable[[], Awaitable[T]],
    stop: asyncio.Event,
    log: logging.Logger,
    *,
    first_delay_s: float = FIRST_DELAY_S,
    max_delay_s: float = MAX_DELAY_S,
) -> T:
    """`await step()` until it succeeds; BusError (not BusAuthError) or TimeoutError are logged
    and retried with exponential backoff. Raises BusError if `stop` is set meanwhile."""
    delay = first_delay_s
    while True:
        try:
            return await step()
        except BusAuthError:
            raise
        except (BusError, TimeoutError) as exc:
            if stop.is_set():
                raise BusError(f"stopped before we could {what}") from exc
            log.warning("could not %s (%s); retrying in %.1f s", what, exc, delay)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
        if stop.is_set():
            raise BusError(f"stopped before we could {what}")
        delay = min(delay * 2, max_delay_s)

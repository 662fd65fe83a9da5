"""Mirror a KV bucket into a dict: its current values, then (live) every change.

`fleetpulse status` reads the control buckets with it once or live, and the proxy keeps its
registry with it; both are views of the same buckets, so the watch loop lives here once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final, TypeVar

from shared.bus import KV, Bus
from shared.errors import BucketNotFound, ConfigError, WireError

DEFAULT_RETRY_S: Final = 1.0
"""Pause between looks for a bucket not created yet (`fleetpulse status`'s default interval)."""

_V = TypeVar("_V")


async def existing_kv(bus: Bus, bucket: str) -> KV | None:
    """The bucket, or None when nobody created it yet (nothing deployed, no controller ran)."""
    try:
        return await bus.kv(bucket, create=False)
    except BucketNotFound:
        return None


async def follow(
    bus: Bus,
    bucket: str,
    decode: Callable[[bytes], _V],
    into: dict[str, _V],
    bad: dict[str, str],
    ready: asyncio.Event,
    *,
    live: bool,
    retry_s: float = DEFAULT_RETRY_S,
) -> None:
    """Fill `into` with the bucket's values and set `ready`; return then, or (`live`) keep
    applying changes until cancelled. A bucket not created yet is empty (retried while live)."""
    kv = await existing_kv(bus, bucket)
    while kv is None:
        ready.set()
        if not live:
            return
        await asyncio.sleep(retry_s)
        kv = await existing_kv(bus, bucket)
    watcher = await kv.watch()
    try:
        async for entry in watcher:
            if entry is None:
                ready.set()
                if not live:
                    return
                continue
            where = f"{bucket}/{entry.key}"
            bad.pop(where, None)
            into.pop(entry.key, None)
            if entry.op == "PUT":
                try:
                    into[entry.key] = decode(entry.value)
                except (WireError, ConfigError) as exc:
                    bad[where] = str(exc)
    finally:
        await watcher.stop()

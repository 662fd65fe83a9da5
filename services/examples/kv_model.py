"""A model server that reports its KV-cache use as a custom autoscaling metric.

Each request "generates" for a while and holds KV-cache blocks while it does; the share of the
cache in use is what a language-model server runs out of first, before its request count says
so. `record_autoscaling_stats()` (Ray Serve's name and contract) returns it, and the policy in
services/examples/kv_policy.py scales on it.

`kv_use_file` stands in for load the request count does not show (long sessions parked in the
cache, say): when given, the file's number (0..1) is added to the use, so a demo or a test can
move the metric without sending a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path


class KVModel:
    def __init__(
        self,
        cache_blocks: int = 64,
        blocks_per_request: int = 16,
        latency_s: float = 0.1,
        kv_use_file: str | None = None,
    ) -> None:
        self.cache_blocks = cache_blocks
        self.blocks_per_request = blocks_per_request
        self.latency_s = latency_s
        self.kv_use_file = None if kv_use_file is None else Path(kv_use_file)
        self.blocks_in_use = 0

    async def generate(self, prompt: str = "") -> dict[str, object]:
        self.blocks_in_use += self.blocks_per_request
        try:
            await asyncio.sleep(self.latency_s)
            return {"text": prompt[::-1], "pid": os.getpid()}
        finally:
            self.blocks_in_use -= self.blocks_per_request

    def kv_cache_use(self) -> float:
        use = self.blocks_in_use / self.cache_blocks
        if self.kv_use_file is not None:
            # no file (yet), or half written: only the requests' own use counts
            with contextlib.suppress(OSError, ValueError):
                use += float(self.kv_use_file.read_text() or 0)
        return min(use, 1.0)

    def record_autoscaling_stats(self) -> dict[str, float]:
        return {"kv_cache_use": self.kv_cache_use()}

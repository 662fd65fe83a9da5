"""The deployment scripts/bench/multiplex.py measures: a multiplexed model whose load costs real
time (an await standing for a download, plus building the model's weights in memory).

The cache bound comes from $BENCH_MAX_MODELS (the decorator takes a constant, as in Ray), the
load time from $BENCH_LOAD_MS and the model size from $BENCH_MODEL_KB, read at import.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from fleetpulse import serve
from fleetpulse.serve.multiplex import model_caches

MAX_MODELS = int(os.environ.get("BENCH_MAX_MODELS", "3"))
LOAD_S = float(os.environ.get("BENCH_LOAD_MS", "50")) / 1000.0
MODEL_BYTES = int(os.environ.get("BENCH_MODEL_KB", "256")) * 1024


class Model:
    def __init__(self, model_id: str) -> None:
        self.model_id = model_id
        self.weights = bytearray(os.urandom(64)) * (MODEL_BYTES // 64)

    def predict(self, x: int) -> int:
        return (self.weights[x % len(self.weights)] + x) & 0xFFFF


class Models:
    @serve.multiplexed(max_num_models_per_replica=MAX_MODELS)
    async def get_model(self, model_id: str) -> Model:
        await asyncio.sleep(LOAD_S)
        return Model(model_id)

    async def predict(self, x: int) -> int:
        """Model-aware: the model named by the request (`multiplexed_model_id`)."""
        model = await self.get_model(serve.get_multiplexed_model_id())
        return model.predict(x)

    async def predict_blind(self, model_id: str, x: int) -> int:
        """Model-blind: the same work, the model passed as an argument (the router cannot see
        it, so it routes by load alone)."""
        model = await self.get_model(model_id)
        return model.predict(x)

    async def __call__(self, request: Any) -> int:  # HTTP callers: the header names the model
        model = await self.get_model(serve.get_multiplexed_model_id())
        return model.predict(len(await request.body()))

    async def stats(self) -> dict[str, Any]:
        caches = list(model_caches(self).values())
        return {
            "loads": sum(c.loads for c in caches),
            "hits": sum(c.hits for c in caches),
            "evictions": sum(c.evictions for c in caches),
            "held": sorted(m for c in caches for m in c.models),
        }

    async def reset(self) -> None:
        for cache in model_caches(self).values():
            await cache.clear()
            cache.loads = cache.hits = cache.evictions = 0
            cache.load_seconds = 0.0

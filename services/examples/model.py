"""A model-like deployment for the demo: each request "infers" for a while, and inference slows
down as more requests share the replica (like a GPU batch that grows), so a replica has a real
capacity and autoscaling has something to fix."""

from __future__ import annotations

import asyncio
import json
import os

from fleetpulse.serve import Request, Response


class Model:
    def __init__(self, base_latency_s: float = 0.05, contention: float = 0.5) -> None:
        self.base_latency_s = base_latency_s
        self.contention = contention
        self.in_flight = 0

    async def predict(self, x: float) -> dict[str, float | int]:
        self.in_flight += 1
        try:
            # latency grows with the requests this replica is serving at once
            latency = self.base_latency_s * (1 + self.contention * (self.in_flight - 1))
            await asyncio.sleep(latency)
            return {"y": 2 * x, "latency_s": round(latency, 4), "pid": os.getpid()}
        finally:
            self.in_flight -= 1

    async def __call__(self, request: Request) -> Response:
        raw = await request.body()
        body = json.loads(raw) if raw else {}
        x = float(body.get("x", 1.0)) if isinstance(body, dict) else 1.0
        out = await self.predict(x)
        return Response(json.dumps(out), headers={"content-type": "application/json"})

"""The compose example app: a greeter, mounted into the agents at /apps (on their PYTHONPATH)."""

from __future__ import annotations

import asyncio
import json
import socket

from fleetpulse.serve import Request, Response


class Greeter:
    def __init__(self, greeting: str = "hello", delay_s: float = 0.0) -> None:
        self.greeting = greeting
        self.delay_s = delay_s

    async def __call__(self, request: Request) -> Response:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        name = request.query_params.get("name", "world")
        body = {"message": f"{self.greeting}, {name}", "host": socket.gethostname()}
        return Response(
            body=json.dumps(body).encode(), headers={"content-type": "application/json"}
        )

    def check_health(self) -> None:
        """Healthy while it can answer; a real app would check its model or database here."""

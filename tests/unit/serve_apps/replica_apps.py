"""Deployments the replica-side tests construct."""

from __future__ import annotations

from typing import Any

from fleetpulse import serve


@serve.deployment(user_config={"k": 1})
class Tunable:
    def __init__(self, downstream: Any = None) -> None:
        self.downstream = downstream
        self.context = serve.get_replica_context()
        self.configs: list[dict[str, Any]] = []

    def reconfigure(self, config: dict[str, Any]) -> None:
        if config.get("bad"):
            raise ValueError("bad config")
        self.configs.append(config)


@serve.deployment
class Plain:
    pass


@serve.deployment
class Front:
    def __init__(self, back: serve.DeploymentHandle) -> None:
        self.back = back

    async def chain(self, x: int) -> Any:
        return await self.back.echo.remote(self.back.echo.remote(x))

    def blocking(self, x: int) -> Any:
        return self.back.echo.remote(x).result(timeout_s=5)

    async def items(self, n: int) -> list[Any]:
        return [item async for item in self.back.options(stream=True).count.remote(n)]

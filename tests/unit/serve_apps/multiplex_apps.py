"""A multiplexed deployment as Ray's docs write one (the tests count its loads)."""

from __future__ import annotations

import asyncio
from typing import Any

from fleetpulse import serve


class Model:
    def __init__(self, model_id: str) -> None:
        self.model_id = model_id

    def predict(self, x: Any) -> dict[str, Any]:
        return {"model": self.model_id, "x": x}


@serve.deployment
class Models:
    def __init__(self, load_s: float = 0.0) -> None:
        self.load_s = load_s
        self.loaded: list[str] = []

    @serve.multiplexed(max_num_models_per_replica=2)
    async def get_model(self, model_id: str) -> Model:
        self.loaded.append(model_id)
        await asyncio.sleep(self.load_s)  # a download, a GPU upload
        return Model(model_id)

    async def __call__(self, x: Any) -> dict[str, Any]:
        model = await self.get_model(serve.get_multiplexed_model_id())
        return model.predict(x)

    def which(self) -> str:  # sync user code (a worker thread) sees the request's model too
        return serve.get_multiplexed_model_id()


@serve.deployment
class HttpModels:
    """Ray's docs' shape: the model id from the request header, the input from the body."""

    @serve.multiplexed(max_num_models_per_replica=2)
    async def get_model(self, model_id: str) -> Model:
        return Model(model_id)

    async def __call__(self, request: Any) -> dict[str, Any]:
        model = await self.get_model(serve.get_multiplexed_model_id())
        return model.predict(await request.json())


@serve.deployment
class Located(Models.func_or_class):  # type: ignore[misc,name-defined]
    """`Models` that also says where it runs and what it loaded (the integration tests)."""

    def where(self) -> dict[str, Any]:
        return {"replica": serve.get_replica_context().replica_id, "loaded": list(self.loaded)}

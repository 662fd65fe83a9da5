"""Composition through handles: an ingress calls a preprocessor and a model.

Ray Serve's model-composition example shape; porting it from Ray changed only the import line.
The preprocessor's response goes straight into the model call, unawaited: the handle resolves it
first, so the two stages chain without a round trip through the ingress's own code.
"""

from __future__ import annotations

import os

from fleetpulse import serve
from fleetpulse.serve.handle import DeploymentHandle


@serve.deployment
class Preprocessor:
    def transform(self, text: str) -> str:
        return " ".join(text.split()).lower()


@serve.deployment(max_ongoing_requests=8)
class Model:
    def __init__(self, weight: float) -> None:
        self.weight = weight

    async def predict(self, text: str) -> dict[str, object]:
        score = round(self.weight * len(text), 3)
        return {"text": text, "score": score, "pid": os.getpid()}


@serve.deployment
class Ingress:
    def __init__(self, preprocessor: DeploymentHandle, model: DeploymentHandle) -> None:
        self.preprocessor = preprocessor
        self.model = model

    async def __call__(self, request: serve.Request) -> dict[str, object]:
        cleaned = self.preprocessor.transform.remote((await request.body()).decode())
        result: dict[str, object] = await self.model.predict.remote(cleaned)
        return {**result, "via": serve.get_replica_context().deployment}


app = Ingress.bind(Preprocessor.bind(), Model.bind(weight=0.5))

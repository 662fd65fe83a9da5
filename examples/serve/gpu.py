"""A deployment that asks for a GPU: `ray_actor_options={"num_gpus": 1}`.

The controller places each replica on an agent offering a free device (`fleetpulse agent
--resource gpus=2`), and the agent starts it with `CUDA_VISIBLE_DEVICES` naming that device, so
two replicas on one agent see different devices. The replica only reports what it was given: no
GPU library is needed to run the example.
"""

from __future__ import annotations

import os
from typing import Any

from fleetpulse import serve


@serve.deployment(ray_actor_options={"num_gpus": 1}, num_replicas=2)
class Embedder:
    def __init__(self, model_id: str = "tiny-embedder") -> None:
        self.model_id = model_id
        self.devices = os.environ.get("CUDA_VISIBLE_DEVICES", "")

    def __call__(self, request: serve.Request) -> dict[str, Any]:
        return {
            "model_id": self.model_id,
            "cuda_visible_devices": self.devices,
            "replica_id": serve.get_replica_context().replica_id,
        }


app = Embedder.bind()

"""`user_config` and `reconfigure()`: the threshold changes without a restart.

Deploying the same config with another `user_config` calls `reconfigure()` on the running
replica (same process, same replica id); changing anything else rolls new replicas.
"""

from __future__ import annotations

import os
from typing import Any

from fleetpulse import serve


@serve.deployment(user_config={"threshold": 0.5})
class Classifier:
    def __init__(self) -> None:
        self.threshold = 0.0
        self.reconfigures = 0

    def reconfigure(self, config: dict[str, Any]) -> None:
        self.threshold = float(config["threshold"])
        self.reconfigures += 1

    def __call__(self, request: serve.Request) -> dict[str, Any]:
        x = float(request.query_params.get("x", "0"))
        return {
            "positive": x >= self.threshold,
            "threshold": self.threshold,
            "reconfigures": self.reconfigures,
            "pid": os.getpid(),
            "replica_id": serve.get_replica_context().replica_id,
        }


app = Classifier.bind()

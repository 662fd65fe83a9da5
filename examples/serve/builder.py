"""A builder function taking the config's `args`, and settings from `runtime_env.env_vars`.

`fleetpulse deploy` calls `app_builder(args)` where the code is, with the app's env_vars set (as
Ray Serve does), and the replicas run with the same env_vars.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from fleetpulse import serve


@dataclass
class GreeterArgs:
    greeting: str = "Hello"
    punctuation: str = "!"


@serve.deployment(num_replicas=1)
class Greeter:
    def __init__(self, greeting: str, punctuation: str, built_with_model: str) -> None:
        self.greeting = greeting
        self.punctuation = punctuation
        self.built_with_model = built_with_model

    async def __call__(self, request: serve.Request) -> dict[str, str]:
        name = (await request.body()).decode() or "world"
        return {
            "message": f"{self.greeting}, {name}{self.punctuation}",
            "model_id": os.environ.get("MODEL_ID", ""),
            "built_with_model": self.built_with_model,
            "app": serve.get_replica_context().app_name,
        }


def app_builder(args: GreeterArgs) -> serve.Application:
    return Greeter.bind(args.greeting, args.punctuation, os.environ.get("MODEL_ID", ""))

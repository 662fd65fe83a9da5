"""A deployment class for the GPU placement test: each call says which agent ran it and which
GPU devices its process was given (`CUDA_VISIBLE_DEVICES`, set by the agent)."""

from __future__ import annotations

import os
import sys


class Devices:
    def __call__(self, *args: object) -> dict[str, object]:
        argv = sys.argv
        agent = argv[argv.index("--agent-id") + 1] if "--agent-id" in argv else ""
        return {
            "pid": os.getpid(),
            "agent": agent,
            "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }

"""A deployment that writes where it runs (pid, working directory, sys.path, one variable) into
the file $FP_SPARE_TEST_OUT names: what tests/integration/test_spare_replicas.py checks a
replica started in a spare sees, against a cold start."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

OUT_ENV = "FP_SPARE_TEST_OUT"


class Where:
    def __init__(self) -> None:
        seen = {
            "pid": os.getpid(),
            "cwd": os.getcwd(),
            "path": sys.path,
            "marker": os.environ.get("FP_SPARE_TEST_MARKER"),
            "agent_only": os.environ.get("FP_SPARE_TEST_AGENT_ONLY"),
        }
        Path(os.environ[OUT_ENV]).write_text(json.dumps(seen))
        print("spare_app: constructed", flush=True)

    async def __call__(self) -> str:
        return "here"

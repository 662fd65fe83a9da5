"""A policy module whose import never finishes (the policy worker's import deadline is tested
with it). Never import it in the test process."""

from __future__ import annotations

while True:
    pass


def policy(ctx: object) -> int:  # pragma: no cover - never reached
    return 1

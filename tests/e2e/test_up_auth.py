"""`fleetpulse up --auth`: the demo runs with the auth callout on the embedded server."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.test_cli import fleetpulse

pytestmark = pytest.mark.e2e


def test_up_demo_with_auth_callout() -> None:
    res = fleetpulse("up", "--quick", "--auth", "--no-live", "--http-port", "0", timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "auth:  callout on" in res.stdout
    for step in ("woke from zero", "scaled up under load", "answered over HTTP"):
        assert f"✔ {step}" in res.stdout
    # the replicas got in with their own credentials, and nothing they did was refused
    log = Path(re.search(r"logs:\s+(\S+fleetpulse\.log)", res.stdout).group(1))  # type: ignore[union-attr]
    assert "refused connection" not in log.read_text()
    replica_logs = list((log.parent / "replicas").glob("*.log"))
    assert replica_logs
    for path in replica_logs:
        assert "ermissions violation" not in path.read_text(), path.name


def test_up_auth_needs_the_embedded_server() -> None:
    res = fleetpulse("up", "--auth", "--nats", "nats://127.0.0.1:1")
    assert res.returncode == 2 and "--auth configures the embedded server" in res.stderr

"""The `fleetpulse` command as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def fleetpulse(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def nats_servers() -> set[int]:
    out = subprocess.run(["pgrep", "-x", "nats-server"], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def test_help_lists_the_commands_that_exist() -> None:
    res = fleetpulse("--help")
    assert res.returncode == 0
    for command in ("up", "replica", "router", "controller"):
        assert command in res.stdout
    for command in ("up", "replica", "router", "controller"):
        sub = fleetpulse(command, "--help")
        assert sub.returncode == 0 and "usage: fleetpulse" in sub.stdout


def test_no_command_prints_help_and_fails() -> None:
    res = fleetpulse()
    assert res.returncode == 2 and "COMMAND" in res.stdout


@pytest.mark.integration
def test_up_starts_embedded_nats_prints_how_to_connect_and_stops_cleanly() -> None:
    before = nats_servers()
    res = fleetpulse("up", "--duration", "1.5")
    assert res.returncode == 0, res.stderr
    assert "NATS is ready at nats://127.0.0.1:" in res.stdout
    assert "fleetpulse replica --nats" in res.stdout
    assert nats_servers() <= before  # nothing left running


def test_replica_with_a_bad_import_path_says_what_is_wrong() -> None:
    res = fleetpulse(
        "replica",
        "--nats",
        "nats://127.0.0.1:1",
        "--app",
        "a",
        "--deployment",
        "d",
        "--import-path",
        "no_such_module:Thing",
    )
    assert res.returncode == 2
    assert "cannot import module 'no_such_module'" in res.stderr


def test_replica_with_a_bad_name_says_what_is_allowed() -> None:
    res = fleetpulse("replica", "--app", "bad.name", "--deployment", "d", "--import-path", "m:X")
    assert res.returncode == 2
    assert "invalid app 'bad.name'" in res.stderr

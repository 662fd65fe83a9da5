"""The `fleetpulse` command as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


def test_help_lists_the_commands_that_exist() -> None:
    res = fleetpulse("--help")
    assert res.returncode == 0
    commands = ("up", "replica", "router", "controller", "agent", "deploy", "delete", "status")
    for command in commands:
        assert command in res.stdout
    for command in commands:
        sub = fleetpulse(command, "--help")
        assert sub.returncode == 0 and "usage: fleetpulse" in sub.stdout


def test_no_command_prints_help_and_fails() -> None:
    res = fleetpulse()
    assert res.returncode == 2 and "COMMAND" in res.stdout


def test_up_help_explains_the_demo_options() -> None:
    res = fleetpulse("up", "--help")
    assert res.returncode == 0
    for flag in ("--config", "--forever", "--quick", "--nats"):
        assert flag in res.stdout


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

"""Replica child processes: spawn with a log file, signal, reap.

How it works: each replica runs as its own process (`subprocess.Popen`, no pipes: stdout and
stderr go to a per-replica log file, so a chatty replica can never block on a full pipe). Children
start in their own session, so a Ctrl-C at the agent's terminal reaches the agent alone and the
agent drains them in order; and they carry `PR_SET_PDEATHSIG(SIGKILL)` (Linux), so they die with
the agent even when the agent is SIGKILLed. `poll()` reaps without blocking and returns who
exited, with the exit code (negative: killed by that signal); the agent calls it every tick.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., Any] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., Any] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


_PRCTL = _load_prctl()


def die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn that makes the child get SIGKILL when this process dies (None if impossible).

    The death signal fires when the *thread* that forked exits, so it is only armed when forking
    from the main thread, which lives as long as the process."""
    if _PRCTL is None or threading.current_thread() is not threading.main_thread():
        return None
    prctl = _PRCTL
    parent = os.getpid()
    sigkill = int(signal.SIGKILL)

    def setup() -> None:
        prctl(_PR_SET_PDEATHSIG, sigkill, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return setup


def child_env(base: Mapping[str, str], pythonpath: Sequence[str]) -> dict[str, str]:
    """The replicas' environment: `base`, extra PYTHONPATH entries first, unbuffered output
    (so a log file shows a crash's last lines)."""
    env = dict(base)
    inherited = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    paths = [*pythonpath, *(p for p in inherited if p not in pythonpath)]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class ChildProcesses:
    """The replica processes of one agent, by replica id."""

    def __init__(self, *, cwd: str, env: Mapping[str, str], log_dir: Path) -> None:
        self._cwd = cwd
        self._env = dict(env)
        self.log_dir = log_dir
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def start(self, replica_id: str, argv: Sequence[str], log_name: str) -> int:
        """Spawn; returns the pid. Raises OSError if the process cannot be started."""
        if replica_id in self._procs:
            raise ValueError(f"replica {replica_id!r} already has a process")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path(log_name), "ab") as out:  # the child keeps its own copy
            proc = subprocess.Popen(
                list(argv),
                cwd=self._cwd,
                env=self._env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent(),
                close_fds=True,
            )
        self._procs[replica_id] = proc
        return proc.pid

    def signal(self, replica_id: str, sig: signal.Signals) -> bool:
        """Send `sig`; False if there is no such live process (it exited meanwhile)."""
        proc = self._procs.get(replica_id)
        if proc is None or proc.poll() is not None:
            return False
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            return False
        return True

    def poll(self) -> list[tuple[str, int]]:
        """Reap what exited since the last call: (replica id, exit code) pairs."""
        done = []
        for rid, proc in list(self._procs.items()):
            code = proc.poll()
            if code is not None:
                del self._procs[rid]
                done.append((rid, code))
        return done

    def pid(self, replica_id: str) -> int | None:
        proc = self._procs.get(replica_id)
        return proc.pid if proc is not None else None

    def pids(self) -> dict[str, int]:
        return {rid: p.pid for rid, p in self._procs.items()}

    def __len__(self) -> int:
        return len(self._procs)

    def kill_all(self) -> None:
        """Last resort on the way out: SIGKILL and reap whatever is left."""
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self._procs.values():
            try:
                proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                log.error("replica process %d survived SIGKILL", proc.pid)

"""Replica child processes: spawn with a log file, signal, reap.

How it works: each replica runs as its own process (`subprocess.Popen`, no pipes: stdout and
stderr go to a per-replica log file, so a chatty replica can never block on a full pipe). Children
start in their own session, so a Ctrl-C at the agent's terminal reaches the agent alone and the
agent drains them in order; and they carry `PR_SET_PDEATHSIG(SIGKILL)` (Linux), so they die with
the agent even when the agent is SIGKILLed. `poll()` reaps without blocking and returns who
exited, with the exit code (negative: killed by that signal); the agent calls it every tick.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from shared.metrics_catalog import ENV_METRICS_PORT
from shared.natsauth import NatsAuth, scrubbed_env
from shared.procutil import die_with_parent

from .spare import Spares

log = logging.getLogger(__name__)


def child_env(
    base: Mapping[str, str], pythonpath: Sequence[str], auth: NatsAuth | None = None
) -> dict[str, str]:
    """The replicas' environment: `base` without any NATS identity of the agent's, the
    replicas' own (`auth`) instead, extra PYTHONPATH entries first, unbuffered output (so a log
    file shows a crash's last lines)."""
    env = scrubbed_env(base)
    env.update((auth or NatsAuth()).to_env())
    # the agent's metrics port: every replica inheriting it would fight over one port
    env.pop(ENV_METRICS_PORT, None)
    inherited = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    paths = [*pythonpath, *(p for p in inherited if p not in pythonpath)]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class ChildProcesses:
    """The replica processes of one agent, by replica id."""

    def __init__(
        self, *, cwd: str, env: Mapping[str, str], log_dir: Path, spares: Spares | None = None
    ) -> None:
        self._cwd = cwd
        self._env = dict(env)
        self.log_dir = log_dir
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self.spares = spares
        """Interpreters started ahead (spare.py): a replica starts in one when it can."""

    def pythonpath(self, first: Sequence[str]) -> str:
        """The replicas' PYTHONPATH with `first` ahead of it (a runtime_env's import roots)."""
        rest = [p for p in self._env.get("PYTHONPATH", "").split(os.pathsep) if p]
        return os.pathsep.join([*first, *(p for p in rest if p not in first)])

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def start(
        self,
        replica_id: str,
        argv: Sequence[str],
        log_name: str,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> int:
        """Spawn (with `env` over the agent's child environment, in `cwd` or the agent's
        working directory); returns the pid. Raises OSError if it cannot be started."""
        if replica_id in self._procs:
            raise ValueError(f"replica {replica_id!r} already has a process")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        full_env = {**self._env, **env} if env else self._env
        if self.spares is not None:
            spare = self.spares.take(
                argv, full_env, cwd or self._cwd, self.log_path(log_name), time.monotonic()
            )
            if spare is not None:
                self._procs[replica_id] = spare
                return spare.pid
        with open(self.log_path(log_name), "ab") as out:  # the child keeps its own copy
            proc = subprocess.Popen(
                list(argv),
                cwd=cwd or self._cwd,
                env=full_env,
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
        if self.spares is not None:
            self.spares.close()
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self._procs.values():
            try:
                proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                log.error("replica process %d survived SIGKILL", proc.pid)

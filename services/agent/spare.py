"""Spare replica processes: interpreters started ahead, their imports done, for the next replica.

How it works: a replica's cold start is mostly an interpreter start and its imports (~0.2-0.3 s
on a small machine, the longest hop of a wake from zero). The agent keeps `count` spares
(`python -m services.replica.spare`, services/replica/spare.py), started like any replica (own
session, die with the agent, the agent's child environment) with stdin a pipe. To start a
replica, `take()` hands the next live spare the replica's arguments, environment, directory and
log file as one JSON line and returns the process, which becomes that replica; the agent then
tracks it as it tracks a process it spawned. A spare is used only where the replica would have
started the same way: the spare's interpreter and `-m services.replica`, the same PYTHON*
start-up variables and the same working directory (a runtime_env's own interpreter, import roots
or working_dir: a cold start, so its modules shadow installed ones as they would). Otherwise, or when no spare is live,
`take()` returns None and the agent spawns as before. A spare used is replaced `refill_after_s`
later (`refill()`, each agent tick), so the new spare's imports do not compete for the CPU with
the replica that is starting. `close()` retires them; a spare whose agent is gone exits (EOF on stdin, or its death signal).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from shared.procutil import die_with_parent

log = logging.getLogger(__name__)

SPARE_MODULE = "services.replica.spare"
REPLICA_MODULE = "services.replica"
REFILL_AFTER_S = 1.0
"""A used spare is replaced this long after: the replica it became is importing user code."""
RETRY_AFTER_S = 10.0
"""After a spare died unused, the next one waits this long."""
CMDLINE_ROOM = 4096
"""Padding on a spare's command line: room for the replica's arguments, which the spare writes
there when it becomes the replica, so `ps` and /proc show a replica like any other."""


def same_start(spare_env: Mapping[str, str], env: Mapping[str, str]) -> bool:
    """Whether an interpreter started with `spare_env` starts as one started with `env` would:
    the PYTHON* variables it reads at start-up agree, PYTHONPATH included (a runtime_env's
    import roots come before site-packages: a module of the same name there must win over the
    one the spare already imported, so such a replica starts cold)."""
    keys = {k for k in (*spare_env, *env) if k.startswith("PYTHON")}
    return all(spare_env.get(k) == env.get(k) for k in keys)


class Spares:
    """Up to `count` spare replica processes of one agent."""

    def __init__(
        self,
        *,
        python: str,
        cwd: str,
        env: Mapping[str, str],
        log_path: Path,
        count: int = 1,
        refill_after_s: float = REFILL_AFTER_S,
    ) -> None:
        self.python, self._cwd, self._env = python, cwd, dict(env)
        self.log_path = log_path
        """Where the spares' own output goes (import errors), until one becomes a replica."""
        self.count = count
        self.refill_after_s = refill_after_s
        self._spares: list[subprocess.Popen[bytes]] = []
        self._due = 0.0
        self.taken = 0
        """Replicas started in a spare."""
        self.died = 0
        """Spares that exited before use."""

    def refill(self, now: float) -> None:
        """Start spares up to `count`, unless one was taken lately. A spare that died unused
        (it could not import what a replica imports: the replicas will fail the same way) is
        dropped and logged, and the next one waits `RETRY_AFTER_S`: no spawn loop."""
        alive = []
        for proc in self._spares:
            code = proc.poll()
            if code is None:
                alive.append(proc)
                continue
            self.died += 1
            self._due = max(self._due, now + RETRY_AFTER_S)
            log.warning(
                "spare replica process %d exited with %d before use (see %s); next in %g s",
                proc.pid, code, self.log_path, RETRY_AFTER_S,
            )  # fmt: skip
        self._spares = alive
        if now < self._due:
            return
        while len(self._spares) < self.count:
            try:
                self._spares.append(self._spawn())
            except OSError as exc:
                log.warning("no spare replica process: %s", exc)
                self._due = now + self.refill_after_s
                return

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:  # the child keeps its own copy
            return subprocess.Popen(
                [self.python, "-m", SPARE_MODULE, " " * CMDLINE_ROOM],
                cwd=self._cwd,
                env=self._env,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent(),
                close_fds=True,
            )

    def take(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str,
        log_file: Path,
        now: float,
    ) -> subprocess.Popen[bytes] | None:
        """A live spare, now running the replica `argv` (with exactly `env`, in `cwd`, its
        output appended to `log_file`), or None: start it the usual way."""
        if list(argv[:3]) != [self.python, "-m", REPLICA_MODULE]:
            return None
        if not same_start(self._env, env) or os.path.abspath(cwd) != os.path.abspath(self._cwd):
            return None  # a working_dir is first on sys.path: the same shadowing as PYTHONPATH
        order = {
            "args": list(argv[3:]),
            "env": dict(env),
            "cwd": os.path.abspath(cwd),  # the spare's own directory is not ours
            "log": os.path.abspath(log_file),
        }
        line = json.dumps(order).encode() + b"\n"
        while self._spares:
            proc = self._spares.pop(0)
            if proc.poll() is not None:
                continue
            assert proc.stdin is not None
            try:
                proc.stdin.write(line)
                proc.stdin.close()
            except OSError:  # it died meanwhile: the next one, or a cold start
                proc.kill()
                proc.wait()
                continue
            self.taken += 1
            self._due = now + self.refill_after_s
            return proc
        return None

    def pids(self) -> list[int]:
        return [p.pid for p in self._spares]

    def close(self) -> None:
        """Retire every spare (killed: a spare holds nothing; and none starts after this)."""
        spares, self._spares = self._spares, []
        for proc in spares:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdin is not None:
                proc.stdin.close()
        self._due = float("inf")

"""The member's side of its policy worker: custom policies run in a child process, each call
under a deadline (the I/O shell around custom_policy.py; the worker is policy_worker.py).

How it works. A policy is user code: one that never returns (`while True: pass`, a sleep, a C
loop holding the GIL) must not stop the control loop, and a Python thread can neither be killed
nor keep a busy loop from taking the GIL from the loop. So the member runs its policies in one
worker process, started at the first custom policy's first call, and kills it when a call
overruns. The worker goes through

    (none) --start--> starting --ready--> idle <--> importing
       ^                                    |
       +---- killed (a deadline passed) or died (a policy took it down) ----+

`ProcessRunner.run(calls)` is the core's PolicyRunner, called once per tick with the tick's calls:
1. What the worker sent since the last tick (ready, imports done) is read without waiting.
2. Calls whose import failed are answered `not_loaded` (tried again RELOAD_AFTER_S later); with no
   idle worker (starting, importing) the rest are answered `unavailable` at once: the default
   policy decides them this tick and the loop does not wait. A worker past its start or import
   deadline is killed; the import that was running is the culprit (its next call: `timeout`).
3. Idle: the calls of policies this worker has imported go as one batch, suspects (a strike last
   time) last; the others are answered `unavailable` and their imports are sent after the batch.
   The loop waits for the answers, which come together at the end of the batch (and before the
   first suspect), one wakeup per tick. Each call's deadline is `timeout_s` after it started, as
   the worker stamps it in a shared memory slot (row and start time) before each call. The call
   running at its deadline timed out (`timeout`); if the worker died meanwhile, the call it was
   running crashed it (`crashed`); the calls whose answers did not come out are answered
   `unavailable`. The worker is killed with SIGKILL and a new one started at once; it takes calls
   again from its ready message on. The core quarantines a policy that keeps doing that.

So one hanging policy costs the loop `timeout_s` per strike (three before its quarantine), and
the other custom policies a worker restart each time (falling back to the default policy
meanwhile); built-in policies never come here. The policies' state is kept here as the bytes the
worker pickled, so a restart loses none. The worker dies with the member (PR_SET_PDEATHSIG) and
`close` kills it at shutdown.
"""

from __future__ import annotations

import contextlib
import logging
import math
import mmap
import os
import pickle
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any, Final

import msgpack

from shared import settings
from shared.appconfig import AutoscalingConfig
from shared.procutil import die_with_parent

from .custom_policy import (
    CRASHED,
    NOT_LOADED,
    OUTCOMES,
    RELOAD_AFTER_S,
    TELEMETRY,
    TIMEOUT,
    UNAVAILABLE,
    Answer,
    PolicyCall,
    PolicyTelemetry,
)
from .policy_worker import HEADER, MAX_FRAME, PROGRESS

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S: Final[float] = settings.CONTROLLER_POLICY_TIMEOUT.default
"""A custom policy call's deadline unless the operator sets one (--custom-policy-timeout-s)."""
START_TIMEOUT_S: Final = 30.0
"""A worker not ready this long after its start is killed (an interpreter starts in < 1 s)."""
IMPORT_TIMEOUT_S: Final = 30.0
"""An import running this long in the worker is killed with it, and counts as a timeout."""
RESTART_BACKOFF_S: Final = (1.0, 30.0)
"""A worker that dies before it is ready is started again after 1 s, doubling up to 30 s."""
MAX_CONFIGS: Final = 4096
"""Configs the worker keeps by slot; past this (many redeploys) both sides start over."""
REAP_S: Final = 0.2
"""How long to wait for a killed or dead worker's exit status before reporting without it."""

WORKER_MODULE: Final = "services.controller.policy_worker"


class _Worker:
    """One worker process and its two pipes (the member's ends are non-blocking)."""

    def __init__(
        self, proc: subprocess.Popen[bytes], to_fd: int, from_fd: int, progress: mmap.mmap
    ) -> None:
        self.proc, self.to_fd, self.from_fd = proc, to_fd, from_fd
        self._progress = progress
        self.out = bytearray()
        self.inbuf = bytearray()
        self.ready = False
        self.dead = False
        self.deadline = 0.0
        """Start, or import, deadline (monotonic)."""
        self.loaded: set[str] = set()
        self.loading: list[str] = []
        self.configs: dict[int, tuple[AutoscalingConfig, int]] = {}
        """id(config) -> (config, slot): the config is kept so its id is not reused."""
        self.poller = select.poll()
        self.poller.register(from_fd, select.POLLIN)

    def send(self, message: tuple[Any, ...]) -> None:
        payload = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
        self.out += HEADER.pack(len(payload))
        self.out += payload

    def pump(self, wait_s: float) -> list[list[Any]]:
        """Write what is pending and read what arrived, waiting up to `wait_s` for something."""
        if self.dead:
            return []
        if self.out:
            self.poller.register(self.to_fd, select.POLLOUT)
        try:
            ready = self.poller.poll(math.ceil(wait_s * 1000) if wait_s > 0 else 0)
        finally:
            if self.out:
                self.poller.unregister(self.to_fd)
        for fd, _ in ready:
            if fd == self.to_fd:
                self._write()
            else:
                self._read()
        return self._frames()

    def _write(self) -> None:
        try:
            n = os.write(self.to_fd, self.out)
        except BlockingIOError:
            return
        except OSError:  # EPIPE: it is gone
            self.dead = True
            return
        del self.out[:n]

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.from_fd, 1 << 16)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                self.dead = True
                return
            self.inbuf += chunk

    def _frames(self) -> list[list[Any]]:
        out = []
        buf = self.inbuf
        while len(buf) >= HEADER.size:
            (size,) = HEADER.unpack_from(buf)
            if size > MAX_FRAME:
                self.dead = True
                break
            if len(buf) < HEADER.size + size:
                break
            try:
                message = msgpack.unpackb(bytes(buf[HEADER.size : HEADER.size + size]))
            except Exception:  # the stream is broken: nothing after it can be trusted
                self.dead = True
                break
            del buf[: HEADER.size + size]
            if not isinstance(message, list) or not message:
                self.dead = True
                break
            out.append(message)
        return out

    def progress(self) -> tuple[int, int, float]:
        """(batch serial, row, monotonic start) of the call the worker runs: read until two
        reads agree, as the worker may be writing it."""
        before = PROGRESS.unpack_from(self._progress)
        while True:
            now = PROGRESS.unpack_from(self._progress)
            if now == before:
                return now
            before = now

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.close_pipes()
        self.dead = True

    def close_pipes(self) -> None:
        for fd in (self.to_fd, self.from_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.to_fd = self.from_fd = -1
        self._progress.close()

    def exit_status(self) -> str:
        """How it ended, as far as known within REAP_S."""
        try:
            code = self.proc.wait(REAP_S)
        except subprocess.TimeoutExpired:
            return "exit status not known yet"
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-code).name}"
        return f"exit code {code}"


def _answer(message: list[Any]) -> Answer | None:
    """An answer frame as an Answer, or None if it is not one (a broken worker)."""
    if len(message) != 6 or message[0] != "answer":
        return None
    _, outcome, count, state, detail, seconds = message
    if outcome not in OUTCOMES or not isinstance(count, int) or count < 0:
        return None
    if not isinstance(state, bytes | None) or not isinstance(detail, str):
        return None
    if not isinstance(seconds, float | None):
        return None
    return Answer(outcome, count, state, detail, seconds)


class ProcessRunner:
    """Runs custom policies in a worker process, each call under `timeout_s`."""

    def __init__(
        self,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        *,
        import_timeout_s: float = IMPORT_TIMEOUT_S,
        start_timeout_s: float = START_TIMEOUT_S,
        telemetry: PolicyTelemetry = TELEMETRY,
    ) -> None:
        self.timeout_s = timeout_s
        self._import_timeout_s, self._start_timeout_s = import_timeout_s, start_timeout_s
        self._telemetry = telemetry
        self._clock = time.monotonic  # the worker stamps the calls it starts with this clock
        self._worker: _Worker | None = None
        self._dying: list[_Worker] = []
        self._start_at = -math.inf
        self._backoff = RESTART_BACKOFF_S[0]
        self._why = "the policy worker is starting"
        self._failed: dict[str, tuple[str, float]] = {}
        """path -> (why, when) of its last failed import (any worker)."""
        self._verdicts: dict[str, Answer] = {}
        """A strike for a path whose import hung or crashed the worker, for its next calls."""
        self._slots = 0
        self._serial = 0
        self.closed = False

    @property
    def pid(self) -> int | None:
        """The current worker's pid (tests look for it after shutdown)."""
        return self._worker.proc.pid if self._worker is not None else None

    def run(self, calls: Sequence[PolicyCall]) -> list[Answer]:
        if not calls:
            return []
        w = self._idle_worker()
        now = self._clock()
        verdicts, self._verdicts = self._verdicts, {}
        answers: list[Answer | None] = [None] * len(calls)
        batch: list[int] = []
        to_load: list[str] = []
        for i, c in enumerate(calls):
            verdict = verdicts.get(c.path)
            failed = self._failed.get(c.path)
            if verdict is not None:
                answers[i] = verdict
            elif failed is not None and now < failed[1] + RELOAD_AFTER_S:
                answers[i] = Answer(NOT_LOADED, detail=failed[0])
            elif w is None:
                answers[i] = Answer(UNAVAILABLE, detail=self._why)
            elif c.path in w.loaded:
                batch.append(i)
            else:
                if c.path not in to_load:
                    to_load.append(c.path)
                answers[i] = Answer(UNAVAILABLE, detail=f"importing {c.path} in the policy worker")
        if w is not None and batch:
            self._call(w, calls, batch, answers)
        if w is not None and to_load and self._worker is w:
            for path in to_load:
                self._failed.pop(path, None)
            w.send(("load", to_load))
            w.loading = to_load
            w.deadline = self._clock() + self._import_timeout_s
            w.pump(0.0)
            self._why = f"the policy worker is importing {', '.join(to_load)}"
        return [a if a is not None else Answer(UNAVAILABLE, detail=self._why) for a in answers]

    def close(self) -> None:
        """Kill the worker and reap every worker process (shutdown)."""
        self.closed = True
        if self._worker is not None:
            self._worker.kill()
            self._dying.append(self._worker)
            self._worker = None
        for w in self._dying:
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(5.0)
        self._dying.clear()

    # -- the worker's life -----------------------------------------------------------------

    def _idle_worker(self) -> _Worker | None:
        """The worker, if it is idle and can take calls now; else None (with `_why` set)."""
        self._reap()
        w = self._worker
        if w is None:
            if self.closed or self._clock() < self._start_at:
                return None
            self._start()
            return None
        for message in w.pump(0.0):
            self._on_message(w, message)
        now = self._clock()
        if w.dead:
            self._lost(w, "crashed", f"the policy worker died ({w.exit_status()})")
        elif not w.ready and now > w.deadline:
            why = f"the policy worker did not start within {self._start_timeout_s:g} s"
            self._lost(w, "start_timeout", why)
        elif w.loading and now > w.deadline:
            self._lost(
                w, "import_timeout", f"an import ran longer than {self._import_timeout_s:g} s"
            )
        if self._worker is not w or not w.ready or w.loading:
            return None
        return w

    def _start(self) -> None:
        to_child, to_fd = os.pipe()
        from_fd, from_child = os.pipe()
        progress_fd = os.memfd_create("fleetpulse-policy-progress")
        os.ftruncate(progress_fd, PROGRESS.size)
        progress = mmap.mmap(progress_fd, PROGRESS.size)
        PROGRESS.pack_into(progress, 0, -1, -1, 0.0)
        child = (to_child, from_child, progress_fd)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", WORKER_MODULE, *map(str, child)],
                pass_fds=child,
                stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent(),
            )
        except OSError as exc:
            os.close(to_fd)
            os.close(from_fd)
            progress.close()
            self._telemetry.restarts["start_failed"] += 1
            self._back_off(f"the policy worker cannot start: {exc}")
            log.warning("cannot start the custom policy worker: %s", exc)
            return
        finally:
            for fd in child:
                with contextlib.suppress(OSError):
                    os.close(fd)
        os.set_blocking(to_fd, False)
        os.set_blocking(from_fd, False)
        w = self._worker = _Worker(proc, to_fd, from_fd, progress)
        w.deadline = self._clock() + self._start_timeout_s
        w.send(("path", list(sys.path)))
        w.pump(0.0)
        self._why = "the policy worker is starting"
        log.info("custom policy worker started (pid %d)", proc.pid)

    def _on_message(self, w: _Worker, message: list[Any]) -> None:
        kind = message[0]
        if kind == "ready":
            w.ready = True
        elif kind == "loaded" and len(message) == 3 and message[1] in w.loading:
            _, path, error = message
            w.loading.remove(path)
            if isinstance(error, str):
                self._failed[path] = (error, self._clock())
                log.warning("custom policy %s does not import: %s", path, error)
            else:
                w.loaded.add(path)
        else:
            w.dead = True  # not something it says while idle: the stream is broken

    def _lost(self, w: _Worker, reason: str, why: str) -> None:
        """The worker is dead or past a deadline outside a call: blame the import it ran, if
        any, and replace it."""
        if w.loading:
            path = w.loading[0]
            outcome = TIMEOUT if reason == "import_timeout" else CRASHED
            detail = f"{why} importing it"
            self._verdicts[path] = Answer(outcome, detail=detail)
            self._failed[path] = (detail, self._clock())
            log.warning("custom policy %s: %s; the worker is restarted", path, detail)
            self._replace(w, reason, at_once=True)
        else:  # nothing to blame (it died idle, or never started): do not fork in a loop
            log.warning("custom policy worker: %s; it is restarted", why)
            self._replace(w, reason, at_once=False)

    def _replace(self, w: _Worker, reason: str, *, at_once: bool) -> None:
        w.kill()
        self._dying.append(w)
        self._worker = None
        self._telemetry.restarts[reason] += 1
        if at_once:  # the culprit is known: its strikes, not a backoff, bound the restarts
            self._start_at = self._clock()
            self._start()
        else:
            self._back_off(f"the policy worker restarts ({reason})")

    def _back_off(self, why: str) -> None:
        self._start_at = self._clock() + self._backoff
        self._backoff = min(self._backoff * 2, RESTART_BACKOFF_S[1])
        self._why = why

    def _reap(self) -> None:
        self._dying = [w for w in self._dying if w.proc.poll() is None]

    # -- one tick's batch ------------------------------------------------------------------

    def _call(
        self,
        w: _Worker,
        calls: Sequence[PolicyCall],
        batch: list[int],
        answers: list[Answer | None],
    ) -> None:
        order = sorted(batch, key=lambda i: calls[i].suspect)  # stable: suspects last
        forget = len(w.configs) + len(order) > MAX_CONFIGS
        if forget:
            w.configs.clear()
        new: dict[int, AutoscalingConfig] = {}
        rows = [self._row(w, calls[i], new) for i in order]
        flush_at = next((k for k, i in enumerate(order) if calls[i].suspect), len(order))
        self._serial += 1
        serial = self._serial
        w.send(("call", serial, forget, new, rows, flush_at))
        sent = self._clock()
        got, running = 0, 0
        while got < len(order):
            running, deadline = self._running(w, serial, got, sent)
            for message in w.pump(max(0.0, deadline - self._clock())):
                answer = _answer(message)
                if answer is None:
                    w.dead = True
                    break
                answers[order[got]] = answer
                got += 1
            if w.dead or got == len(order):
                break
            running, deadline = self._running(w, serial, got, sent)
            if self._clock() >= deadline:
                break
        self._telemetry.batches.append(self._clock() - sent)
        if got == len(order):
            self._backoff = RESTART_BACKOFF_S[0]  # a worker that answers is a healthy start
            return
        if w.dead:
            running, _ = self._running(w, serial, got, sent)  # where it stopped, for good
            outcome, reason = CRASHED, "crashed"
            detail = f"the policy worker died during the call ({w.exit_status()})"
        else:
            outcome, reason = TIMEOUT, "timeout"
            detail = f"no answer within {self.timeout_s:g} s (the worker was killed)"
        culprit = calls[order[running]].path
        answers[order[running]] = Answer(outcome, detail=detail)
        log.warning("custom policy %s: %s; the worker is restarted", culprit, detail)
        self._replace(w, reason, at_once=True)
        self._why = f"the policy worker restarts: {culprit} {outcome}"

    def _running(self, w: _Worker, serial: int, got: int, sent: float) -> tuple[int, float]:
        """The row of the batch the worker runs now (as far as known: the first unanswered)
        and its deadline."""
        at, index, started = w.progress()
        if at == serial and index >= got:
            return index, started + self.timeout_s
        return got, sent + self.timeout_s  # not started on the batch yet (still reading it)

    def _row(self, w: _Worker, c: PolicyCall, new: dict[int, AutoscalingConfig]) -> tuple[Any, ...]:
        ctx = c.ctx
        cfg = ctx.config
        known = w.configs.get(id(cfg))
        if known is None or known[0] is not cfg:
            self._slots += 1
            known = w.configs[id(cfg)] = (cfg, self._slots)
            new[self._slots] = cfg
        metrics = [(k, m.total, m.mean, m.replicas) for k, m in ctx.custom_metrics.items()]
        state = c.state if isinstance(c.state, bytes) else None
        return (
            c.path, ctx.app_name, ctx.deployment_name, ctx.current_num_replicas,
            ctx.target_num_replicas, ctx.total_num_requests, ctx.total_queued_requests, metrics,
            ctx.capacity_adjusted_min_replicas, ctx.capacity_adjusted_max_replicas,
            ctx.current_time, known[1], ctx.window_full, state,
        )  # fmt: skip

"""The local system `serve.run` starts on first use: nats-server, controller, agent and proxy.

    script ──pipe──▶ supervisor (python -m fleetpulse.serve.localsystem, own session)
                       ├─ nats-server (JetStream, a temp store)
                       ├─ python -m services.controller --nats URL
                       ├─ python -m services.agent --nats URL ──▶ replicas
                       └─ python -m services.proxy --nats URL --port P   (HTTP, Ray's 8000)

How it works: the script starts one supervisor process in a session of its own (so a Ctrl-C at
the terminal reaches the script only, which decides) and hands it the read end of a pipe whose
write end only the script holds. The supervisor starts the services as `fleetpulse up` runs them,
but as processes (the user package imports no service), waits until the proxy accepts
connections, and writes `system.json` (the NATS URL, the HTTP address) in the state directory;
the script waits for that file. Then the supervisor waits on the pipe. End of file means the
script is gone or done, however it ended: a return, an exception, Ctrl-C, even SIGKILL (the
kernel closes a dead process's descriptors). It then stops the proxy, the agent (which drains
its replicas) and the controller with SIGTERM, SIGKILLs what outlives the grace, stops
nats-server and removes the state directory.

No orphans either way: each child of the supervisor is armed with PR_SET_PDEATHSIG (Linux), as
are the agent's replicas and the server, so a SIGKILLed supervisor takes them all with it; and
the script arms the supervisor itself (SIGTERM, a graceful stop) when it starts it from its main
thread. A service that dies early fails the start with the tail of its log.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from shared.natsserver import NatsServer
from shared.procutil import die_with_parent

SYSTEM_FILE = "system.json"
FAILED_FILE = "failed.txt"
DIED_FILE = "died.txt"
START_TIMEOUT_S = 60.0
STOP_GRACE_S = 30.0
"""How long the services may take to stop (the agent drains replicas) before SIGKILL."""
PROXY_DRAIN_S = "2"
MAX_REPLICAS = "32"
"""The local agent's capacity: Ray's docs scale to 10 replicas; a replica reserves no CPU."""
LOG_TAIL_CHARS = 2000


class StartError(RuntimeError):
    """The local system did not come up; the message says which part and shows its log."""


@dataclass(frozen=True, slots=True)
class SystemInfo:
    nats_url: str
    http_host: str
    http_port: int
    state_dir: Path

    @property
    def http_url(self) -> str:
        return f"http://{self.http_host}:{self.http_port}"


class LocalSystem:
    """The script's side: start the supervisor, wait until the system is up, stop it."""

    def __init__(
        self, http_host: str, http_port: int, *, state_dir: Path, workdir: str, pythonpath: str
    ) -> None:
        self.http_host, self.http_port = http_host, http_port
        self.workdir, self.pythonpath = workdir, pythonpath
        self.state_dir = state_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self._pipe_w: int | None = None

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    def start(
        self, progress: Callable[[str], None], timeout_s: float = START_TIMEOUT_S
    ) -> SystemInfo:
        _check_port(self.http_host, self.http_port)
        read_end, self._pipe_w = os.pipe()  # both ends non-inheritable (PEP 446)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable, "-m", __name__,
            "--state-dir", str(self.state_dir),
            "--http-host", self.http_host, "--http-port", str(self.http_port),
            "--parent-fd", str(read_end),
            "--workdir", self.workdir, "--pythonpath", self.pythonpath,
        ]  # fmt: skip
        with open(self.log_dir / "supervisor.log", "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(read_end,),
                start_new_session=True,
                preexec_fn=_die_with_parent_gently(),
            )
        os.close(read_end)
        deadline = time.monotonic() + timeout_s
        said = time.monotonic()
        while True:
            info = self._read_info()
            if info is not None:
                return info
            failed = self.state_dir / FAILED_FILE
            if failed.exists():
                raise StartError(failed.read_text(errors="replace"))
            if self.proc.poll() is not None:
                raise StartError(
                    f"the local system's supervisor exited with code {self.proc.returncode}:\n"
                    + _tail(self.log_dir / "supervisor.log")
                )
            now = time.monotonic()
            if now > deadline:
                self.stop()
                raise StartError(
                    f"the local system did not start within {timeout_s:g} s (logs in "
                    f"{self.log_dir})"
                )
            if now - said > 5:
                progress(f"still starting ({timeout_s - (deadline - now):.0f} s) ...")
                said = now
            time.sleep(0.05)

    def problem(self) -> str | None:
        """Why the running system cannot serve (a service or the supervisor died), or None."""
        died = self.state_dir / DIED_FILE
        if died.exists():
            return died.read_text(errors="replace")
        if self.proc is not None and self.proc.poll() is not None:
            return f"the supervisor exited with code {self.proc.returncode}"
        return None

    def _read_info(self) -> SystemInfo | None:
        try:
            doc = json.loads((self.state_dir / SYSTEM_FILE).read_text())
        except (OSError, ValueError):
            return None
        return SystemInfo(doc["nats_url"], doc["http_host"], int(doc["http_port"]), self.state_dir)

    def stop(self, timeout_s: float = STOP_GRACE_S + 15) -> None:
        """Tell the supervisor to stop everything and wait for it; SIGKILL its process group
        when it takes longer than `timeout_s` (its children die with it)."""
        if self._pipe_w is not None:
            with contextlib.suppress(OSError):
                os.close(self._pipe_w)
            self._pipe_w = None
        proc = self.proc
        if proc is None:
            return
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        finally:
            shutil.rmtree(self.state_dir, ignore_errors=True)


def _die_with_parent_gently() -> Callable[[], None] | None:
    """Like shared.procutil.die_with_parent, but SIGTERM: the supervisor stops the system
    gracefully. (The pipe catches the script's death too, from any thread; this is a second
    line.)"""
    arm = die_with_parent()
    if arm is None:
        return None
    import ctypes

    parent = os.getpid()
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def setup() -> None:
        prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(1)

    return setup


def _check_port(host: str, port: int) -> None:
    with socket.socket() as s:
        # as the front door binds: connections a previous run closed (TIME_WAIT) do not count
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise StartError(
                f"cannot serve HTTP on {host}:{port}: {exc.strerror or exc} (something else "
                "listens there; choose another port with serve.start(http_options={'port': ...})"
                " or $FLEETPULSE_PROXY_PORT)"
            ) from None


def _tail(path: Path) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return text[-LOG_TAIL_CHARS:]


# -- the supervisor -------------------------------------------------------------------------------


class Supervisor:
    """Runs in its own process: starts the services, then waits for the script to go."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.state_dir = Path(args.state_dir)
        self.logs = self.state_dir / "logs"
        self.server: NatsServer | None = None
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._stopping = threading.Event()

    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self._stopping.set())
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the script decides (it has the terminal)
        try:
            info = self.start()
        except StartError as exc:
            (self.state_dir / FAILED_FILE).write_text(str(exc))
            self.stop()
            return 1
        tmp = self.state_dir / (SYSTEM_FILE + ".tmp")
        tmp.write_text(json.dumps(info))
        tmp.replace(self.state_dir / SYSTEM_FILE)
        print(f"up: {info}", flush=True)
        self.wait_for_parent()
        self.stop()
        shutil.rmtree(self.state_dir, ignore_errors=True)
        return 0

    def start(self) -> dict[str, Any]:
        a = self.args
        self.logs.mkdir(parents=True, exist_ok=True)
        try:
            self.server = NatsServer().start()
        except Exception as exc:
            raise StartError(f"nats-server did not start: {exc}") from None
        url = self.server.url
        common = ["--nats", url]
        agent = ["-m", "services.agent", *common, "--agent-id", "local", "--max-replicas",
                 MAX_REPLICAS, "--workdir", a.workdir, "--log-dir", str(self.logs / "replicas")]  # fmt: skip
        if a.pythonpath:
            agent += ["--pythonpath", a.pythonpath]
        self._spawn("controller", ["-m", "services.controller", *common, "--member-id", "serve"])
        self._spawn("agent", agent)
        self._spawn(
            "proxy",
            ["-m", "services.proxy", *common, "--host", a.http_host, "--port", str(a.http_port),
             "--drain-timeout", PROXY_DRAIN_S],
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _accepts(a.http_host, a.http_port):
            self._check_alive()
            if time.monotonic() > deadline or self._stopping.is_set():
                raise StartError(
                    f"the proxy did not listen on {a.http_host}:{a.http_port} within "
                    f"{START_TIMEOUT_S:g} s:\n{_tail(self.logs / 'proxy.log')}"
                )
            time.sleep(0.05)
        return {"nats_url": url, "http_host": a.http_host, "http_port": a.http_port,
                "pids": {name: p.pid for name, p in self.procs.items()}}  # fmt: skip

    def _spawn(self, name: str, argv: list[str]) -> None:
        log: IO[bytes]
        with open(self.logs / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, *argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.args.workdir,
                preexec_fn=die_with_parent(),
            )

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise StartError(
                    f"the {name} exited with code {proc.returncode} while starting:\n"
                    + _tail(self.logs / f"{name}.log")
                )

    def wait_for_parent(self) -> None:
        """Until the pipe from the script closes (or SIGTERM); a service that dies meanwhile is
        reported in `died.txt` (the script raises with it), not restarted."""
        fd = self.args.parent_fd
        reported: set[str] = set()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while not self._stopping.is_set():
                for name, proc in self.procs.items():
                    if name not in reported and proc.poll() is not None:
                        reported.add(name)
                        with open(self.state_dir / DIED_FILE, "a") as f:
                            f.write(
                                f"the {name} exited with code {proc.returncode}:\n"
                                f"{_tail(self.logs / f'{name}.log')}\n"
                            )
                if sel.select(timeout=0.5):
                    try:
                        data = os.read(fd, 64)
                    except OSError:
                        return
                    if not data:
                        return

    def stop(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.server is not None:
            self.server.stop()


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fleetpulse.serve.localsystem")
    p.add_argument("--state-dir", required=True)
    p.add_argument("--http-host", required=True)
    p.add_argument("--http-port", type=int, required=True)
    p.add_argument("--parent-fd", type=int, required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--pythonpath", default="")
    return Supervisor(p.parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())

"""Starting real service processes from tests, and always stopping them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from shared.bus import Bus
from shared.errors import BusTimeout, NoResponders
from shared.subjects import DEFAULT_SUBJECTS

ROOT = Path(__file__).resolve().parents[1]


class ServiceProcesses:
    """Tracks child processes of one test; `stop_all()` leaves none behind."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, args: Sequence[str], *, log: Path | None = None) -> subprocess.Popen[bytes]:
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [sys.executable, *args], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
        self.procs.append(proc)
        return proc

    def stop_all(self, timeout: float = 10.0) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@contextlib.contextmanager
def service_processes() -> Iterator[ServiceProcesses]:
    procs = ServiceProcesses()
    try:
        yield procs
    finally:
        procs.stop_all()


def replica_args(
    nats_url: str,
    replica_id: str,
    *,
    app: str = "app",
    deployment: str = "dep",
    import_path: str = "services.examples.echo:Echo",
    extra: Sequence[str] = (),
) -> list[str]:
    return [
        "-m",
        "services.replica",
        "--nats",
        nats_url,
        "--app",
        app,
        "--deployment",
        deployment,
        "--import-path",
        import_path,
        "--replica-id",
        replica_id,
        *extra,
    ]


async def wait_for_replica(bus: Bus, replica_id: str, timeout: float = 20.0) -> None:
    """Until the replica answers a probe (it subscribes only once it is ready to serve)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        try:
            await bus.request(DEFAULT_SUBJECTS.probe(replica_id), b"", timeout=0.5)
            return
        except (NoResponders, BusTimeout):
            await asyncio.sleep(0.05)
    raise TimeoutError(f"replica {replica_id} did not become ready in {timeout} s")

"""The HAProxy front door end to end, through `fleetpulse up --config`: a real echo app whose
replica serves HTTP itself. Its first request wakes it through the Python proxy (held, over
NATS); once its replica announces its HTTP address, requests go from HAProxy straight to it (the
Python proxy sees none of them); the proxy's own paths still answer; and stopping `fleetpulse
up` leaves no HAProxy behind.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.waiting import eventually

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
UP_READY_S = 90.0

APP_CODE = """
from fleetpulse import serve


@serve.deployment(max_ongoing_requests=8)
class Echo:
    async def __call__(self, request):
        body = await request.body()
        return {
            "path": request.url.path,
            "body": body.decode(),
            "prefix": request.headers.get("x-forwarded-prefix"),
            "forwarded_for": request.headers.get("x-forwarded-for"),
        }


app = Echo.bind()
"""

APPS = """
applications:
  - name: echo
    route_prefix: /echo
    import_path: echo_app:app
    deployments:
      - name: Echo
        autoscaling_config:
          min_replicas: 0
          max_replicas: 1
          downscale_to_zero_delay_s: 600
"""


class Up:
    def __init__(self, tmp: Path) -> None:
        (tmp / "echo_app.py").write_text(APP_CODE)
        config = tmp / "apps.yaml"
        config.write_text(APPS)
        self.out = tmp / "up.out"
        env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{tmp}")
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "services.cli", "up", "--config", str(config),
                 "--no-live", "--http-port", "0", "--front", "haproxy"],
                cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.http = self._line(r"HTTP:\s+(http://\S+)")

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def _line(self, pattern: str) -> str:
        deadline = time.monotonic() + UP_READY_S
        while time.monotonic() < deadline:
            m = re.search(pattern, self.text())
            if m:
                return m.group(1).rstrip("/")
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"no {pattern!r} from fleetpulse up:\n{self.text()}")

    def haproxy_pids(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True)
        pids = [int(p) for p in out.stdout.split()]
        return [p for p in pids if "haproxy" in _cmdline(p)]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    stack = Up(tmp_path)
    try:
        yield stack
    finally:
        stack.stop()


def _python_requests(metrics: str, app: str) -> float:
    """Requests the Python proxy served for `app` (its request-duration histogram's count)."""
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith("fleetpulse_proxy_request_duration_seconds_count{") and (
            f'app="{app}"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _front_servers(metrics: str, app: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(f'fleetpulse_proxy_front_servers{{app="{app}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_wake_through_the_python_proxy_then_straight_to_the_replica(up: Up) -> None:
    assert up.haproxy_pids(), "fleetpulse up runs HAProxy as its child"

    async def run() -> None:
        async with aiohttp.ClientSession(base_url=up.http) as http:

            async def metrics() -> str:
                async with http.get("/metrics") as r:
                    assert r.status == 200
                    return await r.text()

            async def registered() -> bool:
                async with http.get("/-/routes") as r:
                    doc = await r.json()
                return bool(doc["apps"].get("echo", {}).get("registered"))

            await eventually(registered, within_s=60, what="echo registered")
            # at zero: the first request is held by the Python proxy, which wakes the app
            async with http.post("/echo/first", data=b"hello") as r:
                assert r.status == 200, await r.text()
                doc = await r.json()
            assert doc["path"] == "/echo/first" and doc["body"] == "hello"
            assert _python_requests(await metrics(), "echo") >= 1
            # the replica serves HTTP: HAProxy sends it the requests directly
            await eventually(lambda: _has_direct(metrics), within_s=60, what="echo served directly")
            before = _python_requests(await metrics(), "echo")
            for i in range(20):
                async with http.post(
                    f"/echo/x/{i}", data=str(i), headers={"X-Forwarded-For": "10.1.1.1"}
                ) as r:
                    assert r.status == 200, await r.text()
                    doc = await r.json()
                assert doc["body"] == str(i) and doc["path"] == f"/echo/x/{i}"
                assert doc["prefix"] == "/echo"
                assert doc["forwarded_for"].startswith("10.1.1.1, ")
            assert _python_requests(await metrics(), "echo") == before  # none took NATS
            async with http.get("/echoes") as r:  # not a segment of /echo
                assert r.status == 404

    async def _has_direct(metrics: object) -> bool:
        return _front_servers(await metrics(), "echo") >= 1  # type: ignore[operator]

    asyncio.run(run())
    pids = up.haproxy_pids()
    up.stop()
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "haproxy" not in _cmdline(pid)

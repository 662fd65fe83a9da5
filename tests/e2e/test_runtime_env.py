"""Runtime environments end to end through `fleetpulse up --config` (and `fleetpulse deploy`
into the same fleet): code that exists only in the uploaded working_dir, a pip requirement built
from a wheel the test makes and serves from a local directory (no internet), two apps with
different pins side by side on one agent, a changed working_dir rolled out with no failed
request; and the failures: a requirement that does not exist, a working_dir over the limit.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from shared.kv.status import AppStatusView
from shared.natsbus import NatsBus
from shared.subjects import KV_STATUS
from tests.e2e.test_cli import fleetpulse
from tests.runtimeenv_fixtures import make_wheel, write_app, write_module
from tests.waiting import eventually

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
UP_READY_S = 90.0

APPS = """
applications:
  - name: pin1
    route_prefix: /pin1
    import_path: shipped_app:app
    runtime_env:
      working_dir: {wd}
      excludes: ["*.bin"]
      pip: ["fpwheel==1.0"]
  - name: pin2
    route_prefix: /pin2
    import_path: shipped_app:app
    runtime_env:
      working_dir: {wd}
      py_modules: [{extra}]
      pip: ["fpwheel==2.0"]
"""


class Up:
    """`fleetpulse up --config FILE --no-live` as a process; its URLs read off its output."""

    def __init__(self, tmp: Path, config: Path) -> None:
        self.tmp = tmp
        self.out = tmp / "up.out"
        wheels = tmp / "wheels"
        env = dict(
            os.environ,
            PYTHONPATH=str(ROOT),
            PIP_NO_INDEX="1",
            PIP_FIND_LINKS=str(wheels),
            PIP_CONFIG_FILE=os.devnull,
            FLEETPULSE_AGENT_CACHE_DIR=str(tmp / "cache"),
        )
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "services.cli", "up", "--config", str(config),
                 "--no-live", "--http-port", "0"],
                cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.http = self._line(r"HTTP:\s+(http://\S+)")
        self.nats = self._line(r"NATS:\s+(nats://\S+)")

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def log(self) -> str:
        """fleetpulse up's log file (its services, the agent included)."""
        m = re.search(r"logs:\s+(\S+fleetpulse\.log)", self.text())
        assert m is not None, self.text()
        return Path(m.group(1)).read_text(errors="replace")

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

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    tmp = tmp_path_factory.mktemp("runtime-env")
    make_wheel(tmp / "wheels", "fpwheel", "1.0")
    make_wheel(tmp / "wheels", "fpwheel", "2.0")
    wd = write_app(tmp / "wd", "v1")
    (wd / "huge.bin").write_bytes(b"\0" * 1024)  # excluded: never shipped
    config = tmp / "apps.yaml"
    extra = write_module(tmp / "libs", "from py_modules")
    config.write_text(APPS.format(wd=wd, extra=extra))
    stack = Up(tmp, config)
    try:
        yield stack
    finally:
        stack.stop()


def _names(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


async def _get(http: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with http.get(url) as r:
        return r.status, (await r.json() if r.status == 200 else await r.text())


async def _answer(url: str, within_s: float = 60.0) -> Any:
    got: list[Any] = []
    async with aiohttp.ClientSession() as http:

        async def ok() -> bool:
            try:
                status, body = await _get(http, url)
            except aiohttp.ClientError:
                return False
            if status == 200:
                got.append(body)
            return status == 200

        await eventually(ok, within_s, f"200 from {url}")
    return got[-1]


async def _status(nats: str, app: str) -> AppStatusView | None:
    bus = await NatsBus.connect(nats, name="runtime-env-e2e")
    try:
        entry = await (await bus.kv(KV_STATUS)).get(app)
        return None if entry is None else AppStatusView.decode(entry.value)
    finally:
        await bus.close()


async def test_code_only_in_the_working_dir_and_two_pins_side_by_side(up: Up) -> None:
    one = await _answer(f"{up.http}/pin1")
    two = await _answer(f"{up.http}/pin2")
    assert one["helper"] == "v1" and two["helper"] == "v1"
    assert (one["pkg"], two["pkg"]) == ("1.0", "2.0")  # one agent, two environments
    assert (one["extra"], two["extra"]) == (None, "from py_modules")
    cache = up.tmp / "cache" / "packages"
    assert len(list(cache.iterdir())) == 3  # two working_dirs (see below), one py_modules
    # pin1 excludes *.bin, pin2 does not: two packages of one directory
    assert _names(Path(one["cwd"])) == ["shipped_app.py", "shipped_helper.py"]
    assert (Path(two["cwd"]) / "huge.bin").exists()
    assert "3 uploaded" in up.text()


async def test_a_changed_working_dir_rolls_out_with_no_failed_request(up: Up) -> None:
    await _answer(f"{up.http}/pin1")
    wd2 = write_app(up.tmp / "wd2", "v2")
    config = up.tmp / "v2.yaml"
    config.write_text(APPS.format(wd=wd2, extra="").split("  - name: pin2")[0])
    failures: list[Any] = []
    seen: set[str] = set()
    stop = asyncio.Event()

    async def client() -> None:
        async with aiohttp.ClientSession() as http:
            while not stop.is_set():
                try:
                    status, body = await _get(http, f"{up.http}/pin1")
                except aiohttp.ClientError as exc:
                    failures.append(repr(exc))
                    continue
                if status != 200:
                    failures.append((status, body))
                else:
                    seen.add(body["helper"])
                await asyncio.sleep(0.02)

    task = asyncio.create_task(client())
    res = await asyncio.to_thread(fleetpulse, "deploy", str(config), "--nats", up.nats)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 uploaded" in res.stdout
    await eventually(lambda: "v2" in seen, 90, "the new working_dir serving")
    stop.set()
    await task
    assert failures == []

    again = await asyncio.to_thread(fleetpulse, "deploy", str(config), "--nats", up.nats)
    assert "already in the store" in again.stdout and "unchanged" in again.stdout


async def test_a_requirement_that_does_not_exist_fails_the_deployment(up: Up) -> None:
    config = up.tmp / "bad.yaml"
    config.write_text(
        "applications:\n  - name: badreq\n    route_prefix: /badreq\n"
        "    import_path: shipped_app:app\n"
        f"    runtime_env:\n      working_dir: {up.tmp / 'wd'}\n"
        '      pip: ["fpwheel==9.9"]\n'
    )
    res = await asyncio.to_thread(fleetpulse, "deploy", str(config), "--nats", up.nats)
    assert res.returncode == 0, res.stdout + res.stderr

    async def failed() -> bool:
        view = await _status(up.nats, "badreq")
        return view is not None and view.status == "DEPLOY_FAILED"

    await eventually(failed, 60, "badreq DEPLOY_FAILED")
    view = await _status(up.nats, "badreq")
    assert view is not None
    assert "satisfies the requirement fpwheel==9.9" in view.deployments["Shipped"].message
    status = await asyncio.to_thread(
        fleetpulse, "status", "--nats", up.nats, "--app", "badreq", "--json"
    )
    (note,) = json.loads(status.stdout)["runtime_envs"]
    assert (note["agent"], note["deployment"], note["state"]) == (
        "local",
        "badreq.Shipped",
        "failed",
    )
    assert "satisfies the requirement fpwheel==9.9" in note["detail"]  # the installer's line
    log = up.log()
    assert "Could not find a version that satisfies the requirement fpwheel==9.9" in log
    # no retry loop: one install for the replicas the controller tried, the same error for each
    assert log.count("building python environment") == 3  # pin1, pin2, badreq
    assert log.count("start_failed app=badreq") >= 3


def test_a_working_dir_over_the_limit_is_refused_before_anything_is_written(
    tmp_path: Path, up: Up
) -> None:
    wd = write_app(tmp_path / "wd", "v1")
    (wd / "weights.dat").write_bytes(os.urandom(3 << 20))
    config = tmp_path / "big.yaml"
    config.write_text(
        "applications:\n  - name: big\n    route_prefix: /big\n    import_path: shipped_app:app\n"
        f"    runtime_env:\n      working_dir: {wd}\n"
    )
    env_limit = {"FLEETPULSE_MAX_PACKAGE_MB": "2"}
    res = subprocess.run(
        [sys.executable, "-m", "services.cli", "deploy", str(config), "--nats", up.nats],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), **env_limit),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode != 0
    assert "over the package limit" in res.stderr and "weights.dat" in res.stderr
    assert asyncio.run(_status(up.nats, "big")) is None

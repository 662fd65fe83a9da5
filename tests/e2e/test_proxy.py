"""The HTTP proxy end to end: a real nats-server, `fleetpulse controller` and `fleetpulse agent`
processes, the proxy process (`python -m services.proxy`) and apps deployed with
`fleetpulse deploy`. Each test deploys its own app (own name and route prefix) on one stack.

What it shows: an app deployed at min_replicas 0 registers before any replica runs and wakes on
its first HTTP request; an app idle at zero answers (never 404); a crashed app answers 503 with
the reason and comes back once healthy; 1,000 concurrent requests against an app at zero are all
answered once it wakes.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from services.proxy.registry import KV_ROUTES, Route
from services.router.handle import connect_handle
from shared.bus import Bus
from shared.natsbus import NatsBus
from shared.natsserver import NatsServer
from tests.procs import ROOT, ServiceProcesses
from tests.waiting import eventually as until

pytestmark = pytest.mark.e2e

PROXY_READY_S = 20.0
LISTENING_RE = re.compile(r"proxy: listening on (http://\S+)")

APP_YAML = """
applications:
  - name: {name}
    route_prefix: {prefix}
    deployments:
      - name: {deployment}
        import_path: {import_path}
        max_ongoing_requests: {max_ongoing}
        health_check_period_s: 0.5
        health_check_timeout_s: 2
        graceful_shutdown_timeout_s: 2
        autoscaling_config:
          min_replicas: {min_replicas}
          max_replicas: {max_replicas}
          target_ongoing_requests: {target}
          upscale_delay_s: 0.5
          downscale_delay_s: 1.5
          downscale_to_zero_delay_s: 1.5
          look_back_period_s: 1
          metrics_interval_s: 0.5
"""
ECHO = "services.examples.echo:Echo"


class Stack:
    """nats-server, one controller, one agent and the proxy, as processes."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.server = NatsServer()
        self.procs = ServiceProcesses()
        self.url = ""
        self.proxy_url = ""

    def start(self) -> None:
        self.server.start()
        nats = self.server.url
        self.procs.start(
            ["-m", "services.cli", "controller", "--nats", nats, "--rebuild-s", "2"],
            log=self.tmp / "controller.log",
        )
        self.procs.start(
            ["-m", "services.cli", "agent", "--nats", nats, "--agent-id", "a1",
             "--max-replicas", "12", "--log-dir", str(self.tmp / "replicas"),
             # cold starts: a replica replaced in a spare process is back in ~0.1 s, too short
             # a "down" window for the crash test to watch the app deregister and come back
             "--spare-replicas", "0"],
            log=self.tmp / "agent.log",
        )  # fmt: skip
        proxy_log = self.tmp / "proxy.log"
        self.procs.start(
            ["-m", "services.proxy", "--nats", nats, "--port", "0", "--metrics-interval", "0.5",
             "--max-wait", "45", "--retry-after", "2"],
            log=proxy_log,
        )  # fmt: skip
        self.proxy_url = _wait_for_line(proxy_log, LISTENING_RE, PROXY_READY_S)

    def stop(self) -> None:
        try:
            self.procs.stop_all(timeout=20)
        finally:
            self.server.stop()

    def deploy(self, name: str, prefix: str, **kw: Any) -> None:
        values = {"import_path": ECHO, "max_ongoing": 100, "min_replicas": 0,
                  "max_replicas": 2, "target": 50, **kw}  # fmt: skip
        path = self.tmp / f"{name}.yaml"
        # replica ids are unique per deployment name only (see the report), so one name per app
        deployment = name.capitalize()
        path.write_text(APP_YAML.format(name=name, prefix=prefix, deployment=deployment, **values))
        res = subprocess.run(
            [sys.executable, "-m", "services.cli", "deploy", str(path), "--nats", self.server.url],
            cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert res.returncode == 0, res.stdout + res.stderr


def _wait_for_line(path: Path, pattern: re.Pattern[str], within_s: float) -> str:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if path.exists() and (m := pattern.search(path.read_text(errors="replace"))):
            return m.group(1)
        time.sleep(0.05)
    raise AssertionError(f"no {pattern.pattern!r} in {path} within {within_s} s")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("proxy-e2e"))
    try:
        s.start()
        yield s
    finally:
        s.stop()


@pytest.fixture
async def http(stack: Stack) -> AsyncIterator[aiohttp.ClientSession]:
    connector = aiohttp.TCPConnector(limit=1200)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(stack.proxy_url, connector=connector, timeout=timeout) as s:
        yield s


@pytest.fixture
async def bus(stack: Stack) -> AsyncIterator[Bus]:
    b = await NatsBus.connect(stack.server.url, name="e2e-proxy")
    yield b
    await b.close()


async def routes(http: aiohttp.ClientSession) -> dict[str, Any]:
    async with http.get("/-/routes") as resp:
        assert resp.status == 200
        apps: dict[str, Any] = (await resp.json())["apps"]
        return apps


def route_is(http: aiohttp.ClientSession, app: str, **want: Any) -> Any:
    """A condition: the app's /-/routes entry has these values (`running` = ingress replicas)."""

    async def check() -> dict[str, Any] | None:
        route = (await routes(http)).get(app)
        if route is None:
            return None
        got = dict(route)
        (dep,) = route["deployments"].values()
        got["running"] = dep["running_replicas"]
        got["status"] = dep["status"]
        return route if all(got.get(k) == v for k, v in want.items()) else None

    return check


async def test_app_at_min_replicas_zero_registers_wakes_and_answers_and_again_after_idling(
    stack: Stack, http: aiohttp.ClientSession, bus: Bus
) -> None:
    stack.deploy("cold", "/cold")
    # registered before any replica ever ran: HEALTHY at zero is serviceable
    route = await until(route_is(http, "cold", registered=True, running=0), 20, "registered at 0")
    assert route["deployments"]["Cold"]["serviceability"] == "idle"
    published = await (await bus.kv(KV_ROUTES)).get("cold")
    assert published is not None and Route.from_json(published.value).registered

    t0 = time.monotonic()
    async with http.post("/cold/hello?x=1", data=b"wake up") as resp:
        assert resp.status == 200, await resp.text()
        assert await resp.read() == b"wake up"
        assert resp.headers["x-echo-method"] == "POST"
    woke_s = time.monotonic() - t0
    await until(route_is(http, "cold", running=1), 10, "a replica running")

    # idle: back to zero, still registered, and the next request is answered, not 404
    await until(route_is(http, "cold", registered=True, running=0, status="HEALTHY"), 30, "idle")
    async with http.put("/cold", data=b"again") as resp:
        assert resp.status == 200, await resp.text()
        assert await resp.read() == b"again"
    assert woke_s < 30


async def test_crashed_app_is_503_with_the_reason_and_comes_back_when_healthy(
    stack: Stack, http: aiohttp.ClientSession
) -> None:
    # replicas that cannot start: three failures in a row -> DEPLOY_FAILED at zero
    stack.deploy("broken", "/broken", import_path="services.examples.echo:NoSuchClass",
                 min_replicas=1)  # fmt: skip
    await until(route_is(http, "broken", registered=False, down=True), 40, "deregistered")
    async with http.get("/broken/x") as resp:
        assert resp.status == 503
        assert resp.headers["Retry-After"] == "2"
        body = await resp.json()
        assert body["error"] == "app_down"
        assert "DEPLOY_FAILED" in body["message"], body
    # fixed and redeployed: registered once a replica runs, and answers
    stack.deploy("broken", "/broken", min_replicas=1)
    await until(route_is(http, "broken", registered=True, running=1), 30, "registered again")
    async with http.post("/broken/x", data=b"ok") as resp:
        assert resp.status == 200 and await resp.read() == b"ok"


async def test_killed_replica_deregisters_while_down_and_recovers(
    stack: Stack, http: aiohttp.ClientSession, bus: Bus
) -> None:
    stack.deploy("crashy", "/crashy", min_replicas=1, max_replicas=1)
    await until(route_is(http, "crashy", registered=True, running=1), 30, "running")
    handle = await connect_handle("crashy", "Crashy", bus=bus)
    try:
        pid = await handle.options(method="pid", deadline_s=10).remote()
    finally:
        await handle.close()
    statuses: list[tuple[int, str]] = []
    stop = asyncio.Event()

    async def poll() -> None:
        while not stop.is_set():
            async with http.get("/crashy/p", timeout=aiohttp.ClientTimeout(total=30)) as resp:
                statuses.append((resp.status, await resp.text()))
            await asyncio.sleep(0.02)

    pollers = [asyncio.ensure_future(poll()) for _ in range(4)]
    try:
        await asyncio.sleep(0.3)
        os.kill(pid, signal.SIGKILL)  # crashed while running: UNHEALTHY at zero until replaced
        await until(route_is(http, "crashy", registered=False, down=True), 15, "deregistered")
        await until(route_is(http, "crashy", registered=True, running=1), 30, "replaced")
        await asyncio.sleep(0.3)
    finally:
        stop.set()
        await asyncio.gather(*pollers)
    down = [text for code, text in statuses if code == 503]
    assert down and all("UNHEALTHY" in t for t in down), statuses[-5:]
    assert {code for code, _ in statuses} <= {200, 503}  # never 404, never a 5xx without reason
    assert statuses[-1][0] == 200


async def test_a_thousand_concurrent_requests_at_zero_are_all_answered(
    stack: Stack, http: aiohttp.ClientSession
) -> None:
    stack.deploy("burst", "/burst", max_replicas=4, target=100, max_ongoing=100)
    await until(route_is(http, "burst", registered=True, running=0), 20, "registered at 0")

    async def one(i: int) -> tuple[int, bytes]:
        async with http.post(f"/burst/{i}", data=str(i).encode()) as resp:
            return resp.status, await resp.read()

    t0 = time.monotonic()
    results = await asyncio.gather(*(one(i) for i in range(1000)))
    elapsed = time.monotonic() - t0
    failed = [(i, r) for i, r in enumerate(results) if r != (200, str(i).encode())]
    assert not failed, f"{len(failed)} of 1000 not answered right, e.g. {failed[:3]}"
    assert elapsed < 45
    # they really were held through the wake-up, and none was refused or timed out
    async with http.get("/metrics") as resp:
        metrics = await resp.text()
    outcomes = dict(
        re.findall(r'held_outcomes_total\{app="burst",outcome="(\w+)"\} (\S+)', metrics)
    )
    # with the HAProxy front door, only what arrives before the replica serves HTTP is held here;
    # later requests go to it directly (all 1,000 answered is the promise)
    assert float(outcomes.get("admitted", 0)) >= 1, outcomes
    assert set(outcomes) == {"admitted"}, outcomes

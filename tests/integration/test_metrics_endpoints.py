"""Every long-running service, started as its own process, serves its metrics over HTTP.

Controller, agent, router gateway, recorder and replica on `--metrics-port`; the proxy on
`/metrics` of its HTTP port (its routers' families included). The names checked are those of
shared/metrics_catalog.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path

import aiohttp

from shared.metrics_catalog import METRIC_NAMES
from tests.procs import replica_args, service_processes

SCRAPE_TIMEOUT_S = 20.0


def free_ports(n: int) -> list[int]:
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


async def scrape(session: aiohttp.ClientSession, port: int, names: tuple[str, ...]) -> str:
    """The page once it lists every name (a process needs a moment to start)."""
    url = f"http://127.0.0.1:{port}/metrics"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SCRAPE_TIMEOUT_S
    page = ""
    while loop.time() < deadline:
        with contextlib.suppress(aiohttp.ClientError):
            async with session.get(url) as resp:
                if resp.status == 200:
                    page = await resp.text()
                    if all(f"# TYPE {n} " in page for n in names):
                        return page
        await asyncio.sleep(0.2)
    missing = [n for n in names if f"# TYPE {n} " not in page]
    raise AssertionError(f"{url}: missing {missing}" if page else f"{url}: never answered")


async def test_every_service_serves_its_metrics(nats_url: str, tmp_path: Path) -> None:
    controller, agent, proxy, gateway, recorder, replica = free_ports(6)
    with service_processes() as procs:

        def start(name: str, *args: str) -> None:
            procs.start(list(args), log=tmp_path / f"{name}.log")

        start("controller", "-m", "services.controller", "--nats", nats_url,
              "--metrics-port", str(controller))  # fmt: skip
        start("agent", "-m", "services.agent", "--nats", nats_url, "--agent-id", "metrics-agent",
              "--log-dir", str(tmp_path), "--metrics-port", str(agent))  # fmt: skip
        start("proxy", "-m", "services.proxy", "--nats", nats_url, "--port", str(proxy))
        start("gateway", "-m", "services.router", "--nats", nats_url,
              "--metrics-port", str(gateway))  # fmt: skip
        start("recorder", "-m", "services.recorder", "record", "--nats", nats_url,
              "--out", str(tmp_path / "rec"), "--progress-interval-s", "0",
              "--metrics-port", str(recorder))  # fmt: skip
        start("replica", *replica_args(nats_url, "r-metrics",
              extra=["--health-check-period-s", "0.2", "--metrics-port", str(replica)]))  # fmt: skip
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as session:
            pages = await asyncio.gather(
                scrape(session, controller, METRIC_NAMES["controller"]),
                scrape(session, agent, METRIC_NAMES["agent"]),
                scrape(session, proxy, METRIC_NAMES["proxy"] + METRIC_NAMES["router"]),
                scrape(session, gateway, METRIC_NAMES["router"]),
                scrape(session, recorder, METRIC_NAMES["recorder"]),
                scrape(session, replica, METRIC_NAMES["replica"]),
            )
        controller_page, agent_page, *_, replica_page = pages
        assert 'fleetpulse_agent_capacity{agent="metrics-agent"} 8.0' in agent_page
        assert "fleetpulse_controller_partitions_owned " in controller_page
        assert 'result="healthy"' in replica_page  # its first check ran before it served

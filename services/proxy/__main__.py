"""`fleetpulse proxy` / `python -m services.proxy`: run the HTTP ingress until SIGTERM/SIGINT.

On a signal the proxy stops accepting connections, lets in-flight requests finish for
`--drain-timeout` seconds, releases its routers and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any

from services.proxy.config import ProxyConfig, add_proxy_arguments
from services.proxy.server import ProxyServer, serve_until
from shared import aioloop
from shared.natsbus import NatsBus
from shared.signals import on_stop_signals

__all__ = ["add_proxy_arguments", "main", "run_from_args", "serve"]

log = logging.getLogger(__name__)


async def serve(config: ProxyConfig, *, stop: asyncio.Event | None = None, **kw: Any) -> int:
    """Connect, serve until `stop` is set (or SIGTERM/SIGINT), then shut down gracefully."""
    bus = await NatsBus.connect(config.nats_url, name="fleetpulse-proxy")
    stop = stop or asyncio.Event()
    try:
        with on_stop_signals(stop.set):
            await serve_until(ProxyServer(bus, config, **kw), stop)
        log.info("proxy: stopped")
    finally:
        await bus.close()
    return 0


def run_from_args(args: argparse.Namespace) -> int:
    return aioloop.run(serve(ProxyConfig.from_args(args)))


def main() -> int:
    from shared.cliargs import standalone_main

    return standalone_main("python -m services.proxy", __doc__, add_proxy_arguments, run_from_args)


if __name__ == "__main__":
    sys.exit(main())

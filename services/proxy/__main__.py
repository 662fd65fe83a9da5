"""`fleetpulse proxy` / `python -m services.proxy`: run the HTTP ingress until SIGTERM/SIGINT.

On a signal the proxy stops accepting connections, lets in-flight requests finish for
`--drain-timeout` seconds, releases its routers and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from typing import Any

from services.proxy.config import ProxyConfig, add_proxy_arguments
from services.proxy.server import ProxyServer, serve_until
from shared.natsbus import NatsBus

__all__ = ["add_proxy_arguments", "main", "run_from_args", "serve"]

log = logging.getLogger(__name__)


async def serve(config: ProxyConfig, *, stop: asyncio.Event | None = None, **kw: Any) -> int:
    """Connect, serve until `stop` is set (or SIGTERM/SIGINT), then shut down gracefully."""
    bus = await NatsBus.connect(config.nats_url, name="fleetpulse-proxy")
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    handled: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
            handled.append(sig)
    try:
        await serve_until(ProxyServer(bus, config, **kw), stop)
        log.info("proxy: stopped")
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
        await bus.close()
    return 0


def run_from_args(args: argparse.Namespace) -> int:
    return asyncio.run(serve(ProxyConfig.from_args(args)))


def main() -> int:
    from services.cli import standalone_main

    return standalone_main("python -m services.proxy", __doc__, add_proxy_arguments, run_from_args)


if __name__ == "__main__":
    sys.exit(main())

"""`fleetpulse auth` / `python -m services.auth`: run the NATS auth callout until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import sys

from shared import aioloop
from shared.metrics_catalog import serve_metrics
from shared.signals import on_stop_signals

from .config import AuthConfig, add_auth_arguments, config_from_args
from .service import AuthService

__all__ = ["add_auth_arguments", "main", "run_from_args", "serve"]


async def serve(cfg: AuthConfig) -> int:
    service = AuthService(cfg)
    with on_stop_signals(service.stop):
        running = asyncio.create_task(service.run(), name="auth")
        ready = asyncio.create_task(service.ready.wait())
        await asyncio.wait((running, ready), return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        if service.ready.is_set():
            # /metrics answers once requests are answered: the compose healthcheck, which the
            # other services wait for, means "logins work"
            serve_metrics(cfg.metrics_port, "auth")
        await running
    return 0


def run_from_args(args: argparse.Namespace) -> int:
    return aioloop.run(serve(config_from_args(args)))


def main() -> int:
    from shared.cliargs import standalone_main

    return standalone_main("python -m services.auth", __doc__, add_auth_arguments, run_from_args)


if __name__ == "__main__":
    sys.exit(main())

"""`fleetpulse router` / `python -m services.router`: run the router gateway until SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from services.router.config import GatewayConfig, add_gateway_arguments
from services.router.gateway import serve


def run_from_args(args: argparse.Namespace) -> int:
    return asyncio.run(serve(GatewayConfig.from_args(args)))


def main() -> int:
    from services.cli import add_nats_flag, default_nats_url

    parser = argparse.ArgumentParser(prog="python -m services.router", description=__doc__)
    add_nats_flag(parser)
    add_gateway_arguments(parser)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args()
    args.nats = args.nats or default_nats_url()
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return run_from_args(args)


if __name__ == "__main__":
    sys.exit(main())

"""`fleetpulse router` / `python -m services.router`: run the router gateway until SIGTERM."""

from __future__ import annotations

import argparse
import sys

from services.router.config import GatewayConfig, add_gateway_arguments
from services.router.gateway import serve
from shared import aioloop


def run_from_args(args: argparse.Namespace) -> int:
    return aioloop.run(serve(GatewayConfig.from_args(args)))


def main() -> int:
    from shared.cliargs import standalone_main

    return standalone_main(
        "python -m services.router", __doc__, add_gateway_arguments, run_from_args
    )


if __name__ == "__main__":
    sys.exit(main())

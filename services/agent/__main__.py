"""`fleetpulse agent` / `python -m services.agent`: run the node agent until SIGTERM/SIGINT.

On a signal the agent drains its replicas (SIGTERM each, SIGKILL past its deadline), deletes its
fp_agents entry and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from prometheus_client import start_http_server

from .config import AgentConfig, add_agent_arguments, config_from_args
from .service import AgentService

__all__ = ["add_agent_arguments", "main", "run_from_args", "serve"]

log = logging.getLogger(__name__)


async def serve(cfg: AgentConfig) -> int:
    service = AgentService(cfg)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, service.stop)
    if cfg.metrics_port:
        start_http_server(cfg.metrics_port)
    await service.run()
    log.info("agent %s stopped", cfg.agent_id)
    return 0


def run_from_args(args: argparse.Namespace) -> int:
    return asyncio.run(serve(config_from_args(args)))


def main() -> int:
    from services.cli import add_nats_flag, default_nats_url

    parser = argparse.ArgumentParser(prog="python -m services.agent", description=__doc__)
    add_nats_flag(parser)
    add_agent_arguments(parser)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args()
    args.nats = args.nats or default_nats_url()
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return run_from_args(args)


if __name__ == "__main__":
    sys.exit(main())

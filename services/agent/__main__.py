"""`fleetpulse agent` / `python -m services.agent`: run the node agent until SIGTERM/SIGINT.

On a signal the agent drains its replicas (SIGTERM each, SIGKILL past its deadline), deletes its
fp_agents entry and exits 0.
"""

from __future__ import annotations

import argparse
import logging
import sys

from shared import aioloop
from shared.metrics_catalog import serve_metrics
from shared.signals import on_stop_signals

from .config import AgentConfig, add_agent_arguments, config_from_args
from .service import AgentService

__all__ = ["add_agent_arguments", "main", "run_from_args", "serve"]

log = logging.getLogger(__name__)


async def serve(cfg: AgentConfig) -> int:
    service = AgentService(cfg)
    serve_metrics(cfg.metrics_port, "agent")
    with on_stop_signals(service.stop):
        await service.run()
    log.info("agent %s stopped", cfg.agent_id)
    return 0


def run_from_args(args: argparse.Namespace) -> int:
    return aioloop.run(serve(config_from_args(args)))


def main() -> int:
    from shared.cliargs import standalone_main

    return standalone_main("python -m services.agent", __doc__, add_agent_arguments, run_from_args)


if __name__ == "__main__":
    sys.exit(main())

"""`python -m services.replica` / `fleetpulse replica`: run one replica process until SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from services.metrics_catalog import serve_metrics
from shared.natsbus import NatsBus
from shared.signals import on_stop_signals

from . import logsetup
from .config import ReplicaConfig, add_replica_arguments, config_from_args
from .runtime import ReplicaRuntime
from .usercode import UserDeployment

log = logging.getLogger(__name__)


async def serve(cfg: ReplicaConfig) -> int:
    spec = cfg.spec
    try:
        extra = logsetup.apply(
            spec.logging_config, app=cfg.app, deployment=cfg.deployment, replica_id=cfg.replica_id
        )
    except OSError as exc:  # a log file must not stop a replica from serving
        log.warning("replica %s: logging_config.logs_dir not usable: %s", cfg.replica_id, exc)
    else:
        if extra is not None:
            log.info("replica %s: also logging to %s", cfg.replica_id, extra)
    user = await UserDeployment.create(spec.import_path, spec.init_args, dict(spec.init_kwargs))
    bus = await NatsBus.connect(cfg.nats_url, name=f"replica-{cfg.replica_id}")
    runtime = ReplicaRuntime(cfg, bus, user)
    try:
        serve_metrics(cfg.metrics_port, f"replica {cfg.replica_id}")
    except OSError as exc:  # serving requests matters more than being scraped
        log.warning("replica %s: no metrics on port %d: %s", cfg.replica_id, cfg.metrics_port, exc)
    stop = asyncio.Event()
    try:
        with on_stop_signals(stop.set):  # also while draining: a second signal waits for it
            await runtime.start()
            await stop.wait()
            log.info("replica %s: signal received, draining", cfg.replica_id)
            await runtime.drain()
    finally:
        await bus.close()
    return 0


def run_from_args(args: argparse.Namespace) -> int:
    return asyncio.run(serve(config_from_args(args)))


def main() -> int:
    from services.cli import standalone_main

    return standalone_main(
        "python -m services.replica", __doc__, add_replica_arguments, run_from_args
    )


if __name__ == "__main__":
    sys.exit(main())

"""`fleetpulse controller` / `python -m services.controller`: run a controller member."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import uuid
from typing import TYPE_CHECKING

from shared import aioloop, settings
from shared.metrics_catalog import add_metrics_port_argument, metrics_port, serve_metrics
from shared.signals import on_stop_signals

from .core import ControllerConfig

if TYPE_CHECKING:  # the service (and its metric families) load only to run: the `fleetpulse`
    # parser imports this module for its flags in every process
    from .service import ServiceConfig

log = logging.getLogger(__name__)


def add_controller_arguments(p: argparse.ArgumentParser) -> None:
    settings.CONTROLLER_MEMBER_ID.add_flag(p)
    settings.CONTROLLER_OWNER_EPOCH.add_flag(p)
    settings.NAMESPACE.add_flag(p)
    settings.CONTROLLER_PARTITIONS.add_flag(p)
    settings.CONTROLLER_RETENTION.add_flag(p)
    settings.CONTROLLER_REBUILD.add_flag(p)
    settings.CONTROLLER_CONTROL_INTERVAL.add_flag(p)
    settings.CONTROLLER_MEMBER_TTL.add_flag(p)
    settings.CONTROLLER_HEARTBEAT.add_flag(p)
    settings.CONTROLLER_STREAM_REPLICAS.add_flag(p)
    add_metrics_port_argument(p)
    settings.CONTROLLER_DECODE_THREADS.add_flag(p)
    settings.CONTROLLER_POLICY_TIMEOUT.add_flag(p)
    settings.CONTROLLER_PREPARE_TIMEOUT.add_flag(p)
    settings.CONTROLLER_STATS_FILE.add_flag(p)


def config_from_args(args: argparse.Namespace) -> ServiceConfig:
    from .service import ServiceConfig

    env = os.environ
    return ServiceConfig(
        nats_url=args.nats,
        core=ControllerConfig(
            namespace=settings.NAMESPACE.resolve(args.namespace, env),
            member_id=settings.CONTROLLER_MEMBER_ID.resolve(args.member_id, env)
            or f"c-{uuid.uuid4().hex[:8]}",
            owner_epoch=settings.CONTROLLER_OWNER_EPOCH.resolve(args.owner_epoch, env),
            control_interval_s=settings.CONTROLLER_CONTROL_INTERVAL.resolve(
                args.control_interval_s, env
            ),
            prepare_timeout_s=settings.CONTROLLER_PREPARE_TIMEOUT.resolve(
                args.prepare_timeout_s, env
            ),
        ),
        partitions=settings.CONTROLLER_PARTITIONS.resolve(args.partitions, env),
        retention_s=settings.CONTROLLER_RETENTION.resolve(args.retention_s, env),
        rebuild_s=settings.CONTROLLER_REBUILD.resolve(args.rebuild_s, env),
        metrics_port=metrics_port(args, env),
        stream_replicas=settings.CONTROLLER_STREAM_REPLICAS.resolve(args.stream_replicas, env),
        member_ttl_s=settings.CONTROLLER_MEMBER_TTL.resolve(args.member_ttl_s, env),
        heartbeat_s=settings.CONTROLLER_HEARTBEAT.resolve(args.heartbeat_s, env),
        stats_file=settings.CONTROLLER_STATS_FILE.resolve(args.stats_file, env),
        decode_threads=settings.CONTROLLER_DECODE_THREADS.resolve(args.decode_threads, env),
        policy_timeout_s=settings.CONTROLLER_POLICY_TIMEOUT.resolve(
            args.custom_policy_timeout_s, env
        ),
    )


async def serve(cfg: ServiceConfig) -> int:
    from .service import ControllerService

    service = ControllerService(cfg)
    serve_metrics(cfg.metrics_port, "controller")
    with on_stop_signals(service._stop.set):  # also while stepping down: a second signal waits
        try:
            await service.run()
        finally:
            await service.stop()
    return 0


def run_from_args(args: argparse.Namespace) -> int:
    return aioloop.run(serve(config_from_args(args)))


def main() -> int:
    from shared.cliargs import standalone_main

    return standalone_main(
        "python -m services.controller", __doc__, add_controller_arguments, run_from_args
    )


if __name__ == "__main__":
    sys.exit(main())

"""`fleetpulse controller` / `python -m services.controller`: run a controller member."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import uuid
from typing import TYPE_CHECKING

from shared import settings
from shared.metrics_catalog import add_metrics_port_argument, serve_metrics
from shared.signals import on_stop_signals

from .core import ControllerConfig
from .group import DEFAULT_HEARTBEAT_S, DEFAULT_MEMBER_TTL_S
from .policy_host import DEFAULT_TIMEOUT_S as DEFAULT_POLICY_TIMEOUT_S
from .stream import DEFAULT_PARTITIONS, DEFAULT_RETENTION_S

if TYPE_CHECKING:  # the service (and its metric families) load only to run: the `fleetpulse`
    # parser imports this module for its flags in every process
    from .service import ServiceConfig

log = logging.getLogger(__name__)


def add_controller_arguments(p: argparse.ArgumentParser) -> None:
    settings.CONTROLLER_MEMBER_ID.add_flag(p)
    settings.CONTROLLER_OWNER_EPOCH.add_flag(p)
    settings.NAMESPACE.add_flag(p)
    p.add_argument(
        "--partitions", type=int, default=DEFAULT_PARTITIONS, help="FP_REPORTS partitions"
    )
    p.add_argument(
        "--retention-s", type=float, default=DEFAULT_RETENTION_S, help="stream retention"
    )
    p.add_argument(
        "--rebuild-s",
        type=float,
        default=60.0,
        help="history replayed from the stream at start (>= the longest look-back window)",
    )
    p.add_argument("--control-interval-s", type=float, default=0.1)
    p.add_argument(
        "--member-ttl-s",
        type=float,
        default=DEFAULT_MEMBER_TTL_S,
        help="a member not heard from this long is gone and its partitions are taken over",
    )
    p.add_argument(
        "--heartbeat-s",
        type=float,
        default=DEFAULT_HEARTBEAT_S,
        help="how often a member refreshes its group entry (keep several per TTL)",
    )
    settings.CONTROLLER_STREAM_REPLICAS.add_flag(p)
    add_metrics_port_argument(p)
    settings.CONTROLLER_DECODE_THREADS.add_flag(p)
    p.add_argument(
        "--custom-policy-timeout-s",
        type=_positive,
        default=float(
            os.environ.get("FLEETPULSE_CUSTOM_POLICY_TIMEOUT_S", str(DEFAULT_POLICY_TIMEOUT_S))
        ),
        help="deadline of one custom autoscaling policy call; past it the default policy decides"
        " that tick, the policy worker process is restarted, and a policy that misses it 3 times"
        f" in a row is quarantined (default: $FLEETPULSE_CUSTOM_POLICY_TIMEOUT_S or"
        f" {DEFAULT_POLICY_TIMEOUT_S:g}; docs/deploy.md)",
    )
    p.add_argument(
        "--stats-file",
        default="",
        help="append per-tick loop stats as JSON lines (benchmarks; see controller/stats.py)",
    )


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def config_from_args(args: argparse.Namespace) -> ServiceConfig:
    from .service import ServiceConfig

    return ServiceConfig(
        nats_url=args.nats,
        core=ControllerConfig(
            namespace=settings.NAMESPACE.resolve(args.namespace, os.environ),
            member_id=settings.CONTROLLER_MEMBER_ID.resolve(args.member_id, os.environ)
            or f"c-{uuid.uuid4().hex[:8]}",
            owner_epoch=settings.CONTROLLER_OWNER_EPOCH.resolve(args.owner_epoch, os.environ),
            control_interval_s=args.control_interval_s,
        ),
        partitions=args.partitions,
        retention_s=args.retention_s,
        rebuild_s=args.rebuild_s,
        metrics_port=args.metrics_port,
        stream_replicas=settings.CONTROLLER_STREAM_REPLICAS.resolve(
            args.stream_replicas, os.environ
        ),
        member_ttl_s=args.member_ttl_s,
        heartbeat_s=args.heartbeat_s,
        stats_file=args.stats_file,
        decode_threads=settings.CONTROLLER_DECODE_THREADS.resolve(args.decode_threads, os.environ),
        policy_timeout_s=args.custom_policy_timeout_s,
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
    return asyncio.run(serve(config_from_args(args)))


def main() -> int:
    from shared.cliargs import standalone_main

    return standalone_main(
        "python -m services.controller", __doc__, add_controller_arguments, run_from_args
    )


if __name__ == "__main__":
    sys.exit(main())

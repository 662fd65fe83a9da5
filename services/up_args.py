"""The flags of `fleetpulse up`, apart from services/up.py: building the `fleetpulse` parser must
not import the services themselves (each would register its metric families in every process)."""

from __future__ import annotations

import argparse

from shared import settings


def add_up_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--nats",
        dest="external_nats",
        default=None,
        metavar="URL",
        help="use this NATS server instead of starting the embedded one",
    )
    p.add_argument("--port", type=int, default=0, help="embedded nats-server port (default: free)")
    p.add_argument("--config", metavar="APP_YAML", help="deploy your own app instead of the demo")
    p.add_argument(
        "--forever", action="store_true", help="keep serving after the demo (or with --config)"
    )
    p.add_argument(
        "--quick", action="store_true", help="a shorter demo (about a minute; used by the tests)"
    )
    p.add_argument(
        "--max-replicas",
        type=int,
        default=settings.AGENT_MAX_REPLICAS.default,
        help="this machine's replica capacity (the local agent's --max-replicas)",
    )
    p.add_argument(
        "--resource",
        action="append",
        default=[],
        metavar="NAME=AMOUNT",
        help="a resource the local agent offers, e.g. gpus=1 (repeatable; as `fleetpulse agent`)",
    )
    p.add_argument(
        "--http-port",
        type=int,
        default=settings.PROXY_PORT.default,
        help="HTTP ingress port (0: a free port)",
    )
    settings.PROXY_FRONT.add_flag(p)
    p.add_argument(
        "--auth",
        action="store_true",
        help="run the NATS auth callout (`fleetpulse auth`) on the embedded server: each "
        "replica gets permissions for itself only (not with --nats)",
    )
    p.add_argument(
        "--no-live", action="store_true", help="print status lines instead of a live table"
    )

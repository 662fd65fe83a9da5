"""`fleetpulse up`: fleetpulse on one machine, on an embedded nats-server.

Today it starts the embedded nats-server (JetStream on, a temporary store) and prints how to
connect services and callers to it; the controller, agent and demo app join it as they land
(see README "Status of the services").
"""

from __future__ import annotations

import argparse
import signal
import threading
import time

from shared.natsserver import NatsServer


def add_up_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--port",
        type=int,
        default=0,
        help="client port for the embedded nats-server (default: a free port)",
    )
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop after this many seconds (default: run until Ctrl-C)",
    )


def run_up(args: argparse.Namespace) -> int:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    server = NatsServer(port=args.port)
    print("fleetpulse up: starting the embedded nats-server ...", flush=True)
    with server:
        print(
            f"\n  NATS is ready at {server.url} (JetStream on, store {server.store_dir})\n\n"
            "  Connect a replica:\n"
            f"    fleetpulse replica --nats {server.url} --app demo --deployment Echo \\\n"
            "        --import-path services.examples.echo:Echo\n"
            "  Connect the gateway, then call it from any NATS client:\n"
            f"    fleetpulse router --nats {server.url}\n"
            f"    nats --server {server.url} request fp.v1.call.demo.Echo 'hello'\n\n"
            "  Press Ctrl-C to stop.\n",
            flush=True,
        )
        deadline = None if args.duration is None else time.monotonic() + args.duration
        while not stop.is_set():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            stop.wait(0.5 if remaining is None else min(0.5, remaining))
    print("fleetpulse up: stopped; nats-server shut down.", flush=True)
    return 0

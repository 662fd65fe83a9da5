"""Operator commands: `fleetpulse deploy`, `fleetpulse delete` (ops.deploy), `fleetpulse status`
(ops.status). Each module exposes `add_*_arguments(parser)` and `run_*(args) -> int`.

What they share lives here: connecting with a clear message, opening a KV bucket that may not
exist yet, and one exit code per kind of failure (scripts can tell a bad file from a dead server):
0 done, 1 NATS unreachable or refused the operation, 2 bad input (file, app name, flags).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from shared.bus import Bus
from shared.errors import (
    BusAuthError,
    BusError,
    ConfigError,
    FleetpulseError,
    UsageError,
)
from shared.natsbus import NatsBus
from shared.natskv import UNAVAILABLE_RETRY_S

EXIT_OK = 0
EXIT_UNAVAILABLE = 1
EXIT_INVALID = 2
CONNECT_TIMEOUT_S = 5.0
NATS_URL_ENV = "FLEETPULSE_NATS_URL"


def add_connect_timeout(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--connect-timeout",
        type=float,
        default=CONNECT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"give up when NATS does not answer within this time (default {CONNECT_TIMEOUT_S:g})",
    )


def nats_url(args: argparse.Namespace) -> str:
    """`--nats` (the CLI fills it), else $FLEETPULSE_NATS_URL, else the local default."""
    from shared.cliargs import default_nats_url

    url = getattr(args, "nats", None)
    return str(url) if url else default_nats_url()


async def connect(args: argparse.Namespace, name: str) -> Bus:
    url = nats_url(args)
    timeout = float(getattr(args, "connect_timeout", CONNECT_TIMEOUT_S))
    try:
        # a one-off command outlasts a JetStream leader election instead of failing on it
        return await NatsBus.connect(
            url, name=name, connect_timeout=timeout, unavailable_retry_s=UNAVAILABLE_RETRY_S
        )
    except BusAuthError:
        raise  # it says which identity was refused; retrying elsewhere will not help
    except BusError as exc:
        cause = exc.__cause__
        why = f"{type(cause).__name__}: {cause}" if cause is not None and str(cause) else ""
        raise BusError(
            f"cannot reach NATS at {url}: no connection within {timeout:g}s"
            f"{' (' + why + ')' if why else ''}; is nats-server running there? "
            f"(set --nats URL or ${NATS_URL_ENV})"
        ) from None


def run_command(command: str, main: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """Run one command's coroutine; print a failure on stderr and map it to its exit code."""
    try:
        return asyncio.run(main())
    except (ConfigError, UsageError, BusAuthError) as exc:
        return fail(command, str(exc), EXIT_INVALID)
    except FleetpulseError as exc:
        return fail(command, str(exc), EXIT_UNAVAILABLE)


def fail(command: str, message: str, code: int) -> int:
    print(f"fleetpulse {command}: error: {message}", file=sys.stderr, flush=True)
    return code


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"

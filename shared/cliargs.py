"""The flags every service's command line shares: the NATS connection and `python -m services.X`.

`services/cli.py` (the `fleetpulse` entry point) and each `services/*/__main__.py` build their
parsers from these, so a service's `__main__` never imports the CLI (which imports every service).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable

from shared import settings
from shared.errors import FleetpulseError
from shared.natsauth import ENV_PREFIX, NatsAuth, set_process_auth

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"

Command = Callable[[argparse.Namespace], int]


def default_nats_url() -> str:
    return os.environ.get("FLEETPULSE_NATS_URL", DEFAULT_NATS_URL)


NATS_AUTH_FLAGS = (
    ("user", "NAME", "NATS user (with --nats-password)"),
    ("password", "SECRET", "NATS password (prefer the env var: flags show in `ps`)"),
    ("token", "SECRET", "NATS token"),
    ("creds", "FILE", "NATS creds file (JWT and nkey seed)"),
    ("tls-ca", "FILE", "CA bundle to verify the NATS server (also turned on by tls:// URLs)"),
    ("tls-cert", "FILE", "client certificate for mutual TLS"),
    ("tls-key", "FILE", "the client certificate's key"),
)


def add_nats_flag(p: argparse.ArgumentParser) -> None:
    """--nats URL plus credentials and TLS (`shared/natsauth.py`), each defaulting to its
    FLEETPULSE_NATS_* variable."""
    group = p.add_argument_group("NATS connection")
    group.add_argument(
        "--nats",
        default=None,
        metavar="URL",
        help="NATS server URL(s), comma-separated "
        "(default: $FLEETPULSE_NATS_URL, then nats://127.0.0.1:4222)",
    )
    add_nats_auth_flags(group)


def add_nats_auth_flags(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    for name, metavar, text in NATS_AUTH_FLAGS:
        env = ENV_PREFIX + name.upper().replace("-", "_")
        p.add_argument(f"--nats-{name}", default=None, metavar=metavar, help=f"{text} (${env})")


def apply_nats_flags(args: argparse.Namespace) -> None:
    """Fill --nats from the env and make the credentials the process's (validated)."""
    if getattr(args, "nats", "unset") is None:
        args.nats = default_nats_url()
    flags = {
        name.replace("-", "_"): getattr(args, "nats_" + name.replace("-", "_"), None)
        for name, _, _ in NATS_AUTH_FLAGS
    }
    set_process_auth(NatsAuth.from_env().overridden(**flags))


def standalone_main(
    prog: str,
    description: str | None,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    run: Command,
) -> int:
    """`python -m services.X`: the same flags as `fleetpulse X`, for images and supervisors."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_nats_flag(parser)
    add_arguments(parser)
    settings.LOG_LEVEL.add_flag(parser)
    args = parser.parse_args()
    return run_parsed(args, run, prog)


def log_level(args: argparse.Namespace, default: str = "INFO") -> str:
    """--log-level, else $FLEETPULSE_LOG_LEVEL (read now, when the command starts), else
    `default` (INFO; the `fleetpulse` tools' WARNING)."""
    level: str | None = settings.LOG_LEVEL.resolve(args.log_level, os.environ)
    return level or default


def run_parsed(args: argparse.Namespace, run: Command, prog: str, *, nats: bool = True) -> int:
    """Log at `args.log_level`, apply the NATS flags (`nats`), run; a FleetpulseError is
    `PROG: error: ...` and exit code 2, Ctrl-C exit code 130."""
    logging.basicConfig(
        level=getattr(logging, log_level(args).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        if nats:
            apply_nats_flags(args)
        return run(args)
    except FleetpulseError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130

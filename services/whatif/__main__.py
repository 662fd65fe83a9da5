"""`python -m services.whatif replay|tune`: `fleetpulse replay --what-if` and `fleetpulse tune`
without the launcher."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from shared import settings
from shared.cliargs import run_parsed
from shared.errors import UsageError

from .run import add_whatif_arguments, run_whatif_args
from .tune import add_tune_arguments, run_tune


def _run_replay(args: argparse.Namespace) -> int:
    if args.what_if is None:
        raise UsageError("python -m services.whatif replay needs --what-if APP_YAML")
    return run_whatif_args(args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.whatif")
    settings.LOG_LEVEL.add_flag(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("replay", help="run a recording through an autoscaling config")
    rep.add_argument("path", type=Path, metavar="FILE|DIR", help="a recording file or directory")
    add_whatif_arguments(rep)
    rep.set_defaults(func=_run_replay)
    tun = sub.add_parser("tune", help="search autoscaling configs on a recording")
    add_tune_arguments(tun)
    tun.set_defaults(func=run_tune)
    args = parser.parse_args(argv)
    return run_parsed(args, args.func, f"fleetpulse {args.command}", nats=False)


if __name__ == "__main__":
    sys.exit(main())

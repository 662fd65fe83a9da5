"""`python -m services.recorder record|replay ...` (the same as `fleetpulse record|replay`).

`services/cli.py` wires `add_record_arguments`/`run_record` and `add_replay_arguments`/
`run_replay` into the `fleetpulse` command; this entry point exists so a compose service can run
the recorder with nothing but the package installed. `replay` here republishes; the what-if
(`fleetpulse replay --what-if`) is `python -m services.whatif replay`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from shared.errors import FleetpulseError

from .record import add_record_arguments, run_record
from .replay import add_replay_arguments, run_replay

__all__ = ["add_record_arguments", "add_replay_arguments", "main", "run_record", "run_replay"]


def main(argv: Sequence[str] | None = None) -> int:
    from shared.cliargs import add_nats_flag, apply_nats_flags

    parser = argparse.ArgumentParser(prog="python -m services.recorder")
    parser.add_argument("--log-level", default=os.environ.get("FLEETPULSE_LOG_LEVEL", "INFO"))
    sub = parser.add_subparsers(dest="command", required=True)
    for name, add, run, help_ in (
        ("record", add_record_arguments, run_record, "record NATS subjects to Arrow IPC files"),
        ("replay", add_replay_arguments, run_replay, "republish a recording, or run what-if"),
    ):
        p = sub.add_parser(name, help=help_)
        add_nats_flag(p)
        add(p)
        p.set_defaults(func=run)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        apply_nats_flags(args)
        code: int = args.func(args)
    except FleetpulseError as exc:
        print(f"fleetpulse {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())

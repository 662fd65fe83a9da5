"""`python -m services.recorder record|replay ...` (the same as `fleetpulse record|replay`).

`services/cli.py` wires `add_record_arguments`/`run_record` and `add_replay_arguments`/
`run_replay` into the `fleetpulse` command; this entry point exists so a compose service can run
the recorder with nothing but the package installed. `replay` here republishes; the what-if
(`fleetpulse replay --what-if`) is `python -m services.whatif replay`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from shared import settings

from .record import add_record_arguments, run_record
from .replay import add_replay_arguments, run_replay

__all__ = ["add_record_arguments", "add_replay_arguments", "main", "run_record", "run_replay"]


def main(argv: Sequence[str] | None = None) -> int:
    from shared.cliargs import add_nats_flag, run_parsed

    parser = argparse.ArgumentParser(prog="python -m services.recorder")
    settings.LOG_LEVEL.add_flag(parser)
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
    return run_parsed(args, args.func, f"fleetpulse {args.command}")


if __name__ == "__main__":
    sys.exit(main())

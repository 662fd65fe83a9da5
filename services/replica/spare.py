"""`python -m services.replica.spare`: a replica process started before it is needed.

How it works: an agent keeps a spare (services/agent/spare.py) so that a replica's start, the
longest hop of a wake from zero, does not begin with an interpreter start and its imports
(~0.2-0.3 s here, most of the wake). The spare imports what every replica imports (the replica's
entry point and the HTTP server stack), then blocks on one line of stdin: the order, a JSON
object {"args", "env", "cwd", "log"}. On it the process becomes that replica, as if started with
them: its output goes to the replica's log file, stdin to /dev/null, the environment is replaced
by the order's, the working directory and sys.path follow `cwd` and the order's PYTHONPATH, and
the replica's `main()` runs with `args`. Its exit status is the replica's, and its command line
(`ps`, /proc) reads as the replica's (set_cmdline).

Only what a started interpreter cannot take back is fixed at the spare's own start: the Python
executable, the interpreter's PYTHON* start-up variables (the agent uses a spare only when the
order's agree with its own), `PR_SET_PDEATHSIG` and the session (the agent sets both, as for any
replica). EOF before an order (the agent retired the spare, or went away): exit 0, quietly.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ORDER_KEYS = frozenset({"args", "env", "cwd", "log"})
PRELOAD = (
    "services.replica.http_server",
    "shared.cliargs",
    "uvloop",
    "uvicorn.lifespan.on",
    "uvicorn.protocols.http.httptools_impl",
    "concurrent.futures.thread",
    "encodings.idna",
)
"""Besides the entry point: what a replica imports later, as it starts serving (the HTTP
server's protocols, its loop), measured with scripts/bench/replica_footprint.py."""


class BadOrder(ValueError):
    """The line on stdin is not an order."""


def read_order(line: bytes) -> dict[str, Any]:
    """The order on one line of stdin; BadOrder when it is not one."""
    try:
        order = json.loads(line)
    except ValueError as exc:
        raise BadOrder(f"not JSON: {exc}") from None
    if not isinstance(order, dict) or set(order) != ORDER_KEYS:
        raise BadOrder(f"an order has exactly the keys {sorted(ORDER_KEYS)}")
    args, env = order["args"], order["env"]
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise BadOrder("args: a list of strings")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise BadOrder("env: an object of strings")
    if not isinstance(order["cwd"], str) or not isinstance(order["log"], str):
        raise BadOrder("cwd and log: strings")
    return order


def become(order: Mapping[str, Any]) -> None:
    """This process takes the order's output, environment, directory and import path."""
    fd = os.open(order["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    first = sys.path[0] if sys.path else None
    here = os.getcwd()
    os.environ.clear()
    os.environ.update(order["env"])
    if order["cwd"] != here:
        os.chdir(order["cwd"])
        if first == here:  # `python -m` puts the working directory first on sys.path
            sys.path[0] = os.getcwd()
    set_pythonpath(sys.path, order["env"].get("PYTHONPATH", ""))
    importlib.invalidate_caches()


def set_pythonpath(path: list[str], pythonpath: str) -> None:
    """The order's PYTHONPATH entries right after sys.path[0], where a fresh interpreter puts
    them (ahead of the standard library and site-packages); entries already there move up."""
    entries = list(dict.fromkeys(p for p in pythonpath.split(os.pathsep) if p))
    rest = [p for p in path[1:] if p not in entries]
    path[:] = [*path[:1], *entries, *rest]


def set_cmdline(argv: Sequence[str]) -> bool:
    """Make this process's command line (/proc/PID/cmdline, what `ps` and tools that find
    replicas by their arguments read) `argv`, as far as the room the spare was started with
    allows (the agent pads it). Linux; False where it cannot, and then nothing is written: the
    region is written only when it holds exactly what /proc says the command line is."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (stat fields 48, 49)
        now = Path("/proc/self/cmdline").read_bytes()
    except (OSError, IndexError, ValueError):
        return False
    room = end - start
    if start <= 0 or room <= 0 or ctypes.string_at(start, room) != now:
        return False
    data = b"\0".join(a.encode() for a in argv)[: room - 1]
    ctypes.memmove(start, data + b"\0" * (room - len(data)), room)
    return True


def main() -> int:
    import services.replica.__main__ as replica  # what a replica's cold start spends its time on

    replica.import_uvicorn_lean()  # before http_server imports uvicorn, as in serve_http
    for name in PRELOAD:
        # an optional piece missing (uvloop): the replica goes without it too
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    line = sys.stdin.buffer.readline()
    if not line.strip():
        return 0
    try:
        order = read_order(line)
    except BadOrder as exc:
        print(f"services.replica.spare: {exc}", file=sys.stderr)
        return 2
    become(order)
    set_cmdline([sys.executable, "-m", "services.replica", *order["args"]])
    sys.argv = ["services.replica", *order["args"]]
    return replica.main()


if __name__ == "__main__":
    sys.exit(main())

"""The policy worker: a child process of a controller member that runs its custom policies.

How it works. The member (policy_host.py) starts `python -m services.controller.policy_worker
IN OUT PROGRESS` with two pipe descriptors and a shared memory file, and talks to it in frames
on the pipes: a 4-byte big-endian length, then the payload. The member sends pickled tuples (it
is this process's parent: trusted); the worker answers in msgpack, plain data only, so nothing a
policy returns is unpickled in the member. The policy state a policy returns is pickled here and
kept by the member as bytes, sent back with the next call: a restarted worker loses nothing, and
the member never loads user objects.

    member -> worker                            worker -> member
    ("path", sys_path)  first, then:            ["ready", pid]          once started
    ("load", [path, ...])                       ["loaded", path, error or None] per path
    ("call", serial, forget, configs, rows,     ["answer", outcome, count, state, detail,
     flush_at)                                   seconds] per row, in order

`configs` are the AutoscalingConfigs this worker has not seen, by slot ({slot: config}; `forget`
clears the table first): a config pickles in ~15 us, so each is sent once, not with every call.
A row is (path, app, deployment, running, target, demand, queued, metrics, min, max, now, slot,
window_full, state).

Before each call the worker writes (serial, row index, time.monotonic()) into PROGRESS: the
member reads there which call is running and since when, so it enforces each call's deadline
and, when one hangs or kills this process, knows which one did, without a message (and a wakeup
of its loop) per call. The answers go out together at the end of the batch, and before row
`flush_at`, the first call of a policy that timed out last time: should it hang again, the
answers before it are already out.

The worker does nothing on its own: it reads, runs, answers. It dies with the member
(PR_SET_PDEATHSIG, set by the member when it starts it) and exits when its input closes.
"""

from __future__ import annotations

import mmap
import os
import pickle
import struct
import sys
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import msgpack

from shared.appconfig import AutoscalingConfig

from .custom_policy import BAD_VALUE, EMPTY_STATE, OK, AutoscalingContext, CustomMetric
from .policy_runner import Loaded, invoke

HEADER: Final = struct.Struct(">I")
PROGRESS: Final = struct.Struct("=qqd")
"""(batch serial, row index, monotonic start) of the call running now."""
MAX_FRAME: Final = 256 * 1024 * 1024
"""A frame longer than this is a broken stream, not a message."""
MAX_STATE_BYTES: Final = 1024 * 1024
"""A policy_state that pickles to more than this is a bad value: it travels with every call."""
MAX_DETAIL: Final = 500
"""Characters of an error kept in an answer."""


def read_exact(fd: int, n: int) -> bytes | None:
    """n bytes from fd, or None at end of input."""
    parts, left = [], n
    while left:
        chunk = os.read(fd, left)
        if not chunk:
            return None
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def write_all(fd: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def frame(message: list[Any]) -> bytes:
    payload = msgpack.packb(message)
    return HEADER.pack(len(payload)) + payload


class Worker:
    def __init__(self, out_fd: int, progress: mmap.mmap | bytearray) -> None:
        self.out = out_fd
        self.progress = progress
        self.loaded = Loaded()
        self.configs: dict[int, AutoscalingConfig] = {}

    def send(self, message: list[Any]) -> None:
        write_all(self.out, frame(message))

    def handle(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "path":
            sys.path[:] = message[1]
        elif kind == "load":
            for path in message[1]:
                fn = self.loaded.get(path, retry=True)  # the member paces the retries
                self.send(["loaded", path, fn if isinstance(fn, str) else None])
        elif kind == "call":
            _, serial, forget, configs, rows, flush_at = message
            if forget:
                self.configs.clear()
            self.configs.update(configs)
            out = bytearray()
            for i, row in enumerate(rows):
                if i == flush_at and out:
                    write_all(self.out, out)
                    out.clear()
                PROGRESS.pack_into(self.progress, 0, serial, i, time.monotonic())
                out += frame(self.call(row))
            write_all(self.out, out)

    def call(self, row: tuple[Any, ...]) -> list[Any]:
        (path, app, dep, running, target, demand, queued, metrics, lo, hi, now, slot, full,
         state_bytes) = row  # fmt: skip
        fn = self.loaded.get(path)
        if isinstance(fn, str):  # the member loads before it calls: only if it changed
            return ["answer", "not_loaded", 0, None, fn[:MAX_DETAIL], None]
        state: Mapping[str, Any] = EMPTY_STATE
        if state_bytes is not None:
            state = MappingProxyType(pickle.loads(state_bytes))
        custom = MappingProxyType({m[0]: CustomMetric(m[1], m[2], m[3]) for m in metrics})
        ctx = AutoscalingContext(
            app, dep, running, target, demand, queued, custom, lo, hi, state, now,
            self.configs[slot], full,
        )  # fmt: skip
        started = time.perf_counter()
        outcome, count, new_state, detail = invoke(fn, ctx)
        took = time.perf_counter() - started
        kept = None
        if new_state is not None:
            try:
                kept = pickle.dumps(dict(new_state), pickle.HIGHEST_PROTOCOL)
            except Exception as exc:  # a lambda, a lock, ...: the member cannot keep it
                outcome, count, detail = BAD_VALUE, 0, f"policy_state does not pickle: {exc}"
            else:
                if len(kept) > MAX_STATE_BYTES:
                    outcome, count, detail = (
                        BAD_VALUE, 0, f"policy_state pickles to {len(kept)} bytes (> 1 MiB)"
                    )  # fmt: skip
            if outcome != OK:
                kept = None
        return ["answer", outcome, count, kept, detail[:MAX_DETAIL], took]


def main(argv: list[str]) -> int:
    in_fd, out_fd, progress_fd = int(argv[1]), int(argv[2]), int(argv[3])
    worker = Worker(out_fd, mmap.mmap(progress_fd, PROGRESS.size))
    worker.send(["ready", os.getpid()])
    while True:
        header = read_exact(in_fd, HEADER.size)
        if header is None:
            return 0  # the member closed its end: nothing more to do
        (size,) = HEADER.unpack(header)
        if size > MAX_FRAME:
            return 2
        payload = read_exact(in_fd, size)
        if payload is None:
            return 0
        worker.handle(pickle.loads(payload))


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""Give freed heap memory back to the kernel when a process goes idle (glibc `malloc_trim`).

Why: a replica under load allocates and frees request bodies, headers, msgpack buffers and
coroutine frames by the thousand. CPython hands blocks over 512 B to the C allocator, and glibc's
malloc keeps what is freed: the main heap shrinks only from its top (one live block above a free
megabyte pins it) and the other arenas (one per thread that allocated: the NATS reader, the
metrics server) hardly ever. So the resident size after a burst stays at its high-water mark
although most of it is free. `malloc_trim(0)` walks every arena and returns each free page to the
kernel (madvise DONTNEED), wherever it lies in the heap. It costs a few milliseconds, so it runs
once an idle spell begins, never on the request path.

How it works: `IdleTrim` is a pure decision over (activity count, requests in flight, now):
trim once the count has stopped moving for `idle_s` with nothing in flight, and only if it moved
since the last trim (an idle replica is not trimmed over and over). `run_idle_trim` is its shell:
a task that samples the counters every `period_s` (two attribute reads) and calls `malloc_trim`.
Outside glibc (musl, macOS) `malloc_trim` is unavailable and the task does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from shared.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)

IDLE_S: Final = 1.0
"""Quiet time before a trim: longer than the gaps inside a burst, short enough that a replica
that served a burst is back to its idle size before anyone looks."""
PERIOD_S: Final = 0.5
"""How often the counters are sampled: two attribute reads, nothing on the request path."""

_Trim = Callable[[int], int]
_UNLOADED: Final = object()
_trim_fn: object = _UNLOADED


def _libc_trim() -> _Trim | None:
    """glibc's malloc_trim, or None where there is none (loaded once)."""
    global _trim_fn
    if _trim_fn is _UNLOADED:
        fn: _Trim | None = None
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            raw = libc.malloc_trim
        except (OSError, AttributeError):
            pass
        else:
            raw.argtypes = [ctypes.c_size_t]
            raw.restype = ctypes.c_int
            fn = raw
        _trim_fn = fn
    return _trim_fn  # type: ignore[return-value]


def malloc_trim() -> bool:
    """Return free heap pages to the kernel; True if glibc released any, False otherwise (also
    where malloc_trim does not exist)."""
    fn = _libc_trim()
    return bool(fn(0)) if fn is not None else False


def trim_available() -> bool:
    return _libc_trim() is not None


@dataclass(slots=True)
class IdleTrim:
    """When to trim: the activity count has not moved for `idle_s`, nothing is in flight, and
    it moved since the last trim (or since the start: a replica that only started up is trimmed
    once too)."""

    idle_s: float = IDLE_S
    _seen: int = -1
    _since: float = 0.0
    _trimmed_at: int = -2

    def step(self, activity: int, in_flight: int, now: float) -> bool:
        if activity != self._seen or in_flight > 0:
            self._seen = activity
            self._since = now
            if in_flight > 0:
                self._seen = -1  # a request still running: start counting once it ends
            return False
        if now - self._since < self.idle_s or self._trimmed_at == activity:
            return False
        self._trimmed_at = activity
        return True


async def run_idle_trim(
    activity: Callable[[], int],
    in_flight: Callable[[], int],
    *,
    idle_s: float | None = None,
    period_s: float | None = None,
    clock: Clock = SYSTEM_CLOCK,
    trim: Callable[[], bool] | None = None,
) -> None:
    """Until cancelled: trim the heap at the start of each idle spell (see IdleTrim); defaults
    IDLE_S, PERIOD_S and glibc's malloc_trim (read when called, so a test can set them)."""
    if trim is None:
        if not trim_available():
            log.debug("no malloc_trim here (not glibc): idle trimming off")
            return
        trim = malloc_trim
    period = PERIOD_S if period_s is None else period_s
    decide = IdleTrim(IDLE_S if idle_s is None else idle_s)
    while True:
        await asyncio.sleep(period)
        if decide.step(activity(), in_flight(), clock.monotonic()):
            t0 = clock.monotonic()
            released = trim()
            log.debug(
                "idle: heap trimmed in %.1f ms (released: %s)",
                (clock.monotonic() - t0) * 1e3,
                released,
            )

"""Stopping a service on SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def on_stop_signals(callback: Callable[[], object]) -> Iterator[None]:
    """Call `callback` on SIGTERM or SIGINT while inside, then restore the default handling.
    Where the loop cannot take signal handlers (not the main thread, as when a test runs a
    service in a thread) nothing is installed: the caller's own stop event still works."""
    loop = asyncio.get_running_loop()
    handled: list[signal.Signals] = []
    for sig in STOP_SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, callback)
            handled.append(sig)
    try:
        yield
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)

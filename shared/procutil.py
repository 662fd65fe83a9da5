"""Child processes that die with their parent (Linux), so a crashed parent leaves no orphans."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., Any] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., Any] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


_PRCTL = _load_prctl()


def die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn making the child get SIGKILL when this process dies, or None where that is
    not possible.

    PR_SET_PDEATHSIG fires when the *thread* that forked exits, not the process, so it is only
    armed when forking from the main thread (which lives as long as the process).
    """
    if _PRCTL is None or threading.current_thread() is not threading.main_thread():
        return None
    prctl = _PRCTL
    parent = os.getpid()
    sigkill = int(signal.SIGKILL)

    def setup() -> None:
        prctl(_PR_SET_PDEATHSIG, sigkill, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return setup

"""nats-py without aiohttp: a replica imports only what talking NATS over TCP needs.

How it works: nats-py imports aiohttp at import time when it is installed (nats/aio/transport.py,
in a `try/except ImportError`), for its WebSocket transport only. fleetpulse connects over TCP
(`nats://`, `tls://`), and in a replica process that import alone was ~0.1 s of a cold start
and ~15 MB resident. `import_nats_lean()` imports nats-py with aiohttp hidden for that one
import (a `None` in sys.modules makes `import aiohttp` raise ImportError, which nats-py takes as
"not installed"), then un-hides it, so user code can still import aiohttp itself. Where a server
URL asks for WebSockets (`ws://`, `wss://`), `websocket_support()` gives nats-py its aiohttp
after all, before it connects (its WebSocket transport reads the module global at connect time).
Nothing changes in a process that imported nats-py or aiohttp before: each step is a no-op there.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable

_HIDDEN = "aiohttp"
_TRANSPORT = "nats.aio.transport"
WEBSOCKET_SCHEMES = ("ws://", "wss://")


def import_nats_lean() -> bool:
    """Import nats-py without aiohttp; False when nats-py (or aiohttp) was already imported,
    so there was nothing to leave out."""
    if _TRANSPORT in sys.modules or _HIDDEN in sys.modules:
        return False
    sys.modules[_HIDDEN] = None  # type: ignore[assignment]  # "import of aiohttp halted"
    try:
        importlib.import_module("nats")
    finally:
        if sys.modules.get(_HIDDEN, 0) is None:
            del sys.modules[_HIDDEN]
    return True


def websocket_support(servers: Iterable[str]) -> None:
    """Before connecting to `servers`: if one is a WebSocket URL and nats-py was imported
    without aiohttp, import it (and multidict) now and hand them to nats-py's transport."""
    if not any(s.strip().lower().startswith(WEBSOCKET_SCHEMES) for s in servers):
        return
    transport = sys.modules.get(_TRANSPORT)
    if transport is None or getattr(transport, "aiohttp", None) is not None:
        return
    transport.aiohttp = importlib.import_module("aiohttp")  # type: ignore[attr-defined]
    transport.multidict = importlib.import_module("multidict")  # type: ignore[attr-defined]

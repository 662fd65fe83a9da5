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

importlib.metadata is hidden for that import too: nats-py imports it only to read its own version
(sent in CONNECT), and with it came zipfile, csv, email.message and importlib.resources, ~1.1 MB
resident in a replica. The version is read from the name of nats-py's dist-info directory
instead (what importlib.metadata reads it from), or by importlib.metadata where there is none.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable

_HIDDEN = "aiohttp"
_METADATA = "importlib.metadata"
_TRANSPORT = "nats.aio.transport"
_CLIENT = "nats.aio.client"
_DIST = "nats_py-"
WEBSOCKET_SCHEMES = ("ws://", "wss://")


def import_nats_lean() -> bool:
    """Import nats-py without aiohttp; False when nats-py (or aiohttp) was already imported,
    so there was nothing to leave out."""
    if _TRANSPORT in sys.modules or _HIDDEN in sys.modules:
        return False
    hidden = [m for m in (_HIDDEN, _METADATA) if m not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # "import of ... halted"
    try:
        importlib.import_module("nats")
    finally:
        for name in hidden:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]
    if _METADATA in hidden:
        site = os.path.dirname(os.path.dirname(sys.modules["nats"].__file__ or ""))
        sys.modules[_CLIENT].__version__ = nats_version(site)  # type: ignore[attr-defined]
    return True


def nats_version(site: str) -> str:
    """nats-py's version, as the name of its dist-info directory in `site` (where the nats
    package is) says; else importlib.metadata's answer (imported here: ~1.1 MB resident, see
    the module's docstring), else nats-py's own fallback "0.0.0"."""
    try:
        names = os.listdir(site)
    except OSError:
        names = []
    for name in names:
        if name.startswith(_DIST) and name.endswith(".dist-info"):
            return name[len(_DIST) : -len(".dist-info")]
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nats-py")
    except PackageNotFoundError:
        return "0.0.0"


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

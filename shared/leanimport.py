"""A package imported without its `__init__` until a name of it is used: for a replica's footprint.

Why: some packages' `__init__` imports far more than the submodules a process uses. In a
replica, prometheus_client's brings its exposition (http.server, urllib.request, wsgiref) and
uvicorn's its command line (click) and reload supervisors (multiprocessing): ~1.2 and ~1.4 MB
resident of a replica's ~39 (scripts/bench/replica_footprint.py), for code a replica runs only
if asked (a --metrics-port) or never (uvicorn's CLI).

How it works: `import_deferred(package, submodules)` puts a module for `package` in sys.modules,
made from its spec but not executed, and imports `submodules` under it as usual. `names` maps a
name the package re-exports to the submodule that defines it (`uvicorn.Config`), so that looking
it up needs no `__init__`. Any other attribute the module lacks runs the package's real
`__init__` into that same module object, once (the modules in `hide` hidden from that import, as
`import_nats_lean` hides aiohttp), after which it is the package exactly as if imported whole:
`from prometheus_client import start_http_server`, `prometheus_client.REGISTRY`, `uvicorn.run`.
Nothing is done where the package was imported already.

`defer_module(name)` does the same for a plain module some import only names: a stand-in in
sys.modules (and on its parent package) until an attribute of it is looked up, which imports the
real module in its place. uvicorn.config imports logging.config (with logging.handlers,
socketserver and pickle: ~0.7 MB in a replica) for a `log_config` a replica does not give.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType


def import_deferred(
    package: str,
    submodules: Sequence[str],
    *,
    names: Mapping[str, str] | None = None,
    hide: Sequence[str] = (),
) -> bool:
    """Import `submodules` of `package` with the package's `__init__` deferred (see the module's
    docstring); False (nothing done) when the package was imported already or is not an
    ordinary package."""
    if package in sys.modules:
        return False
    spec = importlib.util.find_spec(package)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return False
    module = importlib.util.module_from_spec(spec)
    loader, lock = spec.loader, threading.Lock()
    sources = dict(names or {})
    leaning = True

    def complete(name: str) -> object:
        source = sources.get(name)
        if source is not None:
            value = getattr(importlib.import_module(source), name)
            module.__dict__.setdefault(name, value)
            return value
        if leaning:  # `from . import values` while the submodules load: the import system's turn
            raise AttributeError(name)
        with lock:
            if module.__dict__.get("__getattr__") is complete:
                del module.__dict__["__getattr__"]
                run_init(module, loader.exec_module, hide)
        try:
            return module.__dict__[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    module.__dict__["__getattr__"] = complete
    sys.modules[package] = module
    try:
        for name in submodules:
            importlib.import_module(name)
    finally:
        leaning = False
    return True


def defer_module(name: str) -> bool:
    """A stand-in for module `name` until an attribute of it is used (see the module's
    docstring); False (nothing done) when it was imported already. Its parent is imported."""
    if name in sys.modules:
        return False
    parent, _, child = name.rpartition(".")
    stand_in = ModuleType(name, f"{name}, imported at its first use (shared/leanimport.py)")
    lock = threading.Lock()

    def load(attr: str) -> object:
        if attr.startswith("__") and attr.endswith("__") and attr != "__all__":
            raise AttributeError(attr)  # a scan of sys.modules (__file__, __spec__) loads nothing
        with lock:
            module = sys.modules.get(name)
            if module is stand_in or module is None:
                sys.modules.pop(name, None)
                module = importlib.import_module(name)
        return getattr(module, attr)

    stand_in.__dict__["__getattr__"] = load
    if parent:
        setattr(importlib.import_module(parent), child, stand_in)
    sys.modules[name] = stand_in
    return True


def run_init(
    module: ModuleType, execute: Callable[[ModuleType], None], hide: Sequence[str]
) -> None:
    """The package's own `__init__` into `module`, with `hide` hidden from its imports."""
    hidden = [name for name in hide if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # an import of it raises ImportError
    try:
        execute(module)
    finally:
        for name in hidden:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]

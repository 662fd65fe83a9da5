"""A replica process imports only what serving needs (docs/operations.md, "Replica footprint").

Each check runs a fresh interpreter (`sys.executable`, the tree on PYTHONPATH), imports what
`python -m services.replica` imports at start, and reads its sys.modules: a new import of
pyarrow, numpy or aiohttp anywhere in the replica's closure (shared/ included) fails here
instead of silently costing every cold start ~0.1-0.3 s and tens of MB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.procs import ROOT

FORBIDDEN = ("pyarrow", "numpy", "aiohttp", "pandas", "yaml", "jsonschema", "matplotlib")
"""Packages a serving replica does not need: the columnar codec and recording (pyarrow, numpy),
the old proxy's HTTP stack and nats-py's WebSocket transport (aiohttp), config files (yaml)."""


def run_python(code: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout.strip().splitlines()[-1]


def closure(*modules: str) -> set[str]:
    """The top-level packages in sys.modules after importing `modules` in a fresh process."""
    code = [
        "import json, sys",
        *(f"import {m}" for m in modules),
        'print(json.dumps(sorted({k.split(".")[0] for k, v in sys.modules.items() if v})))',
    ]
    return set(json.loads(run_python("\n".join(code))))


def test_the_replica_entry_point_imports_no_pyarrow_numpy_or_aiohttp() -> None:
    tops = closure("services.replica.__main__")
    assert "nats" in tops and "services" in tops  # the check looks at a real closure
    assert sorted(tops & set(FORBIDDEN)) == []


@pytest.mark.parametrize(
    "module",
    ["services.replica.runtime", "services.replica.usercode", "fleetpulse.serve"],
)
def test_what_a_replica_builds_on_imports_none_of_them_either(module: str) -> None:
    assert sorted(closure("services.replica", module) & set(FORBIDDEN)) == []


def test_a_replica_holding_a_handle_imports_no_pyarrow_for_its_router() -> None:
    # composition: the router runs in the replica's process; its narrow reports are msgpack,
    # pyarrow is for wide ones only (numpy stays: the router's windows are numpy arrays)
    tops = closure("services.replica.__main__", "services.router.handle")
    assert sorted(tops & (set(FORBIDDEN) - {"numpy"})) == []


def test_user_code_in_a_replica_can_still_import_aiohttp() -> None:
    out = run_python("""
        import services.replica.__main__, sys
        assert "aiohttp" not in sys.modules
        import aiohttp
        print(aiohttp.ClientSession.__name__)
    """)
    assert out == "ClientSession"


def test_a_websocket_nats_url_gets_nats_py_its_aiohttp_back() -> None:
    out = run_python("""
        import sys
        from shared.natslean import import_nats_lean, websocket_support
        assert import_nats_lean()
        import nats.aio.transport as t
        assert t.aiohttp is None and "aiohttp" not in sys.modules
        websocket_support(["nats://127.0.0.1:1"])  # TCP: nothing to do
        assert t.aiohttp is None
        websocket_support(["nats://a:1", " WS://b:2"])
        print(t.aiohttp.__name__, t.multidict.__name__)
    """)
    assert out == "aiohttp multidict"


def test_lean_import_changes_nothing_where_nats_py_came_first() -> None:
    out = run_python("""
        import nats, nats.aio.transport as t
        from shared.natslean import import_nats_lean
        print(import_nats_lean(), t.aiohttp is not None)
    """)
    assert out == "False True"


def test_websockets_is_imported_at_the_first_upgrade_not_when_http_starts() -> None:
    # a replica serving HTTP (its server configured and loaded) carries no websockets package
    # (~3 MB resident) until a connection asks for one; the spare preloads it neither
    code = "\n".join(
        [
            "import json, sys",
            "import services.replica.spare as spare",
            "import importlib",
            "for m in spare.PRELOAD: importlib.import_module(m)",
            "from services.replica.http_server import ReplicaHttpServer",
            "async def app(scope, receive, send): pass",
            "server = ReplicaHttpServer(app, lifespan='off')",
            "server.config.load()",
            "before = 'websockets' in sys.modules",
            "from services.replica.http_server import LazyWebSocketProtocol",
            "from uvicorn.server import ServerState",
            "p = LazyWebSocketProtocol(config=server.config, server_state=ServerState(),"
            " app_state={})",
            "print(json.dumps([before, 'websockets' in sys.modules, type(p).__name__]))",
        ]
    )
    before, after, kind = json.loads(run_python(code))
    assert (before, after, kind) == (False, True, "WebSocketsSansIOProtocol")


def test_nats_py_comes_in_without_importlib_metadata_and_still_knows_its_version() -> None:
    # importlib.metadata (zipfile, csv, email.message, importlib.resources: ~1.1 MB resident in
    # a replica) was nats-py's only to read its version, which it sends in CONNECT
    out = run_python("""
        import json, sys
        import services.replica.__main__
        import nats.aio.client as client
        before = "importlib.metadata" in sys.modules
        from importlib.metadata import version
        print(json.dumps([before, client.__version__, version("nats-py")]))
    """)
    before, told, installed = json.loads(out)
    assert before is False
    assert told == installed != "0.0.0"


def test_nats_version_without_a_dist_info_directory_asks_importlib_metadata(tmp_path: Path) -> None:
    from importlib.metadata import version

    from shared.natslean import nats_version

    assert nats_version(str(tmp_path)) == version("nats-py")
    assert nats_version(str(tmp_path / "missing")) == version("nats-py")
    (tmp_path / "nats_py-9.8.7.dist-info").mkdir()
    assert nats_version(str(tmp_path)) == "9.8.7"


def test_prometheus_client_comes_in_without_its_exposition_until_a_name_of_it_is_used() -> None:
    # the exposition (http.server, urllib.request, wsgiref: ~1.2 MB resident in a replica) and the
    # default collectors load at the first use of the package, which is then as if whole
    out = run_python("""
        import json, sys
        import services.replica.__main__
        lean = [m in sys.modules for m in ("prometheus_client.exposition", "http.server",
                                           "urllib.request", "prometheus_client.gc_collector")]
        from prometheus_client import REGISTRY, generate_latest
        from services.replica.metrics import HTTP_REFUSED
        HTTP_REFUSED.labels("400").inc()
        text = generate_latest(REGISTRY).decode()
        names = ("fleetpulse_replica_http_refused_total", "process_", "python_gc_", "python_info")
        print(json.dumps([lean, [n in text for n in names]]))
    """)
    lean, served = json.loads(out)
    assert lean == [False, False, False, False]
    assert served == [True, True, True, True]


def test_prometheus_lean_import_is_a_no_op_where_the_package_came_first() -> None:
    out = run_python("""
        import prometheus_client
        from services.replica.metrics import import_prometheus_lean
        print(import_prometheus_lean(), "__getattr__" in vars(prometheus_client))
    """)
    assert out == "False False"


def test_an_ingress_replica_loads_uvicorn_without_its_command_line_or_reloaders() -> None:
    # uvicorn's __init__ imports its CLI (click) and reload supervisors (multiprocessing):
    # ~1.4 MB resident, logging.config 0.7 MB; the replica's HTTP stack needs uvicorn.config and uvicorn.server
    out = run_python("""
        import importlib, json, sys
        import services.replica.__main__ as replica
        import services.replica.spare as spare
        replica.import_uvicorn_lean()
        for m in spare.PRELOAD: importlib.import_module(m)
        gone = ["click", "multiprocessing", "uvicorn.main", "watchfiles", "logging.handlers",
                "socketserver", "pickle"]
        lean = [m in sys.modules for m in gone]
        import uvicorn
        from uvicorn.server import Server
        from logging.config import dictConfig
        import logging
        whole = [uvicorn.Server is Server, callable(uvicorn.run), "click" in sys.modules,
                 "watchfiles" in sys.modules, logging.config.dictConfig is dictConfig,
                 sys.modules["logging.config"] is logging.config]
        print(json.dumps([lean, whole]))
    """)
    lean, whole = json.loads(out)
    assert lean == [False] * 7  # logging.config: uvicorn.config's, for a log_config not given
    assert whole == [True, True, True, False, True, True]  # uvicorn.run: whole, no watchfiles


def test_decimal_is_not_imported_to_write_json_and_a_decimal_is_still_written() -> None:
    # asgi.jsonable writes a Decimal as a string; importing decimal for that test cost a
    # replica ~0.3 MB resident, and no value is a Decimal where nothing imported decimal
    out = run_python("""
        import json, sys
        import services.replica.__main__, services.replica.asgi as asgi
        before = "decimal" in sys.modules
        import decimal
        print(json.dumps([before, asgi.jsonable(decimal.Decimal("1.50"))]))
    """)
    assert json.loads(out) == [False, "1.50"]


def test_a_replica_holding_a_handle_keeps_prometheus_client_lean() -> None:
    # the router's metrics take prometheus_client's classes, not its package: the exposition
    # (http.server, wsgiref, urllib.request) stays out of a replica until something scrapes it
    out = run_python("""
        import json, sys
        import services.replica.__main__, services.router.handle
        print(json.dumps("prometheus_client.exposition" in sys.modules))
    """)
    assert json.loads(out) is False

"""What the ASGI request model costs on the replica's direct HTTP path.

Five servers, each uvicorn's Server (uvloop) in a process of its own on a free port, with the
replica's HTTP/1.1 connections (services/replica/http11.py) as a replica runs its server,
answering a 256 B POST with its body:

- `raw_uvicorn`: a bare ASGI callable on uvicorn's own httptools protocol (what the replica ran
  before http11.py; head and body in two sends);
- `raw`: the same callable on the replica's protocol (no Starlette, no fleetpulse): the floor;
- `call`: the replica's ASGI app for a `__call__` deployment (services/replica/asgi.py):
  `async def __call__(self, request): return await request.body()` with a Starlette Request;
- `fastapi_plain`: the same FastAPI route as a plain function, the app served by uvicorn as it
  is (what FastAPI itself costs);
- `fastapi`: the replica's ASGI app for an `@serve.ingress(FastAPI())` class, the route a method
  (what the class-based view and the replica's wrapper add to FastAPI's cost).

The client (scripts/bench/httpclient.py, a lean keep-alive client in this process) runs
sequential (1 connection) and 16 concurrent closed loops against each server, alternating the
servers round by round so the noise of a shared machine falls on all alike; the table
gives p50/p99 latency, requests per second, and the ratio to `raw`.

    .venv/bin/python -m scripts.bench.asgi_model [--rounds 3] [--seconds 2] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from fleetpulse import serve
from scripts.bench.common import (
    ROOT,
    add_smoke,
    percentiles,
    print_table,
    result_line,
    shown,
    write_json,
)
from scripts.bench.httpclient import Connection, Endpoint, build_request, checked, closed_loop

NAME = "asgi_model"
VARIANTS = ("raw_uvicorn", "raw", "call", "fastapi_plain", "fastapi")
BODY = b"x" * 256


# -- the servers (run with --serve VARIANT in their own process) -------------------------------


async def _raw(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/octet-stream")]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


class Echo:
    async def __call__(self, request: Any) -> bytes:
        return bytes(await request.body())


api = FastAPI()


@serve.ingress(api)
class Api:
    @api.post("/")
    async def echo(self, request: Request) -> Response:
        return Response(await request.body(), media_type="application/octet-stream")


plain_api = FastAPI()


@plain_api.post("/")
async def plain_echo(request: Request) -> Response:
    return Response(await request.body(), media_type="application/octet-stream")


async def _app_for(variant: str) -> Any:
    if variant in ("raw", "raw_uvicorn"):
        return _raw
    if variant == "fastapi_plain":
        return plain_api
    from services.replica.asgi import build_asgi_app
    from services.replica.usercode import UserDeployment

    target = Echo if variant == "call" else Api
    user = await UserDeployment.create("bench:echo", (), {}, target=target)
    app = build_asgi_app(user)
    await app.startup()
    return app


def serve(variant: str) -> None:
    import uvicorn
    import uvloop

    async def main() -> None:
        app = await _app_for(variant)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        from services.replica.http11 import HttpConnection

        http = "httptools" if variant == "raw_uvicorn" else HttpConnection
        config = uvicorn.Config(app, http=http, loop="none", lifespan="off",
                                access_log=False, log_level="warning")  # fmt: skip
        server = uvicorn.Server(config)
        print(f"PORT {sock.getsockname()[1]}", flush=True)
        await server.serve(sockets=[sock])

    uvloop.run(main())


# -- the client --------------------------------------------------------------------------------


def _start(variant: str) -> tuple[subprocess.Popen[bytes], int]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "scripts.bench.asgi_model", "--serve", variant],
        cwd=ROOT, env=env, stdout=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"the {variant} server did not start: {line!r}")
    return proc, int(line.split()[1])


async def _measure(port: int, workers: int, seconds: float) -> dict[str, Any]:
    endpoint = Endpoint("127.0.0.1", port, "/")
    raw = build_request("POST", endpoint, body=BODY)
    conns = [Connection(endpoint) for _ in range(workers)]
    for conn in conns:
        await conn.connect()
        r = await conn.request(raw)  # warm-up, and the answer checked once
        assert r.status == 200 and bytes(r.body) == BODY, (r.status, bytes(r.body)[:60])
    res = await closed_loop([checked(c, raw, len(BODY)) for c in conns], seconds)
    for conn in conns:
        conn.close()
    if res.errors:
        raise RuntimeError(f"{res.errors} errors: {res.first_error}")
    return {**percentiles(res.latencies_s), "rps": res.throughput}


async def bench(rounds: int, seconds: float) -> dict[str, Any]:
    servers = {v: _start(v) for v in VARIANTS}
    samples: dict[tuple[str, int], list[dict[str, Any]]] = {}
    try:
        for _ in range(rounds):
            for workers in (1, 16):
                for variant in VARIANTS:  # alternated: the machine's noise falls on all alike
                    got = await _measure(servers[variant][1], workers, seconds)
                    samples.setdefault((variant, workers), []).append(got)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
        for proc, _ in servers.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    out: dict[str, Any] = {}
    for (variant, workers), runs in samples.items():
        best = min(runs, key=lambda r: r["p50_ms"])  # the least disturbed round
        out[f"{variant}_{workers}"] = {
            "p50_ms": best["p50_ms"],
            "p99_ms": best["p99_ms"],
            "rps": max(r["rps"] for r in runs),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0, help="each closed loop's length")
    ap.add_argument("--serve", choices=VARIANTS, help=argparse.SUPPRESS)
    add_smoke(ap, "one round of 0.3 s loops")
    args = ap.parse_args()
    if args.serve:
        serve(args.serve)
        return
    rounds, seconds = (1, 0.3) if args.smoke else (args.rounds, args.seconds)
    res = asyncio.run(bench(rounds, seconds))
    rows = []
    for workers in (1, 16):
        base = res[f"raw_{workers}"]
        for variant in VARIANTS:
            r = res[f"{variant}_{workers}"]
            rows.append([variant, workers, r["p50_ms"], r["p99_ms"], round(r["rps"]),
                         r["p50_ms"] / base["p50_ms"], r["rps"] / base["rps"]])  # fmt: skip
    print_table(
        f"ASGI request model on the direct path (256 B POST echo, best of {rounds} rounds)",
        ["server", "conns", "p50 ms", "p99 ms", "req/s", "p50 x raw", "req/s x raw"],
        rows,
    )
    path = write_json(NAME, {"rounds": rounds, "seconds": seconds, "results": res})
    print(f"\nwrote {shown(path)}")
    for workers in (1, 16):
        base = res[f"raw_{workers}"]
        for variant in VARIANTS:
            r = res[f"{variant}_{workers}"]
            result_line(NAME, server=variant, conns=workers, p50_ms=r["p50_ms"],
                        rps=r["rps"], p50_vs_raw=r["p50_ms"] / base["p50_ms"])  # fmt: skip


if __name__ == "__main__":
    main()

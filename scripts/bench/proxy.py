"""Proxy benchmark: what the HTTP ingress adds to a call, against calling the handle directly.

One embedded nats-server, one replica process hosting `Echo` and one proxy process
(`python -m services.proxy`). The client (this process) sends the same payload to the same
replica method (`Echo.__call__`, body kind "http") two ways, alternating rounds so machine noise
hits both alike, one request at a time:

- direct: through the process-wide router of the deployment (`DeploymentHandle`'s), the same
  call the proxy makes;
- proxy: an HTTP POST to the proxy over one keep-alive connection (aiohttp client).

The added latency is proxy minus direct, per percentile. For reference, two more targets run in
the same rounds: `handle.remote()` to `Echo.echo` (msgpack arguments instead of an HttpRequest),
and a bare aiohttp echo server process (the floor of one extra HTTP hop on this machine, with
the same client).

    .venv/bin/python -m scripts.bench.proxy [--requests 3000] [--payload 256] [--rounds 10] [--smoke]

Output: a table, bench-results/proxy.json, docs/img/proxy.png, and the summary line
`RESULT bench=proxy added_p50_ms=X added_p99_ms=Y`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from scripts.bench.common import (
    ROOT,
    add_smoke,
    percentiles,
    plot_path,
    print_table,
    result_line,
    shown,
    write_json,
)
from services.router.config import RouterConfig
from services.router.handle import connect_handle, release_router, shared_router
from services.router.http import read_head, send_http
from services.router.testing import Seat, put_membership
from shared.kv.status import AppStatusView, DeploymentStatusView
from shared.natsbus import NatsBus
from shared.natsserver import NatsServer
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.subjects import KV_STATUS
from shared.wire.messages import HttpRequest

APP, DEPLOYMENT, REPLICA, PREFIX = "bench", "Echo", "b1", "/bench"
PLOT_NAME = "proxy.png"
LISTENING_RE = re.compile(r"proxy: listening on (http://\S+)")
BARE_RE = re.compile(r"bare: listening on (http://\S+)")
BARE_SERVER = """
import asyncio
from aiohttp import web

async def echo(request):
    return web.Response(body=await request.read())

async def main():
    app = web.Application()
    app.router.add_post("/{tail:.*}", echo)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    print(f"bare: listening on http://{host}:{port}", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""
WARMUP = 300
SMOKE = {"requests": 40, "rounds": 2, "warmup": 10}
START_TIMEOUT_S = 30.0


def spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, *args], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )


def listening_url(log: Path, pattern: re.Pattern[str] = LISTENING_RE) -> str | None:
    m = pattern.search(log.read_text(errors="replace")) if log.exists() else None
    return m.group(1) if m else None


async def wait_for_proxy(log: Path, pattern: re.Pattern[str] = LISTENING_RE) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if url := listening_url(log, pattern):
            return url
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{log.stem} did not start (see {log})")


async def publish_app(bus: NatsBus) -> None:
    """What a controller would write: the replica's membership and a HEALTHY status."""
    await put_membership(bus, APP, DEPLOYMENT, 1, [Seat(REPLICA, S.rpc(APP, DEPLOYMENT, REPLICA))])
    view = DeploymentStatusView("HEALTHY", "", 1, 1, 0.0, 1, 0, "")
    status = AppStatusView(APP, "RUNNING", PREFIX, DEPLOYMENT, time.time(), 1, {DEPLOYMENT: view})
    await (await bus.kv(KV_STATUS)).put(APP, status.encode())


async def wait_until_served(http: aiohttp.ClientSession, payload: bytes) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            async with http.post(PREFIX, data=payload) as resp:
                if resp.status == 200 and await resp.read() == payload:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    raise TimeoutError("the proxy never served the benchmark app")


async def run(
    requests: int, payload_size: int, rounds: int, warmup: int = WARMUP
) -> dict[str, Any]:
    payload = os.urandom(payload_size)
    server = NatsServer().start()
    tmp = Path(tempfile.mkdtemp(prefix="fleetpulse-bench-proxy-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(
            spawn(
                ["-m", "services.replica", "--nats", server.url, "--app", APP,
                 "--deployment", DEPLOYMENT, "--import-path", "services.examples.echo:Echo",
                 "--replica-id", REPLICA, "--max-ongoing-requests", "100"],
                tmp / "replica.log",
            )
        )  # fmt: skip
        procs.append(
            spawn(
                ["-m", "services.proxy", "--nats", server.url, "--port", "0"],
                tmp / "proxy.log",
            )
        )  # fmt: skip
        procs.append(spawn(["-c", BARE_SERVER], tmp / "bare.log"))
        bus = await NatsBus.connect(server.url, name="bench-client")
        try:
            await publish_app(bus)
            url = await wait_for_proxy(tmp / "proxy.log")
            bare = await wait_for_proxy(tmp / "bare.log", BARE_RE)
            cpu = {"proxy": procs[1].pid, "bare_http": procs[2].pid}
            return await measure(bus, url, bare, payload, requests, rounds, cpu, warmup)
        finally:
            await bus.close()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
        server.stop()


async def measure(
    bus: NatsBus,
    url: str,
    bare_url: str,
    payload: bytes,
    requests: int,
    rounds: int,
    cpu_pids: dict[str, int],
    warmup: int = WARMUP,
) -> dict[str, Any]:
    router = shared_router(bus, APP, DEPLOYMENT, config=RouterConfig())
    handle = await connect_handle(APP, DEPLOYMENT, bus=bus, config=RouterConfig())
    echo = handle.options(method="echo")
    request = HttpRequest(
        "POST", PREFIX, "", (("content-type", "application/octet-stream"),), payload
    )
    connector = aiohttp.TCPConnector(limit=1)
    http = aiohttp.ClientSession(url, connector=connector)
    bare_http = aiohttp.ClientSession(bare_url, connector=aiohttp.TCPConnector(limit=1))
    try:
        await wait_until_served(http, payload)

        async def direct() -> float:
            t0 = time.perf_counter()
            reader = await send_http(
                router, request, method="__call__", deadline_s=None, stream=True
            )
            head = await read_head(reader)
            while await reader.next_chunk() is not None:
                pass
            await reader.close()
            elapsed = time.perf_counter() - t0
            assert head.status == 200 and head.body == payload
            return elapsed

        async def proxied() -> float:
            t0 = time.perf_counter()
            async with http.post(PREFIX, data=payload) as resp:
                body = await resp.read()
            elapsed = time.perf_counter() - t0
            assert resp.status == 200 and body == payload
            return elapsed

        async def remote() -> float:
            t0 = time.perf_counter()
            result = await echo.remote(payload)
            elapsed = time.perf_counter() - t0
            assert result == payload
            return elapsed

        async def bare() -> float:
            t0 = time.perf_counter()
            async with bare_http.post(PREFIX, data=payload) as resp:
                body = await resp.read()
            elapsed = time.perf_counter() - t0
            assert resp.status == 200 and body == payload
            return elapsed

        targets: dict[str, Callable[[], Awaitable[float]]] = {
            "direct": direct,
            "proxy": proxied,
            "remote": remote,
            "bare_http": bare,
        }
        for fn in targets.values():  # warm up every path
            for _ in range(warmup):
                await fn()
        samples: dict[str, list[float]] = {name: [] for name in targets}
        cpu_before = {name: cpu_seconds(pid) for name, pid in cpu_pids.items()}
        client_cpu = dict.fromkeys(targets, 0.0)
        per_round = max(1, requests // rounds)
        names = list(targets)
        for r in range(rounds):
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                fn = targets[name]
                t0 = time.process_time()
                samples[name].extend([await fn() for _ in range(per_round)])
                client_cpu[name] += time.process_time() - t0
            print(f"  round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
        cpu_us = {
            name: (cpu_seconds(pid) - cpu_before[name]) / len(samples[name]) * 1e6
            for name, pid in cpu_pids.items()
            if cpu_before[name] is not None
        }
    finally:
        await http.close()
        await bare_http.close()
        await handle.close()
        await release_router(router)
    res: dict[str, Any] = {name: percentiles(s) for name, s in samples.items()}
    res["payload_bytes"] = len(payload)
    res["server_cpu_us_per_request"] = cpu_us
    res["client_cpu_us_per_request"] = {
        name: client_cpu[name] / len(s) * 1e6 for name, s in samples.items()
    }
    res["samples_ms"] = {name: [x * 1e3 for x in s] for name, s in samples.items()}
    return res


def cpu_seconds(pid: int) -> Any:
    """User + system CPU time of a process (Linux /proc; None elsewhere). It measures what a
    server spends per request regardless of how busy the machine is."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def plot(samples_ms: dict[str, Sequence[float]]) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        print("WARNING: matplotlib is not installed, skipping the plot", file=sys.stderr)
        return None
    labels = {
        "direct": "router, http body (direct)",
        "proxy": "HTTP through the proxy",
        "remote": "handle.remote() (reference)",
        "bare_http": "bare aiohttp echo (HTTP hop floor)",
    }
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, values in samples_ms.items():
        xs = np.sort(np.asarray(values))
        ax.plot(xs, np.arange(1, xs.size + 1) / xs.size, label=labels.get(name, name))
    ax.set(xscale="log", xlabel="round trip, ms (log)", ylabel="fraction of requests")
    ax.set_title("One request at a time: proxy vs direct")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    path = plot_path(PLOT_NAME)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return shown(path)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=3000, help="per target (default 3000)")
    p.add_argument("--payload", type=int, default=256, help="payload bytes (default 256)")
    p.add_argument("--rounds", type=int, default=10, help="alternating rounds (default 10)")
    p.add_argument("--no-plot", action="store_true", help="skip docs/img/proxy.png")
    add_smoke(p, "40 requests per target in 2 rounds, 10 to warm up")
    args = p.parse_args(argv)
    if args.smoke:
        args.requests, args.rounds = SMOKE["requests"], SMOKE["rounds"]
    warmup = SMOKE["warmup"] if args.smoke else WARMUP
    res = asyncio.run(run(args.requests, args.payload, args.rounds, warmup))
    samples = res.pop("samples_ms")
    rows = [
        [label, res[name]["n"], res[name]["p50_ms"], res[name]["p90_ms"], res[name]["p99_ms"]]
        for name, label in (
            ("direct", "router, http body (direct)"),
            ("proxy", "HTTP POST through the proxy"),
            ("remote", "handle.remote() (reference)"),
            ("bare_http", "bare aiohttp echo (HTTP hop floor)"),
        )
    ]
    print_table(
        f"proxy vs direct, {args.payload} B payload, one request at a time",
        ["target", "n", "p50 ms", "p90 ms", "p99 ms"],
        rows,
    )
    added = {q: res["proxy"][f"{q}_ms"] - res["direct"][f"{q}_ms"] for q in ("p50", "p90", "p99")}
    res["added_ms"] = added
    print(
        f"\nadded by the proxy: p50 {added['p50']:.3f} ms, p90 {added['p90']:.3f} ms, "
        f"p99 {added['p99']:.3f} ms"
    )
    client, server = res["client_cpu_us_per_request"], res["server_cpu_us_per_request"]
    print(
        "CPU per request, µs: "
        f"client direct {client['direct']:.0f}; proxy process {server.get('proxy', 0):.0f} "
        f"(client side of it {client['proxy']:.0f}); bare HTTP server "
        f"{server.get('bare_http', 0):.0f} (client side {client['bare_http']:.0f})"
    )
    if not args.no_plot and (path := plot(samples)):
        res["plot"] = path
        print(f"wrote {path}")
    out = write_json("proxy", res)
    print(f"wrote {out}")
    result_line("proxy", added_p50_ms=added["p50"], added_p99_ms=added["p99"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

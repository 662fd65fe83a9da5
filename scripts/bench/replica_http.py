"""A replica serving HTTP itself, on uvloop (what `python -m services.replica` runs) and on
asyncio's own loop, side by side in one run: is uvloop worth it, and what the direct path costs.

How it works: one nats-server; per round, for each loop (the order alternates between rounds), a
replica process of an ingress deployment (FLEETPULSE_REPLICA_ROUTE_PREFIX set, as the controller
sets it) running services.examples.echo:Echo. The asyncio variant is the same replica with
services.replica.__main__.run replaced by asyncio.run (nothing else imported).
Measured per replica: time from spawn to its "ready" lifecycle message (which carries the
http_address), resident memory once ready, direct HTTP (scripts/bench/httpclient.py, keep-alive,
256 B echo) sequential p50/p99 and 16 concurrent req/s, the replica's CPU per HTTP request
(/proc utime+stime over the concurrent phase), and the handle path (NATS, sequential p50).

    .venv/bin/python -m scripts.bench.replica_http [--seconds 4] [--rounds 2] [--smoke]

Output: a table, bench-results/replica_http.json, and
`RESULT bench=replica_http http_p50_ratio=.. http_rps_ratio=.. handle_p50_ratio=..` (uvloop over
asyncio: below 1 for latency and above 1 for throughput means uvloop is better).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

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
from services.router.config import RouterConfig
from services.router.handle import connect_handle
from services.router.testing import Seat, put_membership
from shared.bus import Msg
from shared.natsbus import NatsBus
from shared.natsserver import NatsServer
from shared.replicahttp import ROUTE_PREFIX_ENV
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.wire import decode_as
from shared.wire.messages import Lifecycle

LOOPS = ("uvloop", "asyncio")
PAYLOAD = 256
CONCURRENCY = 16
CLK_TCK = os.sysconf("SC_CLK_TCK")


def replica_argv(url: str, rid: str, loop: str) -> list[str]:
    args = [
        "--nats", url, "--app", "bench", "--deployment", "Echo",
        "--import-path", "services.examples.echo:Echo", "--replica-id", rid,
        "--max-ongoing-requests", "100",
    ]  # fmt: skip
    if loop == "uvloop":
        return ["-m", "services.replica", *args]
    return ["-c", ASYNCIO_REPLICA, *args]


ASYNCIO_REPLICA = """
import asyncio, sys
from services.replica import __main__ as m
m.run = lambda main: asyncio.run(main)  # the same replica, on asyncio's own loop
sys.argv[0] = "replica"
sys.exit(m.main())
"""


def spawn(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, *argv], cwd=ROOT, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()  # noqa: SIM115
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):  # noqa: SIM115
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def one(url: str, bus: NatsBus, loop: str, rid: str, seconds: float) -> dict[str, Any]:
    ready: asyncio.Future[Lifecycle] = asyncio.get_running_loop().create_future()

    async def on_lifecycle(msg: Msg) -> None:
        lc = decode_as(msg.data, Lifecycle)
        if lc.state == "ready" and not ready.done():
            ready.set_result(lc)

    sub = await bus.subscribe(S.report("lifecycle", "bench", "Echo", rid), on_lifecycle)
    await bus.flush()
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{ROUTE_PREFIX_ENV: "/echo"})
    t0 = time.perf_counter()
    proc = spawn(replica_argv(url, rid, loop), env)
    try:
        lc = await asyncio.wait_for(ready, 60)
        start_s = time.perf_counter() - t0
        await sub.unsubscribe()
        assert lc.http_address is not None
        rss = rss_mb(proc.pid)
        endpoint = Endpoint.parse(f"http://{lc.http_address}/echo")
        raw = build_request("POST", endpoint, body=os.urandom(PAYLOAD))
        conns = [Connection(endpoint) for _ in range(CONCURRENCY)]
        for c in conns:
            await c.connect()
        calls = [checked(c, raw, PAYLOAD) for c in conns]
        await closed_loop(calls, min(1.0, seconds / 2))  # warm up
        seq = await closed_loop(calls[:1], seconds)
        cpu0 = cpu_s(proc.pid)
        conc = await closed_loop(calls, seconds)
        cpu_per_req_us = (cpu_s(proc.pid) - cpu0) / max(1, len(conc.latencies_s)) * 1e6
        for c in conns:
            c.close()
        errors = seq.errors + conc.errors
        await put_membership(bus, "bench", "Echo", int(time.time() * 1000), [
            Seat(rid, S.rpc("bench", "Echo", rid))
        ])  # fmt: skip
        handle = await connect_handle("bench", "Echo", bus=bus, config=RouterConfig())
        echo = handle.options(method="echo")
        payload = os.urandom(PAYLOAD)
        for _ in range(50):
            await echo.remote(payload)
        lat: list[float] = []
        stop = time.perf_counter() + seconds
        while time.perf_counter() < stop:
            t = time.perf_counter()
            await echo.remote(payload)
            lat.append(time.perf_counter() - t)
        await handle.close()
    finally:
        proc.terminate()
        proc.wait(30)
    return {
        "loop": loop, "start_s": start_s, "rss_mb": rss, "http_seq": percentiles(seq.latencies_s),
        "http_rps": conc.throughput, "http_conc": percentiles(conc.latencies_s),
        "cpu_us_per_req": cpu_per_req_us, "errors": errors, "handle_seq": percentiles(lat),
    }  # fmt: skip


async def run(seconds: float, rounds: int) -> dict[str, Any]:
    server = NatsServer().start()
    runs: list[dict[str, Any]] = []
    try:
        bus = await NatsBus.connect(server.url, name="bench")
        try:
            for r in range(rounds):
                order = LOOPS if r % 2 == 0 else LOOPS[::-1]
                for loop in order:
                    runs.append(await one(server.url, bus, loop, f"b{r}{loop[0]}", seconds))
                    print(f"  round {r + 1}/{rounds} {loop} done", file=sys.stderr, flush=True)
        finally:
            await bus.close()
    finally:
        server.stop()
    return {"runs": runs, "seconds": seconds, "rounds": rounds, "payload_bytes": PAYLOAD}


def _median(values: list[float]) -> float:
    s = sorted(values)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def summary(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for loop in LOOPS:
        mine = [x for x in runs if x["loop"] == loop]
        out[loop] = {
            "start_s": _median([x["start_s"] for x in mine]),
            "rss_mb": _median([x["rss_mb"] for x in mine]),
            "http_p50_ms": _median([x["http_seq"]["p50_ms"] for x in mine]),
            "http_p99_ms": _median([x["http_seq"]["p99_ms"] for x in mine]),
            "http_rps": _median([x["http_rps"] for x in mine]),
            "http16_p99_ms": _median([x["http_conc"]["p99_ms"] for x in mine]),
            "cpu_us_per_req": _median([x["cpu_us_per_req"] for x in mine]),
            "handle_p50_ms": _median([x["handle_seq"]["p50_ms"] for x in mine]),
            "errors": float(sum(x["errors"] for x in mine)),
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="per phase (default 4)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds, order alternating (default 2)")
    add_smoke(ap, "one round of 0.5 s phases")
    args = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    seconds, rounds = (0.5, 1) if args.smoke else (args.seconds, args.rounds)
    res = asyncio.run(run(seconds, rounds))
    res["summary"] = s = summary(res["runs"])
    cols = ["loop", "start s", "RSS MB", "HTTP p50 ms", "HTTP p99 ms", "16c req/s",
            "16c p99 ms", "CPU us/req", "handle p50 ms", "errors"]  # fmt: skip
    rows = [
        [loop, v["start_s"], v["rss_mb"], v["http_p50_ms"], v["http_p99_ms"], v["http_rps"],
         v["http16_p99_ms"], v["cpu_us_per_req"], v["handle_p50_ms"], int(v["errors"])]
        for loop, v in s.items()
    ]  # fmt: skip
    print_table("replica serving HTTP itself: uvloop vs asyncio (medians over rounds)", cols, rows)
    path = write_json("replica_http", res)
    print(f"wrote {shown(path)}")
    u, a = s["uvloop"], s["asyncio"]
    result_line(
        "replica_http",
        http_p50_ratio=u["http_p50_ms"] / a["http_p50_ms"],
        http_rps_ratio=u["http_rps"] / a["http_rps"],
        handle_p50_ratio=u["handle_p50_ms"] / a["handle_p50_ms"],
        start_ratio=u["start_s"] / a["start_s"],
        errors=int(u["errors"] + a["errors"]),
    )
    return 1 if u["errors"] + a["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())

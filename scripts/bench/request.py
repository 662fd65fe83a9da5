"""Request-path benchmark: `handle.remote()` against a raw nats-py request/reply, same run.

Both targets run in their own process on one embedded nats-server: a raw echo responder (nats-py,
replies with the payload) and a fleetpulse replica hosting `Echo.echo`. The client alternates
rounds between the two so drift in machine load hits both alike, and reports ratios.

    .venv/bin/python -m scripts.bench.request [--requests 3000] [--payload 256] [--loop uvloop]
        [--smoke]

`--loop`: the client's event loop, asyncio (default: what a plain script gets) or uvloop (what
fleetpulse's own services and replicas run, so what a handle inside a deployment gets). The
responders run as they would anyway: the raw one on asyncio, the replica on uvloop.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Sequence

import nats
from nats.aio.client import Client

from scripts.bench.common import (
    ROOT,
    add_smoke,
    percentiles,
    print_table,
    result_line,
    write_json,
)
from services.router.config import RouterConfig
from services.router.handle import connect_handle
from services.router.testing import Seat, put_membership
from shared.natsbus import NatsBus
from shared.natsserver import NatsServer
from shared.subjects import DEFAULT_SUBJECTS as S

RAW_SUBJECT = "bench.raw.echo"
WARMUP = 200
SMOKE = {"requests": 40, "rounds": 2, "warmup": 10}
RAW_RESPONDER = f"""
import asyncio, nats, sys
async def main():
    nc = await nats.connect(sys.argv[1])
    async def cb(m):
        await m.respond(m.data)
    await nc.subscribe("{RAW_SUBJECT}", cb=cb)
    print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


def spawn(args: list[str]) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE)


async def run(
    requests: int, payload_size: int, rounds: int, warmup: int = WARMUP
) -> dict[str, object]:
    payload = os.urandom(payload_size)
    server = NatsServer().start()
    procs = [
        spawn(["-c", RAW_RESPONDER, server.url]),
        spawn(
            [
                "-m", "services.replica", "--nats", server.url, "--app", "bench",
                "--deployment", "Echo", "--import-path", "services.examples.echo:Echo",
                "--replica-id", "b1", "--max-ongoing-requests", "100",
            ]
        ),
    ]  # fmt: skip
    try:
        nc = await nats.connect(server.url)
        bus = await NatsBus.connect(server.url, name="bench-client")
        await _wait_ready(nc, bus)
        await put_membership(bus, "bench", "Echo", 1, [Seat("b1", S.rpc("bench", "Echo", "b1"))])
        handle = await connect_handle("bench", "Echo", bus=bus, config=RouterConfig())
        echo = handle.options(method="echo")

        async def raw_once() -> float:
            t0 = time.perf_counter()
            reply = await nc.request(RAW_SUBJECT, payload, timeout=5)
            assert reply.data == payload
            return time.perf_counter() - t0

        async def handle_once() -> float:
            t0 = time.perf_counter()
            result = await echo.remote(payload)
            assert result == payload
            return time.perf_counter() - t0

        for fn in (raw_once, handle_once):  # warm up both paths
            for _ in range(warmup):
                await fn()
        raw: list[float] = []
        fp: list[float] = []
        per_round = max(1, requests // rounds)
        for r in range(rounds):
            order = (raw_once, handle_once) if r % 2 == 0 else (handle_once, raw_once)
            for fn in order:
                sink = raw if fn is raw_once else fp
                for _ in range(per_round):
                    sink.append(await fn())
            print(f"  round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
        await handle.close()
        await bus.close()
        await nc.close()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
        server.stop()
    return {"raw": percentiles(raw), "fleetpulse": percentiles(fp), "payload_bytes": payload_size}


async def _wait_ready(nc: Client, bus: NatsBus) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            await nc.request(RAW_SUBJECT, b"x", timeout=0.5)
            await bus.request(S.probe("b1"), b"", timeout=0.5)
            return
        except Exception:
            await asyncio.sleep(0.1)
    raise TimeoutError("benchmark targets did not start")


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=3000, help="per target (default 3000)")
    p.add_argument("--payload", type=int, default=256, help="payload bytes (default 256)")
    p.add_argument("--rounds", type=int, default=10, help="alternating rounds (default 10)")
    p.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio",
                   help="the client's event loop (default asyncio)")  # fmt: skip
    add_smoke(p, "40 requests per target in 2 rounds, 10 to warm up")
    args = p.parse_args(argv)
    if args.smoke:
        args.requests, args.rounds = SMOKE["requests"], SMOKE["rounds"]
    warmup = SMOKE["warmup"] if args.smoke else WARMUP
    work = run(args.requests, args.payload, args.rounds, warmup)
    if args.loop == "uvloop":
        import uvloop

        res = uvloop.run(work)
    else:
        res = asyncio.run(work)
    res["loop"] = args.loop
    raw, fp = res["raw"], res["fleetpulse"]
    assert isinstance(raw, dict) and isinstance(fp, dict)
    rows = [
        ["raw nats request/reply", raw["n"], raw["p50_ms"], raw["p90_ms"], raw["p99_ms"]],
        ["fleetpulse handle.remote()", fp["n"], fp["p50_ms"], fp["p90_ms"], fp["p99_ms"]],
    ]
    print_table(
        f"request path, {args.payload} B payload, client on {args.loop}",
        ["target", "n", "p50 ms", "p90 ms", "p99 ms"],
        rows,
    )
    p50_ratio = fp["p50_ms"] / raw["p50_ms"]
    p99_ratio = fp["p99_ms"] / raw["p99_ms"]
    res["p50_ratio"], res["p99_ratio"] = p50_ratio, p99_ratio
    path = write_json("request", res)
    print(f"\nwrote {path}")
    result_line("request", loop=args.loop, p50_ratio=p50_ratio, p99_ratio=p99_ratio)


if __name__ == "__main__":
    main()

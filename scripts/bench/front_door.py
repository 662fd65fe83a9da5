"""The HTTP front door: HAProxy straight to the replica vs the Python proxy over NATS, one run.

One fleet (nats-server, `fleetpulse controller`, `fleetpulse agent`), one echo app at /bench
(scripts/bench/http_ray_app.py, one replica, max_ongoing_requests 100), and two proxies on it:
`--front haproxy` (HAProxy sends the request to the replica's own HTTP server) and
`--front python` (the Python proxy, the request over NATS). Rounds alternate between the two;
each round measures sequential latency (one keep-alive connection) and 16 concurrent
connections' throughput, 256 B POST bodies echoed, with the lean client of
scripts/bench/httpclient.py.

    python -m scripts.bench.front_door            # 5 rounds of 3 s per measurement
    python -m scripts.bench.front_door --smoke    # 1 round of 0.5 s
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scripts.bench import http_ray_driver as driver
from scripts.bench.common import (
    add_smoke,
    percentiles,
    print_table,
    result_line,
    shown,
    start_service,
    stop_services,
    write_json,
)
from scripts.bench.http_ray_systems import APP_FILE, LISTENING_RE, _cli_deploy, _wait_line
from scripts.bench.httpclient import Connection, Endpoint, build_request, checked, closed_loop

FRONTS = ("haproxy", "python")
BODY = b"x" * 256


async def _served(url: str, within_s: float) -> None:
    ep = Endpoint.parse(url)
    raw = build_request("POST", ep, body=BODY)
    deadline = time.monotonic() + within_s
    while True:
        conn = Connection(ep)
        try:
            await conn.connect()
            r = await conn.request(raw)
            if r.status == 200 and bytes(r.body) == BODY:
                return
        except OSError:
            pass
        finally:
            conn.close()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} does not echo within {within_s:g} s")
        await asyncio.sleep(0.2)


async def _load(url: str, workers: int, duration_s: float) -> tuple[list[float], float, int]:
    ep = Endpoint.parse(url)
    raw = build_request("POST", ep, body=BODY)
    conns = [Connection(ep) for _ in range(workers)]
    for c in conns:
        await c.connect()
    try:
        for c in conns:  # warm-up: every connection once
            await checked(c, raw, len(BODY))()
        res = await closed_loop([checked(c, raw, len(BODY)) for c in conns], duration_s)
    finally:
        for c in conns:
            c.close()
    return res.latencies_s, res.throughput, res.errors


async def run(rounds: int, duration_s: float, logs: Path) -> dict[str, Any]:
    from shared.natsserver import NatsServer

    server = await asyncio.to_thread(NatsServer().start)
    nats = server.url
    procs = [
        start_service(
            ["-m", "services.cli", "controller", "--nats", nats, "--rebuild-s", "2"],
            logs / "controller.log",
        ),
    ]
    agent = ["-m", "services.cli", "agent", "--nats", nats, "--agent-id", "bench",
             "--max-replicas", "4", "--log-dir", str(logs / "replicas")]  # fmt: skip
    procs.append(start_service(agent, logs / "agent.log"))
    urls: dict[str, str] = {}
    try:
        for front in FRONTS:
            log = logs / f"proxy-{front}.log"
            proc = start_service(
                ["-m", "services.proxy", "--nats", nats, "--port", "0", "--front", front,
                 "--max-wait", "60", "--no-publish-routes"],
                log,
            )  # fmt: skip
            procs.append(proc)
            urls[front] = await _wait_line(log, LISTENING_RE, 60.0, proc) + driver.BENCH_PREFIX
        app_file = logs / "apps.yaml"
        app_file.write_text(
            APP_FILE.format(
                bench=driver.BENCH_APP, bench_prefix=driver.BENCH_PREFIX,
                bench_dep=driver.BENCH_DEPLOYMENT, zero=driver.ZERO_APP,
                zero_prefix=driver.ZERO_PREFIX, zero_dep=driver.ZERO_DEPLOYMENT,
                max_ongoing=driver.MAX_ONGOING,
            )
        )  # fmt: skip
        await asyncio.to_thread(_cli_deploy, app_file, nats)
        for url in urls.values():
            await _served(url, 90.0)
        await asyncio.sleep(2.0)  # the replica's HTTP address reaches HAProxy
        seq: dict[str, list[float]] = {f: [] for f in FRONTS}
        rps: dict[str, list[float]] = {f: [] for f in FRONTS}
        p99: dict[str, list[float]] = {f: [] for f in FRONTS}
        errors = dict.fromkeys(FRONTS, 0)
        for _ in range(rounds):
            for front in FRONTS:
                lat, _, err = await _load(urls[front], 1, duration_s)
                seq[front].extend(lat)
                _, tput, err16 = await _load(urls[front], 16, duration_s)
                rps[front].append(tput)
                errors[front] += err + err16
        for front in FRONTS:  # p99 under 16 concurrent, one more round each
            lat, _, err = await _load(urls[front], 16, duration_s)
            p99[front].append(percentiles(lat)["p99_ms"])
            errors[front] += err
    finally:
        stop_services(procs)
        await asyncio.to_thread(server.stop)
    return {
        front: {
            "sequential": percentiles(seq[front]),
            "concurrent16_rps": statistics.median(rps[front]),
            "concurrent16_rps_rounds": rps[front],
            "concurrent16_p99_ms": p99[front][0],
            "errors": errors[front],
        }
        for front in FRONTS
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_smoke(ap, "1 round of 0.5 s")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per measurement")
    args = ap.parse_args(argv)
    rounds, duration = (1, 0.5) if args.smoke else (args.rounds, args.duration)
    with tempfile.TemporaryDirectory(prefix="fp-front-door-") as tmp:
        results = asyncio.run(run(rounds, duration, Path(tmp)))
    h, p = results["haproxy"], results["python"]
    rows = [
        [front, r["sequential"]["p50_ms"], r["sequential"]["p99_ms"], r["concurrent16_rps"],
         r["concurrent16_p99_ms"], r["errors"]]
        for front, r in results.items()
    ]  # fmt: skip
    print_table(
        f"HTTP front door, 256 B echo, {rounds} alternated rounds of {duration:g} s",
        ["front", "seq p50 ms", "seq p99 ms", "16-conc req/s", "16-conc p99 ms", "errors"],
        rows,
    )
    path = write_json("front_door", {"rounds": rounds, "duration_s": duration, "results": results})
    print(f"\nJSON: {shown(path)}")
    result_line(
        "front_door",
        haproxy_p50_ms=h["sequential"]["p50_ms"],
        python_p50_ms=p["sequential"]["p50_ms"],
        haproxy_rps16=h["concurrent16_rps"],
        python_rps16=p["concurrent16_rps"],
        speedup_rps16=h["concurrent16_rps"] / max(p["concurrent16_rps"], 1e-9),
        errors=h["errors"] + p["errors"],
    )
    return 0 if h["errors"] + p["errors"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())

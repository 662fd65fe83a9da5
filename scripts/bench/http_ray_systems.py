"""The systems scripts/bench/http_ray.py measures, started and stopped, and their processes' CPU.

- `FleetpulseSystem`: the stack as separate processes, as compose and tests/e2e run it:
  nats-server, `fleetpulse controller`, `fleetpulse agent` (it starts the replicas),
  `python -m services.proxy` (the front door, and whatever it runs under it); two apps of
  scripts/bench/http_ray_app.py deployed with `fleetpulse deploy`: `bench` at /bench (one
  replica, max_ongoing_requests 100) and `zero` at /zero (min_replicas 0). The HTTP rows go to
  the URL the proxy says it listens on, whatever serves it; the handle rows through a
  `DeploymentHandle` in this process; the raw nats-py baseline to a bare responder process on
  the same nats-server.
- `RaySystem`: one Ray Serve mode in its own driver process (scripts/bench/http_ray_driver.py),
  which runs the handle rows; the HTTP rows go to its Serve HTTP port.
- `TargetSystem`: an HTTP endpoint already running (`--target URL`): HTTP rows only.
- `FloorSystem`: the path's floor, no Python on it: fleetpulse's own HAProxy configuration
  (services/proxy/haproxy_config.py) in front of a second HAProxy that answers every request
  itself with 256 B, in place of the replica. Both front doors (fleetpulse's and Ray's fastest)
  take these two hops; what a system measures above the floor is its replica's own cost.

CPU: `roles()` names each system's processes by what they do (read from /proc, again before
every measurement, so a restarted HAProxy or replica counts); the "data path" roles are what a
user pays per request (front door, replica, transport), the rest (controllers, agents, idle
workers, the other app's replica) is shown apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from scripts.bench import http_ray_driver as driver
from scripts.bench.common import ROOT, start_service, stop_services
from scripts.bench.httpclient import LoadResult, closed_loop

APP_FILE = """
applications:
  - name: {bench}
    route_prefix: {bench_prefix}
    deployments:
      - name: {bench_dep}
        import_path: scripts.bench.http_ray_app:BenchEcho
        num_replicas: 1
        max_ongoing_requests: {max_ongoing}
  - name: {zero}
    route_prefix: {zero_prefix}
    deployments:
      - name: {zero_dep}
        import_path: scripts.bench.http_ray_app:BenchEcho
        max_ongoing_requests: {max_ongoing}
        autoscaling_config:
          min_replicas: 0
          max_replicas: 1
          target_ongoing_requests: 2
          upscale_delay_s: 0
          downscale_delay_s: 1
          downscale_to_zero_delay_s: 1
          look_back_period_s: 1
          metrics_interval_s: 0.5
"""
LISTENING_RE = re.compile(r"listening on (http://[\w.\-\[\]:]+)")
RAW_SUBJECT = "bench.http_ray.raw"
RAW_RESPONDER = f"""
import asyncio, sys, nats
async def main():
    nc = await nats.connect(sys.argv[1])
    async def cb(m):
        await m.respond(m.data)
    await nc.subscribe("{RAW_SUBJECT}", cb=cb)
    print("raw: ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""
DATA_ROLES = ("front door", "replica", "transport")
SMALL_BODY = 256
ANSWER_CONFIG = """
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
frontend answer
  bind 127.0.0.1:{port}
  http-request wait-for-body time 5s
  http-request return status 200 content-type application/octet-stream string {body}
"""
"""The floor's responder: answers every request itself, once its body came."""


# -- processes -----------------------------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        out.setdefault(ppid, []).append(int(entry.name))
    return out


def descendants(root: int, children: dict[int, list[int]] | None = None) -> list[int]:
    kids = children if children is not None else _children()
    out, todo = [], list(kids.get(root, ()))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, ()))
    return out


def using_path(fragment: str) -> list[int]:
    """Processes whose command line names `fragment` (a folder only this run made)."""
    pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    return [p for p in pids if p != os.getpid() and any(fragment in a for a in cmdline(p))]


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").rstrip("\0").split("\0")


def cpu_s(pid: int) -> float | None:
    """utime + stime of one process, seconds (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def cpu_by_role(roles: dict[str, list[int]]) -> dict[int, tuple[str, float]]:
    out = {}
    for role, pids in roles.items():
        for pid in pids:
            t = cpu_s(pid)
            if t is not None:
                out[pid] = (role, t)
    return out


def cpu_delta(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds per role between two snapshots; a process born in between counts from 0."""
    out: dict[str, float] = {}
    for pid, (role, t) in after.items():
        t0 = before.get(pid, (role, 0.0))[1]
        out[role] = out.get(role, 0.0) + max(0.0, t - t0)
    return out


def stop_pids(pids: Iterable[int], grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL what is left after `grace_s`: only the pids given."""
    import signal

    pids = [p for p in pids if cpu_s(p) is not None]
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != b"Z"


def _argv_value(argv: list[str], flag: str) -> str | None:
    try:
        return argv[argv.index(flag) + 1]
    except (ValueError, IndexError):
        return None


# -- the systems ---------------------------------------------------------------------------------


class System:
    """What the benchmark needs of a system under test."""

    name = ""
    url = ""
    """http://host:port of its HTTP front door."""
    bench_path = driver.BENCH_PREFIX
    zero_path = driver.ZERO_PREFIX
    has_handle = True
    has_wake = True
    echoes = True
    """Whether its HTTP answers echo the request body (checked); a --target need not."""

    def roles(self) -> dict[str, list[int]]:
        return {}

    def zero_replicas(self) -> int:
        """Live replica processes of the `zero` app."""
        return 0

    def replica_rss_mb(self) -> float | None:
        pids = self.roles().get("replica", [])
        return rss_mb(pids[0]) if len(pids) == 1 else None

    async def at_zero(self) -> bool:
        return self.zero_replicas() == 0

    async def handle_load(
        self, size: int, workers: int, duration_s: float, warmup: int
    ) -> tuple[LoadResult, float]:
        raise NotImplementedError

    async def stop(self) -> None:
        return None


class TargetSystem(System):
    name = "endpoint"
    has_handle = False
    has_wake = False
    echoes = False  # any app (the compose stack's greeter): only a 200 is required

    def __init__(self, url: str) -> None:
        from scripts.bench.httpclient import Endpoint

        ep = Endpoint.parse(url)
        self.url = f"http://{ep.authority}"
        self.bench_path = ep.path


class FloorSystem(TargetSystem):
    """Two HAProxy processes, started here: fleetpulse's front door configuration routing
    `/bench` to a responder that answers `http-request return` (200, 256 B) after the body
    came: the same client, kernel hops and front door as the systems, without a replica."""

    name = "floor"
    sizes = (SMALL_BODY,)
    """Its answer is 256 B: a 64 KiB echo row would not measure the same work."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.dir = Path(tempfile.mkdtemp(prefix="fp-bench-floor-"))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.url = ""
        self.bench_path = driver.BENCH_PREFIX
        self.start_s = 0.0

    async def start(self, timeout_s: float) -> None:
        from services.proxy.haproxy import find_haproxy_binary, max_connections
        from services.proxy.haproxy_config import (
            AppFront,
            Endpoint,
            FrontSettings,
            FrontState,
            render_config,
        )
        from shared.natsserver import free_ports

        t0 = time.monotonic()
        binary = find_haproxy_binary()
        front, answer = free_ports(2)
        app = AppFront(driver.BENCH_APP, driver.BENCH_PREFIX, True, 100,
                       (Endpoint("floor", "127.0.0.1", answer, 100), None, None, None))  # fmt: skip
        settings = FrontSettings(
            bind=f"127.0.0.1:{front}", python_host="127.0.0.1", python_port=9,
            admin_socket=str(self.dir / "admin.sock"), queue_timeout_s=5.0, retry_after_s=1,
            maxconn=max_connections(),
        )  # fmt: skip
        configs = {
            "floor-front": render_config(FrontState((app,)), settings),
            "floor-answer": ANSWER_CONFIG.format(port=answer, body="x" * SMALL_BODY),
        }
        for name, text in configs.items():
            self.procs[name] = self._haproxy(binary, name, text)
        self.url = f"http://127.0.0.1:{front}"
        await _wait_served(self.url + self.bench_path, timeout_s, echo=False,
                           procs=self.procs.values())  # fmt: skip
        self.start_s = time.monotonic() - t0

    def _haproxy(self, binary: str, name: str, config: str) -> subprocess.Popen[bytes]:
        cfg = self.dir / f"{name}.cfg"
        cfg.write_text(config)
        with open(self.log_dir / f"{name}.log", "wb") as out:
            return subprocess.Popen(
                [binary, "-f", str(cfg), "-db"], stdout=out, stderr=subprocess.STDOUT
            )

    def roles(self) -> dict[str, list[int]]:
        return {
            "front door": [self.procs["floor-front"].pid],
            "replica": [self.procs["floor-answer"].pid],
        }

    def replica_rss_mb(self) -> float | None:
        return None  # HAProxy, not a replica

    async def stop(self) -> None:
        stop_services(list(self.procs.values()), 10.0)
        shutil.rmtree(self.dir, ignore_errors=True)


class FleetpulseSystem(System):
    name = "fleetpulse"

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.server: Any = None
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.bus: Any = None
        self.handle: Any = None
        self.nc: Any = None
        self.start_s = 0.0

    async def start(self, timeout_s: float) -> None:
        from shared.natsserver import NatsServer

        t0 = time.monotonic()
        self.server = await asyncio.to_thread(NatsServer().start)
        nats = self.server.url
        logs = self.log_dir
        self.procs["controller"] = start_service(
            ["-m", "services.cli", "controller", "--nats", nats, "--rebuild-s", "2"],
            logs / "fp-controller.log",
        )
        self.procs["agent"] = start_service(
            ["-m", "services.cli", "agent", "--nats", nats, "--agent-id", "bench",
             "--max-replicas", "4", "--log-dir", str(logs / "fp-replicas")],
            logs / "fp-agent.log",
        )  # fmt: skip
        self.procs["proxy"] = start_service(
            ["-m", "services.proxy", "--nats", nats, "--port", "0", "--max-wait", "60"],
            logs / "fp-proxy.log",
        )  # fmt: skip
        self.procs["raw"] = start_service(["-c", RAW_RESPONDER, nats], logs / "fp-raw.log")
        self.url = await _wait_line(
            logs / "fp-proxy.log", LISTENING_RE, timeout_s, self.procs["proxy"]
        )
        app_file = logs / "http_ray_apps.yaml"
        app_file.write_text(
            APP_FILE.format(
                bench=driver.BENCH_APP, bench_prefix=driver.BENCH_PREFIX,
                bench_dep=driver.BENCH_DEPLOYMENT, zero=driver.ZERO_APP,
                zero_prefix=driver.ZERO_PREFIX, zero_dep=driver.ZERO_DEPLOYMENT,
                max_ongoing=driver.MAX_ONGOING,
            )
        )  # fmt: skip
        await asyncio.to_thread(_cli_deploy, app_file, nats)
        await _wait_served(self.url + self.bench_path, timeout_s - (time.monotonic() - t0))
        await self._connect(nats)
        self.start_s = time.monotonic() - t0

    async def _connect(self, nats_url: str) -> None:
        import nats as nats_py

        from services.router.config import RouterConfig
        from services.router.handle import connect_handle
        from shared.natsbus import NatsBus

        self.bus = await NatsBus.connect(nats_url, name="bench-http-ray")
        self.handle = await connect_handle(
            driver.BENCH_APP, driver.BENCH_DEPLOYMENT, bus=self.bus, config=RouterConfig()
        )
        self.nc = await nats_py.connect(nats_url)
        deadline = time.monotonic() + 30
        while True:
            try:
                await self.nc.request(RAW_SUBJECT, b"x", timeout=1)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)

    def roles(self) -> dict[str, list[int]]:
        kids = _children()
        out: dict[str, list[int]] = {"front door": [], "replica": [], "transport": [],
                                     "control": [], "other replicas": []}  # fmt: skip
        proxy = self.procs.get("proxy")
        if proxy is not None:
            out["front door"] = [proxy.pid, *descendants(proxy.pid, kids)]
        if self.server is not None and self.server.pid is not None:
            out["transport"] = [self.server.pid]
        for name in ("controller", "agent"):
            p = self.procs.get(name)
            if p is not None:
                out["control"].append(p.pid)
        agent = self.procs.get("agent")
        if agent is not None:
            for pid in descendants(agent.pid, kids):
                app = _argv_value(cmdline(pid), "--app")
                (out["replica"] if app == driver.BENCH_APP else out["other replicas"]).append(pid)
        return out

    def front_kind(self) -> str:
        """What serves the proxy's port: HAProxy when the proxy runs one, else the proxy."""
        proxy = self.procs.get("proxy")
        kids = descendants(proxy.pid) if proxy is not None else []
        if any(os.path.basename(cmdline(p)[0] if cmdline(p) else "") == "haproxy" for p in kids):
            return "HAProxy (run by the proxy), the Python proxy behind it"
        return "the Python proxy (every request over NATS)"

    def zero_replicas(self) -> int:
        agent = self.procs.get("agent")
        if agent is None:
            return 0
        return sum(
            _argv_value(cmdline(pid), "--app") == driver.ZERO_APP and _alive(pid)
            for pid in descendants(agent.pid)
        )

    async def handle_load(
        self, size: int, workers: int, duration_s: float, warmup: int
    ) -> tuple[LoadResult, float]:
        payload = os.urandom(size)
        echo = self.handle.options(method="echo")
        for _ in range(warmup):
            if await echo.remote(payload) != payload:
                raise RuntimeError("the fleetpulse handle echoed something else")
        cpu0 = time.process_time()
        res = await closed_loop([lambda: echo.remote(payload)] * workers, duration_s)
        return res, time.process_time() - cpu0

    async def raw_load(self, size: int, duration_s: float, warmup: int) -> LoadResult:
        payload = os.urandom(size)
        for _ in range(warmup):
            await self.nc.request(RAW_SUBJECT, payload, timeout=5)
        return await closed_loop(
            [lambda: self.nc.request(RAW_SUBJECT, payload, timeout=5)], duration_s
        )

    async def stop(self) -> None:
        for closer in (
            self.handle.close() if self.handle is not None else None,
            self.bus.close() if self.bus is not None else None,
            self.nc.close() if self.nc is not None else None,
        ):
            if closer is not None:
                with contextlib.suppress(Exception):  # stopping: the processes go next
                    await asyncio.wait_for(closer, 10)
        order = [self.procs[n] for n in ("proxy", "raw", "agent", "controller") if n in self.procs]
        await asyncio.to_thread(stop_services, order, 30.0)
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)


class RaySystem(System):
    """One Ray Serve mode, driven through its driver process's stdin/stdout."""

    def __init__(self, mode: str, log_dir: Path, loop: str = "uvloop") -> None:
        self.mode = mode
        self.name = f"ray-{mode}"
        self.log_dir = log_dir
        self.loop = loop
        self.proc: asyncio.subprocess.Process | None = None
        self.start_s = 0.0
        self.haproxy_dir: Path | None = None
        self._lock = asyncio.Lock()
        self._log: Any = None

    async def start(self, timeout_s: float) -> None:
        from shared.natsserver import free_ports

        names = (
            "http",
            "grpc",
            "haproxy_stats",
            "haproxy_metrics",
            "fallback_http",
            "fallback_grpc",
        )
        ports = dict(zip(names, free_ports(len(names)), strict=True))
        haproxy_dir = self.haproxy_dir = Path(tempfile.mkdtemp(prefix="fph-"))
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        env.update(driver.mode_env(self.mode, ports, haproxy_dir))
        self._log = open(self.log_dir / f"{self.name}-driver.log", "wb")  # noqa: SIM115, ASYNC230
        t0 = time.monotonic()
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "scripts.bench.http_ray_driver", self.mode,
            "--http-port", str(ports["http"]), "--grpc-port", str(ports["grpc"]),
            "--loop", self.loop,
            cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
            limit=64 * 1024 * 1024,
        )  # fmt: skip
        msg = await asyncio.wait_for(self._read(), timeout_s)
        if not msg.get("ready"):
            raise RuntimeError(f"{self.name} did not start: {msg.get('error')}")
        self.url = str(msg["url"])
        self.start_s = time.monotonic() - t0

    async def _read(self) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{self.name}: the driver exited (see {self.log_dir})")
            text = line.decode(errors="replace")
            if text.startswith(driver.MARK):
                return dict(json.loads(text[len(driver.MARK) :]))
            if self._log is not None:
                self._log.write(line)

    async def command(self, cmd: dict[str, Any], timeout_s: float = 300.0) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None
        async with self._lock:
            self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
            await self.proc.stdin.drain()
            msg = await asyncio.wait_for(self._read(), timeout_s)
        if not msg.get("ok"):
            raise RuntimeError(f"{self.name}: {cmd.get('cmd')} failed: {msg.get('error')}")
        return msg

    def roles(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {"front door": [], "replica": [], "transport": [],
                                     "control": [], "other replicas": [], "other": []}  # fmt: skip
        if self.proc is None:
            return out
        for pid in descendants(self.proc.pid):
            argv = cmdline(pid)
            head = argv[0] if argv else ""
            base = os.path.basename(head)
            if head.startswith("ray::ServeReplica:"):
                app = head.split(":")[3] if head.count(":") >= 3 else ""
                out["replica" if app == driver.BENCH_APP else "other replicas"].append(pid)
            elif head.startswith("ray::ProxyActor") or base == "haproxy":
                out["front door"].append(pid)
            elif base in ("raylet", "gcs_server"):
                out["transport"].append(pid)
            elif head.startswith("ray::ServeController") or head.startswith("ray::HAProxyMan"):
                out["control"].append(pid)
            else:
                out["other"].append(pid)
        return out

    def zero_replicas(self) -> int:
        return len(self.roles()["other replicas"])

    async def at_zero(self) -> bool:
        if self.zero_replicas():
            return False
        msg = await self.command({"cmd": "replicas", "app": driver.ZERO_APP}, 60)
        return int(msg["replicas"]) == 0

    async def handle_load(
        self, size: int, workers: int, duration_s: float, warmup: int
    ) -> tuple[LoadResult, float]:
        msg = await self.command(
            {"cmd": "handle", "size": size, "workers": workers, "duration_s": duration_s,
             "warmup": warmup},
            timeout_s=duration_s + 120,
        )  # fmt: skip
        res = LoadResult(
            latencies_s=list(msg["latencies_s"]), elapsed_s=float(msg["elapsed_s"]),
            errors=int(msg["errors"]), first_error=str(msg["first_error"]),
        )  # fmt: skip
        return res, float(msg["client_cpu_s"])

    async def stop(self) -> None:
        if self.proc is None:
            return
        left: list[int] = descendants(self.proc.pid)
        if self.proc.returncode is None:
            with contextlib.suppress(Exception):  # a dead driver: its processes go below
                await self.command({"cmd": "quit"}, 60)
            try:
                await asyncio.wait_for(self.proc.wait(), 60)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        # Ray's own shutdown stops its processes; what outlived it is stopped here, by pid, and
        # so is its HAProxy, which Ray detaches (parent 1): found by this run's config folder
        if self.haproxy_dir is not None:
            left += using_path(str(self.haproxy_dir))
        await asyncio.to_thread(stop_pids, [p for p in left if _alive(p)], 10.0)
        if self.haproxy_dir is not None:
            shutil.rmtree(self.haproxy_dir, ignore_errors=True)
        if self._log is not None:
            self._log.close()


# -- helpers -------------------------------------------------------------------------------------


async def _wait_line(
    path: Path, pattern: re.Pattern[str], within_s: float, proc: subprocess.Popen[bytes]
) -> str:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""  # noqa: ASYNC240 (tiny)
        if m := pattern.search(text):
            return m.group(1)
        if proc.poll() is not None:
            raise RuntimeError(f"{path.stem} exited with {proc.returncode} (see {path})")
        await asyncio.sleep(0.05)
    raise TimeoutError(f"no {pattern.pattern!r} in {path} within {within_s:.0f} s")


async def _wait_served(
    url: str, within_s: float, *, echo: bool = True, procs: Iterable[subprocess.Popen[bytes]] = ()
) -> None:
    """Until a POST to `url` is answered 200, echoed when `echo` (the app deployed, its replica
    up, routes known); RuntimeError as soon as one of `procs` exits."""
    from scripts.bench.httpclient import Connection, Endpoint, build_request

    ep = Endpoint.parse(url)
    raw = build_request("POST", ep, body=b"ping")
    deadline = time.monotonic() + within_s
    last = ""
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"a process serving {url} exited (last: {last})")
        conn = Connection(ep)
        try:
            r = await asyncio.wait_for(conn.request(raw), 10)
            if r.status == 200 and (not echo or bytes(r.body) == b"ping"):
                return
            last = f"status {r.status}"
        except Exception as e:
            last = f"{type(e).__name__}: {e}"
        finally:
            conn.close()
        await asyncio.sleep(0.2)
    raise TimeoutError(f"{url} never answered within {within_s:.0f} s (last: {last})")


def _cli_deploy(path: Path, nats_url: str) -> None:
    from scripts.bench.common import cli_deploy

    cli_deploy(path, nats_url)

"""The Ray Serve side of scripts/bench/http_ray.py: one Ray instance in one mode, in its own process.

    python -m scripts.bench.http_ray_driver fastest|default --http-port P [--haproxy-dir D] ...

Not a benchmark of its own (no `main`, so the smoke runner does not list it): http_ray.py starts
it for both Ray modes, and `python -m scripts.bench.http_ray --smoke`, which CI runs, exercises it.

Why a process per mode: Ray Serve reads its mode flags (RAY_SERVE_THROUGHPUT_OPTIMIZED,
RAY_SERVE_ENABLE_HA_PROXY) from the environment when it is imported, in the driver and in every
worker, and a driver holds one Ray instance; so each mode is a driver process with its own
environment and its own local Ray instance (`ray.init(address="local")`, loopback, no dashboard,
no usage stats), and the two modes run side by side.

How it works: the driver starts Ray and Serve on the ports it is given, runs two apps of
scripts/bench/http_ray_app.py's `BenchEcho` (`bench` at /bench: one replica,
max_ongoing_requests 100; `zero` at /zero: autoscaling with min_replicas 0), then prints one line
`@@bench {"ready": ...}` and answers commands, one JSON object a line on stdin, each with one
`@@bench {...}` line on stdout (Ray may print other lines; the benchmark skips them):

- {"cmd": "handle", "size": B, "workers": W, "duration_s": S, "warmup": N}: the handle path,
  `serve.get_app_handle("bench")`'s `echo.remote(payload)` from this driver, W callers for S
  seconds (after N checked warm-up calls); answers the latencies (the same closed loop as the
  HTTP client, scripts/bench/httpclient.py).
- {"cmd": "replicas", "app": A}: how many replicas A has that are not stopped (STARTING, RUNNING,
  UPDATING, ...), so the benchmark knows when `zero` is at zero.
- {"cmd": "quit"}: Serve and Ray shut down, the process exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

MARK = "@@bench "
BENCH_APP, BENCH_DEPLOYMENT, BENCH_PREFIX = "bench", "Echo", "/bench"
ZERO_APP, ZERO_DEPLOYMENT, ZERO_PREFIX = "zero", "Zero", "/zero"
MAX_ONGOING = 100
ZERO_AUTOSCALING = {
    "min_replicas": 0,
    "max_replicas": 1,
    "target_ongoing_requests": 2,
    "upscale_delay_s": 0,
    "downscale_delay_s": 1,
    "downscale_to_zero_delay_s": 1,
    "look_back_period_s": 1,
    "metrics_interval_s": 0.5,
}
"""The same scale-to-zero timing the fleetpulse side's `zero` app gets."""
FASTEST_FLAGS = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_HA_PROXY": "1"}


def mode_env(mode: str, ports: dict[str, int], haproxy_dir: Path) -> dict[str, str]:
    """The environment a driver of `mode` runs with (its Ray workers inherit it). Ray's fixed
    HAProxy paths and ports (/tmp/haproxy-serve, 8404, 9101, the fallback proxy's 8500/9500)
    move to this run's own, so it cannot collide with another Ray or HAProxy on the machine."""
    env = {
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "0",
        "RAY_SERVE_ENABLE_HA_PROXY": "0",
    }
    if mode == "fastest":
        env.update(FASTEST_FLAGS)
        env.update(
            {
                "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(haproxy_dir / "haproxy.cfg"),
                "RAY_SERVE_HAPROXY_SOCKET_PATH": str(haproxy_dir / "admin.sock"),
                "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(haproxy_dir),
                "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(haproxy_dir / "server-state"),
                "RAY_SERVE_HAPROXY_STATS_PORT": str(ports["haproxy_stats"]),
                "RAY_SERVE_HAPROXY_METRICS_PORT": str(ports["haproxy_metrics"]),
                "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(ports["fallback_http"]),
                "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT": str(ports["fallback_grpc"]),
            }
        )
    elif mode != "default":
        raise ValueError(f"unknown Ray mode {mode!r}")
    return env


def say(obj: dict[str, Any]) -> None:
    sys.stdout.write(MARK + json.dumps(obj) + "\n")
    sys.stdout.flush()


def start_serve(http_port: int, grpc_port: int, num_cpus: int) -> Any:
    import ray
    from ray import serve

    from scripts.bench.http_ray_app import BenchEcho

    ray.init(
        address="local",
        num_cpus=num_cpus,  # logical slots; the replicas take Ray's default of 1 each
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
    )
    serve.start(
        http_options={"host": "127.0.0.1", "port": http_port},
        grpc_options={"port": grpc_port},
    )
    bench: Any = serve.deployment(
        BenchEcho, name=BENCH_DEPLOYMENT, num_replicas=1, max_ongoing_requests=MAX_ONGOING
    )
    zero: Any = serve.deployment(
        BenchEcho,
        name=ZERO_DEPLOYMENT,
        max_ongoing_requests=MAX_ONGOING,
        autoscaling_config=ZERO_AUTOSCALING,
    )
    serve.run(bench.bind(), name=BENCH_APP, route_prefix=BENCH_PREFIX)
    serve.run(zero.bind(), name=ZERO_APP, route_prefix=ZERO_PREFIX, blocking=False)
    return serve.get_app_handle(BENCH_APP)


def replicas(app: str) -> int:
    """Replicas of `app` not stopped yet (-1: the app is not there)."""
    from ray import serve

    st = serve.status().applications.get(app)
    if st is None:
        return -1
    n = 0
    for dep in st.deployments.values():
        for state, count in dep.replica_states.items():
            if str(state).split(".")[-1] not in ("STOPPING", "STOPPED"):
                n += count
    return n


async def handle_load(handle: Any, cmd: dict[str, Any]) -> dict[str, Any]:
    from scripts.bench.httpclient import closed_loop

    payload = os.urandom(int(cmd["size"]))
    echo = handle.options(method_name="echo")
    for _ in range(int(cmd.get("warmup", 0))):
        got = await echo.remote(payload)
        if got != payload:
            raise RuntimeError("the handle echoed something else")
    cpu0 = time.process_time()
    res = await closed_loop(
        [lambda: echo.remote(payload)] * int(cmd["workers"]), float(cmd["duration_s"])
    )
    return {
        "latencies_s": res.latencies_s,
        "elapsed_s": res.elapsed_s,
        "errors": res.errors,
        "first_error": res.first_error,
        "client_cpu_s": time.process_time() - cpu0,
    }


def _stdin_lines(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[str | None]) -> None:
    for line in sys.stdin:
        loop.call_soon_threadsafe(queue.put_nowait, line)
    loop.call_soon_threadsafe(queue.put_nowait, None)


async def serve_commands(handle: Any) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[str | None] = asyncio.Queue()
    threading.Thread(target=_stdin_lines, args=(loop, queue), daemon=True).start()
    while (line := await queue.get()) is not None:
        if not line.strip():
            continue
        try:
            cmd = json.loads(line)
            what = cmd.get("cmd")
            if what == "quit":
                say({"ok": True})
                return
            if what == "handle":
                say({"ok": True, **await handle_load(handle, cmd)})
            elif what == "replicas":
                say({"ok": True, "replicas": await asyncio.to_thread(replicas, cmd["app"])})
            else:
                say({"ok": False, "error": f"unknown command {what!r}"})
        except Exception as e:  # answer and go on: the benchmark decides what a failure means
            say({"ok": False, "error": f"{type(e).__name__}: {e}"[:500]})


def run_driver(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.bench.http_ray_driver")
    ap.add_argument("mode", choices=("fastest", "default"))
    ap.add_argument("--http-port", type=int, required=True)
    ap.add_argument("--grpc-port", type=int, required=True)
    ap.add_argument("--num-cpus", type=int, default=4)
    ap.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    args = ap.parse_args(argv)
    for key, want in (
        ("RAY_SERVE_THROUGHPUT_OPTIMIZED", "1" if args.mode == "fastest" else "0"),
        ("RAY_SERVE_ENABLE_HA_PROXY", "1" if args.mode == "fastest" else "0"),
    ):
        if os.environ.get(key, "0") != want:  # the flags must be set before Ray is imported
            print(f"{key} must be {want} in mode {args.mode} (see mode_env)", file=sys.stderr)
            return 2
    t0 = time.monotonic()
    try:
        handle = start_serve(args.http_port, args.grpc_port, args.num_cpus)
        say(
            {
                "ready": True,
                "url": f"http://127.0.0.1:{args.http_port}",
                "start_s": time.monotonic() - t0,
                "pid": os.getpid(),
            }
        )
        if args.loop == "uvloop":
            import uvloop

            uvloop.run(serve_commands(handle))
        else:
            asyncio.run(serve_commands(handle))
    except Exception as e:
        say({"ready": False, "error": f"{type(e).__name__}: {e}"[:1000]})
        raise
    finally:
        _shutdown()
    return 0


def _shutdown() -> None:
    try:
        import ray
        from ray import serve

        if ray.is_initialized():
            try:
                serve.shutdown()  # type: ignore[no-untyped-call]
            finally:
                ray.shutdown()
    except Exception as e:  # still exit: the benchmark stops what is left by pid
        print(f"ray shutdown: {type(e).__name__}: {e}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(run_driver())

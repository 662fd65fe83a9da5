"""Step response of the autoscaler with real replica processes: a step, a ramp, a fall to zero.

    .venv/bin/python -m scripts.bench.step_response [--runs 3] [--ray] [--smoke]

One embedded nats-server, `fleetpulse controller` and `fleetpulse agent` as processes, the app
deployed with `fleetpulse deploy`, callers in this process through a DeploymentHandle (each
caller loops on `predict`, so N callers hold N requests in flight). The config is the issue's:
look_back_period_s 5, metrics_interval_s 1 (replicas and this handle's router), target 2,
upscale_delay_s 2, max 8; downscale and to-zero delays 5 s. The deployment's status (fp_status)
is polled every 50 ms for the target and the running count.

- step: 1 replica idle for 6 s, then 8 callers at once for 20 s. Time to a target of 4 and to 4
  running, the highest target (overshoot: above 4), and replica-seconds over the 20 s.
- ramp: back at 1 replica and idle, one caller more every 1.25 s up to 8, held 15 s. The highest
  target, and whether the target ever went down before the callers stopped (scale back).
- fall: a min_replicas 0 deployment held at 8 callers until 4 run, then all stop. Time to 1 and
  to 0 replicas, any increase on the way down, replica-seconds after the fall.

With `--ray` the same step runs on Ray Serve 2.60 (in-process cluster on loopback, same
autoscaling config, a `serve.run` deployment with the same latency) as the baseline; needs
`pip install -e '.[ray]'`. Output: tables, bench-results/step_response.json and RESULT lines.
The run exits 1 when a step never reaches a target of 4 or 4 running, or the fall never reaches 0.

`--smoke`: the same stack and code path, shrunk to one step (2 s idle, 10 s held) and the fall
(held 2 s at 4 running); no ramp. Its JSON goes to $FLEETPULSE_BENCH_OUT (else a temporary
directory), never over bench-results/.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scripts.bench.common import (
    OUT_ENV,
    add_smoke,
    cli_deploy,
    print_table,
    result_line,
    shown,
    start_service,
    stop_services,
    write_json,
)
from services.router.config import RouterConfig
from services.router.handle import DeploymentHandle, connect_handle
from shared.kv.status import AppStatusView
from shared.natsbus import NatsBus
from shared.natsserver import NatsServer
from shared.subjects import KV_STATUS

LATENCY_S = 0.2
CALLERS = 8
NEED = 4  # 8 callers / target 2
POLL_S = 0.05


@dataclass(frozen=True, slots=True)
class Sizes:
    """How long each phase lasts: the full run's, or the smoke run's."""

    runs: int = 3
    idle_s: float = 6.0  # idle before each step: more than the look-back window
    hold_s: float = 20.0  # the step's callers run this long
    ramp: bool = True
    fall_hold_s: float = 8.0  # at 4 running before the callers stop


SMOKE = Sizes(runs=1, idle_s=2.0, hold_s=10.0, ramp=False, fall_hold_s=2.0)

APP_YAML = """
applications:
  - name: {app}
    route_prefix: /{app}
    deployments:
      - name: Model
        import_path: services.examples.model:Model
        init_kwargs: {{base_latency_s: {latency}, contention: 0.0}}
        max_ongoing_requests: 4
        health_check_period_s: 1
        graceful_shutdown_timeout_s: 2
        autoscaling_config:
          min_replicas: {min}
          max_replicas: 8
          target_ongoing_requests: 2
          upscale_delay_s: 2
          downscale_delay_s: 5
          downscale_to_zero_delay_s: 5
          look_back_period_s: 5
          metrics_interval_s: 1
"""


@dataclass
class Timeline:
    """(seconds since the scenario's t0, target, running) every poll."""

    points: list[tuple[float, int, int]] = field(default_factory=list)

    def first(self, cond: Callable[[int, int], bool]) -> float | None:
        return next((t for t, tg, r in self.points if t >= 0 and cond(tg, r)), None)

    def replica_seconds(self, start: float, end: float) -> float:
        pts = [p for p in self.points if start <= p[0] <= end]
        return sum((b[0] - a[0]) * a[2] for a, b in itertools.pairwise(pts))

    def targets(self, start: float, end: float) -> list[int]:
        return [tg for t, tg, _ in self.points if start <= t <= end]


class Stack:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.server = NatsServer()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.bus: NatsBus | None = None

    def _start(self, args: list[str], log: str) -> None:
        self.procs.append(start_service(["-m", "services.cli", *args], self.log_dir / log))

    async def start(self) -> None:
        self.server.start()
        url = self.server.url
        self._start(["controller", "--nats", url], "controller.log")
        self._start(
            ["agent", "--nats", url, "--agent-id", "a1", "--max-replicas", "12",
             "--log-dir", str(self.log_dir / "replicas")],
            "agent.log",
        )  # fmt: skip
        self.bus = await NatsBus.connect(url, name="bench-step", reconnect_wait=0.1)

    def deploy(self, app: str, min_replicas: int) -> None:
        path = self.log_dir / f"{app}.yaml"
        path.write_text(APP_YAML.format(app=app, min=min_replicas, latency=LATENCY_S))
        cli_deploy(path, self.server.url)

    async def model(self, app: str) -> tuple[int, int]:
        assert self.bus is not None
        entry = await (await self.bus.kv(KV_STATUS)).get(app)
        if not entry:
            return -1, -1
        d = AppStatusView.decode(entry.value).deployments.get("Model")
        return (d.target_replicas, d.running_replicas) if d else (-1, -1)

    async def stop(self) -> None:
        if self.bus is not None:
            await self.bus.close()
        stop_services(self.procs)
        self.server.stop()


async def until(cond: Callable[[], Awaitable[bool]], within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if await cond():
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"not {what} within {within_s} s")


class Callers:
    """Closed-loop callers: each keeps one request in flight until stopped."""

    def __init__(self, call: Callable[[], Awaitable[Any]]) -> None:
        self.call = call
        self.tasks: list[asyncio.Task[None]] = []
        self.ok = self.failed = 0

    def add(self, n: int = 1) -> None:
        for _ in range(n):
            self.tasks.append(asyncio.create_task(self._loop()))

    async def _loop(self) -> None:
        while True:
            try:
                await self.call()
                self.ok += 1
            except asyncio.CancelledError:
                raise
            except Exception:
                self.failed += 1
                await asyncio.sleep(0.05)

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks = []


async def record(
    poll: Callable[[], Awaitable[tuple[int, int]]], t0_ref: list[float], stop: asyncio.Event
) -> Timeline:
    tl = Timeline()
    while not stop.is_set():
        target, running = await poll()
        tl.points.append((time.monotonic() - t0_ref[0], target, running))
        await asyncio.sleep(POLL_S)
    return tl


async def scenario(
    poll: Callable[[], Awaitable[tuple[int, int]]],
    drive: Callable[[list[float]], Awaitable[None]],
) -> Timeline:
    t0 = [time.monotonic()]
    stop = asyncio.Event()
    rec = asyncio.create_task(record(poll, t0, stop))
    try:
        await drive(t0)
    finally:
        stop.set()
    return await rec


def step_metrics(tl: Timeline, hold_s: float) -> dict[str, Any]:
    return {
        "to_target_s": tl.first(lambda tg, r: tg >= NEED),
        "to_running_s": tl.first(lambda tg, r: r >= NEED),
        "max_target": max(tl.targets(0, hold_s)),
        "changes": _changes(tl.targets(0, hold_s)),
        "replica_s": tl.replica_seconds(0, hold_s),
    }


def _changes(targets: list[int]) -> list[int]:
    out: list[int] = []
    for x in targets:
        if not out or out[-1] != x:
            out.append(x)
    return out


async def fleetpulse_runs(sizes: Sizes, log_dir: Path) -> dict[str, Any]:
    stack = Stack(log_dir)
    await stack.start()
    handles: list[DeploymentHandle] = []
    try:
        stack.deploy("step", 1)
        stack.deploy("zero", 0)
        assert stack.bus is not None
        router = RouterConfig(metrics_interval_s=1.0)
        step_h = await connect_handle("step", "Model", bus=stack.bus, config=router)
        zero_h = await connect_handle("zero", "Model", bus=stack.bus, config=router)
        handles += [step_h, zero_h]

        async def poll_step() -> tuple[int, int]:
            return await stack.model("step")

        async def poll_zero() -> tuple[int, int]:
            return await stack.model("zero")

        async def at_one() -> bool:
            return await poll_step() == (1, 1)

        predict = step_h.options(method="predict", deadline_s=60)
        results: dict[str, Any] = {"step": [], "ramp": [], "fall": []}
        for i in range(sizes.runs):
            await until(at_one, 120, "back at 1 replica")
            await asyncio.sleep(sizes.idle_s)
            callers = Callers(lambda: predict.remote(1.0))

            async def drive_step(t0: list[float], callers: Callers = callers) -> None:
                t0[0] = time.monotonic()
                callers.add(CALLERS)
                await asyncio.sleep(sizes.hold_s)
                await callers.stop()

            tl = await scenario(poll_step, drive_step)
            m = step_metrics(tl, sizes.hold_s)
            m["failed"] = callers.failed
            results["step"].append(m)
            print(f"fleetpulse step {i + 1}/{sizes.runs}: {m}", flush=True)

        if sizes.ramp:
            await until(at_one, 120, "back at 1 replica")
            await asyncio.sleep(sizes.idle_s)
            callers = Callers(lambda: predict.remote(1.0))

            async def drive_ramp(t0: list[float]) -> None:
                t0[0] = time.monotonic()
                for _ in range(CALLERS):
                    callers.add(1)
                    await asyncio.sleep(1.25)
                await asyncio.sleep(15.0)
                await callers.stop()

            tl = await scenario(poll_step, drive_ramp)
            ramp_targets = tl.targets(0, 25.0)
            peak = max(ramp_targets)
            results["ramp"].append(
                {
                    "max_target": peak,
                    "scaled_back": ramp_targets[-1] < peak,
                    "changes": _changes(ramp_targets),
                    "to_target_s": tl.first(lambda tg, r: tg >= NEED),
                    "replica_s": tl.replica_seconds(0, 25.0),
                    "failed": callers.failed,
                }
            )
            print(f"fleetpulse ramp: {results['ramp'][-1]}", flush=True)

        zpredict = zero_h.options(method="predict", deadline_s=60)
        callers = Callers(lambda: zpredict.remote(1.0))

        async def four_running() -> bool:
            return (await poll_zero())[1] >= NEED

        callers.add(CALLERS)
        await until(four_running, 60, "4 replicas running")
        await asyncio.sleep(sizes.fall_hold_s)

        async def drive_fall(t0: list[float]) -> None:
            t0[0] = time.monotonic()
            await callers.stop()

            async def at_zero() -> bool:
                return await poll_zero() == (0, 0)

            await until(at_zero, 90, "at zero")
            await asyncio.sleep(1.0)

        tl = await scenario(poll_zero, drive_fall)
        fall_targets = [tg for t, tg, _ in tl.points if t >= 0]
        results["fall"].append(
            {
                "to_one_s": tl.first(lambda tg, r: tg <= 1),
                "to_zero_s": tl.first(lambda tg, r: tg == 0 and r == 0),
                "went_up": any(b > a for a, b in itertools.pairwise(fall_targets)),
                "changes": _changes(fall_targets),
                "replica_s": tl.replica_seconds(0, tl.points[-1][0]),
            }
        )
        print(f"fleetpulse fall: {results['fall'][-1]}", flush=True)
        return results
    finally:
        for h in handles:
            await h.close()
        await stack.stop()


def median(values: list[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return statistics.median(xs) if xs else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="step repetitions")
    ap.add_argument("--ray", action="store_true", help="also run the step on Ray Serve")
    add_smoke(ap, "1 step of 10 s and the fall, no ramp")
    args = ap.parse_args(argv)
    sizes = SMOKE if args.smoke else Sizes(runs=args.runs)
    if args.smoke and not os.environ.get(OUT_ENV):
        os.environ[OUT_ENV] = tempfile.mkdtemp(prefix="fleetpulse-smoke-")
    with tempfile.TemporaryDirectory(prefix="fp-step-") as tmp:
        fp = asyncio.run(fleetpulse_runs(sizes, Path(tmp)))
    ray: dict[str, Any] | None = None
    if args.ray:
        from scripts.bench.step_response_ray import ray_step_runs

        ray = ray_step_runs(
            sizes.runs, hold_s=sizes.hold_s, latency_s=LATENCY_S, callers=CALLERS,
            idle_s=sizes.idle_s,
        )  # fmt: skip

    rows = []
    for name, res in (("fleetpulse", fp["step"]), ("ray serve", (ray or {}).get("step", []))):
        if not res:
            continue
        rows.append(
            [
                name,
                len(res),
                _range([m["to_target_s"] for m in res]),
                _range([m["to_running_s"] for m in res]),
                max(m["max_target"] for m in res),
                _range([m["replica_s"] for m in res]),
                " ".join("->".join(map(str, m["changes"])) for m in res),
            ]
        )
    hold = f"{sizes.hold_s:g} s"
    print_table(
        "step 0 -> 8 callers (target 2, look-back 5 s, interval 1 s, upscale delay 2 s)",
        ["system", "runs", "to target 4 s", "to 4 running s", "max target", f"replica-s/{hold}",
         "targets"],
        rows,
    )  # fmt: skip
    f = fp["fall"][0]
    fall_row = ["fall", "", f["went_up"], "->".join(map(str, f["changes"])), f["to_one_s"],
                f["to_zero_s"], round(f["replica_s"], 1)]  # fmt: skip
    ramp_rows, ramp_fields = [], {}
    if fp["ramp"]:
        r = fp["ramp"][0]
        ramp_rows = [
            ["ramp", r["max_target"], r["scaled_back"], "->".join(map(str, r["changes"])),
             "", "", round(r["replica_s"], 1)],
        ]  # fmt: skip
        ramp_fields = {
            "ramp_max_target": r["max_target"],
            "ramp_scaled_back": int(r["scaled_back"]),
        }
    print_table(
        "ramp 0 -> 8 callers over 10 s, held 15 s; fall 8 -> 0 callers (min 0)",
        ["scenario", "max target", "scaled back / went up", "targets", "to 1 s", "to 0 s",
         "replica-s"],
        [*ramp_rows, fall_row],
    )  # fmt: skip
    path = write_json(
        "step_response",
        {"fleetpulse": fp, "ray": ray, "runs": sizes.runs, "smoke": args.smoke,
         "sizes": asdict(sizes)},
    )  # fmt: skip
    print(f"\nwrote {shown(path)}")
    step = fp["step"]
    result_line(
        "step_response",
        to_target_s_median=median([m["to_target_s"] for m in step]) or -1.0,
        to_running_s_median=median([m["to_running_s"] for m in step]) or -1.0,
        max_target=max(m["max_target"] for m in step),
        **ramp_fields,
        fall_to_zero_s=f["to_zero_s"] or -1.0,
        fall_went_up=int(f["went_up"]),
    )
    if ray and ray.get("step"):
        ray_result_line(ray["step"])
    problems = step_problems("fleetpulse", step) + step_problems(
        "ray serve", (ray or {}).get("step", [])
    )
    if f["to_zero_s"] is None:
        problems.append("fleetpulse: the fall never reached 0 replicas")
    for p in problems:
        print(f"FAILED: {p}", file=sys.stderr)
    return 1 if problems else 0


def step_problems(system: str, steps: list[dict[str, Any]]) -> list[str]:
    """A step that never reached the target or never ran 4 replicas is a failure, not a number."""
    out = []
    for i, m in enumerate(steps, 1):
        if m["to_target_s"] is None:
            out.append(f"{system} step {i}: never reached a target of {NEED}")
        if m["to_running_s"] is None:
            out.append(f"{system} step {i}: never ran {NEED} replicas")
    return out


def ray_result_line(steps: list[dict[str, Any]]) -> None:
    result_line(
        "step_response_ray",
        to_target_s_median=median([m["to_target_s"] for m in steps]) or -1.0,
        to_running_s_median=median([m["to_running_s"] for m in steps]) or -1.0,
        max_target=max(m["max_target"] for m in steps),
    )


def _range(values: list[float | None]) -> str:
    xs = [v for v in values if v is not None]
    if not xs:
        return "never"
    lo, hi = min(xs), max(xs)
    missing = len(values) - len(xs)
    text = f"{lo:.2f}" if abs(hi - lo) < 0.005 else f"{lo:.2f}-{hi:.2f}"
    return text + (f" ({missing} never)" if missing else "")


if __name__ == "__main__":
    sys.exit(main())

"""Rolling updates with real replica processes under steady load: does any request get lost?

How it works: one embedded nats-server, `fleetpulse controller`, `fleetpulse agent` and the HTTP
proxy as processes; an echo app of N replicas (each request holds 50 ms, so requests are in
flight on the replicas that drain) deployed with `fleetpulse deploy`. Once it runs, callers in
this process send requests back to back, half through a DeploymentHandle (the router) and half
through the proxy over HTTP, while the app is redeployed with a new version and the given
rollout settings; the load goes on until the rollout is complete (every target on the new
version, the status HEALTHY at N running) and a little after. Every request is counted: sent,
succeeded, failed (with the error). With several `--surge` values the same stack rolls once per
value, one after the other (a baseline in the same run).

    .venv/bin/python -m scripts.bench.rollout_live [--replicas 8] [--surge 1,50%] [--callers 4]

`--smoke`: 2 replicas, one rollout (max_surge 1), 2 callers per path; the same processes
(scripts/bench/smoke.py runs it).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from services.router.handle import DeploymentHandle, connect_handle
from shared.bus import Bus
from shared.kv.status import AppStatusView
from shared.kv.targets import ReplicaTarget, app_pattern
from shared.kv.view import DocKV
from shared.natsbus import NatsBus
from shared.natsserver import NatsServer
from shared.subjects import KV_STATUS, KV_TARGETS

from .common import add_smoke, cli_deploy, result_line, start_service, stop_services, write_json

APP, DEPLOYMENT = "roll", "Echo"
SMOKE: dict[str, Any] = {"replicas": 2, "surge": "1", "max_unavailable": "0", "callers": 2}
LISTENING_RE = re.compile(r"proxy: listening on (http://\S+)")
APP_YAML = """
applications:
  - name: roll
    route_prefix: /roll
    version: "{version}"
    deployments:
      - name: Echo
        import_path: services.examples.echo:Echo
        init_kwargs: {{delay_s: {delay_s}}}
        max_ongoing_requests: 20
        num_replicas: {replicas}
        health_check_period_s: 0.5
        health_check_timeout_s: 2
        graceful_shutdown_timeout_s: 10
        rollout: {{max_surge: {surge}, max_unavailable: {unavailable}}}
"""


@dataclass
class Tally:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    errors: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "ok": self.ok,
            "failed": self.failed,
            "errors": dict(self.errors),
        }


class Stack:
    """nats-server, controller, agent and proxy as processes, stopped by `stop()` whatever
    happened."""

    def __init__(self, tmp: Path, capacity: int) -> None:
        self.tmp, self.capacity = tmp, capacity
        self.server = NatsServer()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.proxy_url = ""

    def _start(self, args: Sequence[str], log: str) -> None:
        self.procs.append(start_service(args, self.tmp / log))

    def start(self) -> None:
        self.server.start()
        url = self.server.url
        self._start(
            ["-m", "services.cli", "controller", "--nats", url, "--rebuild-s", "2"],
            "controller.log",
        )
        self._start(
            [
                "-m",
                "services.cli",
                "agent",
                "--nats",
                url,
                "--agent-id",
                "a1",
                "--max-replicas",
                str(self.capacity),
                "--log-dir",
                str(self.tmp / "replicas"),
            ],
            "agent.log",
        )
        self._start(
            ["-m", "services.proxy", "--nats", url, "--port", "0", "--metrics-interval", "0.5"],
            "proxy.log",
        )
        deadline = time.monotonic() + 30
        while not self.proxy_url:
            m = LISTENING_RE.search((self.tmp / "proxy.log").read_text(errors="replace"))
            if m:
                self.proxy_url = m.group(1)
            elif time.monotonic() > deadline:
                raise RuntimeError("the proxy did not start listening in 30 s")
            else:
                time.sleep(0.05)

    def deploy(
        self, version: str, replicas: int, surge: str, unavailable: str, delay_s: float
    ) -> None:
        path = self.tmp / f"{version}.yaml"
        path.write_text(
            APP_YAML.format(
                version=version,
                replicas=replicas,
                surge=surge,
                unavailable=unavailable,
                delay_s=delay_s,
            )
        )
        cli_deploy(path, self.server.url)

    def stop(self) -> None:
        stop_services(self.procs)
        self.server.stop()


async def state(bus: Bus) -> tuple[str, int, set[str], int]:
    """(status, running replicas, versions in fp_targets, replica targets) of the deployment."""
    entry = await (await bus.kv(KV_STATUS)).get(APP)
    status, running = "", -1
    if entry is not None:
        d = AppStatusView.decode(entry.value).deployments.get(DEPLOYMENT)
        if d is not None:
            status, running = d.status, d.running_replicas
    docs = DocKV(await bus.kv(KV_TARGETS), ReplicaTarget)
    targets = [c.doc for c in await docs.snapshot(app_pattern(APP)) if c.doc]
    return status, running, {t.version for t in targets}, len(targets)


async def wait_for(
    bus: Bus, version: str, replicas: int, within_s: float, peak: list[int] | None = None
) -> float:
    """Seconds until the deployment is HEALTHY at `replicas` running, all of `version`;
    `peak[0]` becomes the most replica targets seen at once meanwhile (old and new: the surge)."""
    t0 = time.monotonic()
    while True:
        status, running, versions, targets = await state(bus)
        if peak is not None:
            peak[0] = max(peak[0], targets)
        if status == "HEALTHY" and running == replicas and versions == {version}:
            return time.monotonic() - t0
        if time.monotonic() - t0 > within_s:
            raise RuntimeError(
                f"not settled on {version} in {within_s:g} s: {status} "
                f"{running} running, versions {sorted(versions)}"
            )
        await asyncio.sleep(0.05)


async def handle_caller(handle: DeploymentHandle, tally: Tally, stop: asyncio.Event) -> None:
    echo = handle.options(method="echo", deadline_s=30)
    i = 0
    while not stop.is_set():
        i += 1
        tally.sent += 1
        try:
            got = await echo.remote(i)
            if got != i:
                raise ValueError(f"echoed {got!r} for {i}")
            tally.ok += 1
        except Exception as exc:  # every failure is counted by kind, the load goes on
            tally.failed += 1
            tally.errors[f"{type(exc).__name__}: {str(exc)[:80]}"] += 1


async def http_caller(http: aiohttp.ClientSession, tally: Tally, stop: asyncio.Event) -> None:
    i = 0
    while not stop.is_set():
        i += 1
        body = f"r{i}".encode()
        tally.sent += 1
        try:
            async with http.post(f"/roll/{i}", data=body) as resp:
                got = await resp.read()
                if resp.status != 200 or got != body:
                    raise ValueError(f"HTTP {resp.status}: {got[:80]!r}")
            tally.ok += 1
        except Exception as exc:
            tally.failed += 1
            tally.errors[f"{type(exc).__name__}: {str(exc)[:80]}"] += 1


@dataclass
class Rollout:
    surge: str
    unavailable: str
    version: str
    seconds: float = 0.0
    peak_targets: int = 0
    """The most replica targets seen at once during the rollout (replicas + the surge used)."""
    handle: Tally = field(default_factory=Tally)
    http: Tally = field(default_factory=Tally)

    def as_dict(self) -> dict[str, Any]:
        return {
            "max_surge": self.surge,
            "max_unavailable": self.unavailable,
            "rollout_s": round(self.seconds, 2),
            "peak_targets": self.peak_targets,
            "handle": self.handle.as_dict(),
            "http": self.http.as_dict(),
        }


async def roll_under_load(
    stack: Stack,
    bus: Bus,
    roll: Rollout,
    replicas: int,
    callers: int,
    delay_s: float,
    settle_s: float = 120.0,
    before_s: float = 1.0,
    after_s: float = 2.0,
) -> Rollout:
    """Load through a handle and the proxy; redeploy as `roll.version`; wait for the rollout to
    complete; keep the load on `after_s` longer, then count."""
    handle = await connect_handle(APP, DEPLOYMENT, bus=bus)
    stop = asyncio.Event()
    timeout = aiohttp.ClientTimeout(total=30)
    try:
        async with aiohttp.ClientSession(stack.proxy_url, timeout=timeout) as http:
            tasks = [
                asyncio.ensure_future(handle_caller(handle, roll.handle, stop))
                for _ in range(callers)
            ]
            tasks += [
                asyncio.ensure_future(http_caller(http, roll.http, stop)) for _ in range(callers)
            ]
            try:
                await asyncio.sleep(before_s)
                await asyncio.to_thread(
                    stack.deploy, roll.version, replicas, roll.surge, roll.unavailable, delay_s
                )
                peak = [0]
                roll.seconds = await wait_for(bus, roll.version, replicas, settle_s, peak)
                roll.peak_targets = peak[0]
                await asyncio.sleep(after_s)
            finally:
                stop.set()
                await asyncio.gather(*tasks)
    finally:
        await handle.close()
    return roll


async def run(
    replicas: int,
    surges: Sequence[str],
    unavailable: Sequence[str],
    callers: int,
    delay_s: float,
    tmp: Path,
) -> list[Rollout]:
    capacity = replicas + max(_count(s, replicas) for s in surges) + 2
    stack = Stack(tmp, capacity)
    try:
        stack.start()
        stack.deploy("v1", replicas, surges[0], unavailable[0], delay_s)
        bus = await NatsBus.connect(stack.server.url, name="rollout-live")
        try:
            await wait_for(bus, "v1", replicas, 120)
            out = []
            for n, (surge, unav) in enumerate(zip(surges, unavailable, strict=True), start=2):
                roll = Rollout(surge, unav, f"v{n}")
                out.append(await roll_under_load(stack, bus, roll, replicas, callers, delay_s))
            return out
        finally:
            await bus.close()
    finally:
        stack.stop()


def _count(amount: str, replicas: int) -> int:
    return -(-replicas * int(amount[:-1]) // 100) if amount.endswith("%") else int(amount)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--surge", default="1,50%", help="max_surge of each rollout, comma list")
    ap.add_argument("--max-unavailable", default="0", help="one value, or one per --surge")
    ap.add_argument("--callers", type=int, default=4, help="concurrent callers per path")
    ap.add_argument("--delay-s", type=float, default=0.05, help="each request's hold")
    ap.add_argument("--json", default="", help="also write the rows here (bench-results/NAME)")
    add_smoke(ap, "2 replicas, one rollout, 2 callers per path")
    args = ap.parse_args(argv)
    if args.smoke:
        for k, v in SMOKE.items():
            setattr(args, k, v)
    surges = args.surge.split(",")
    unavailable = args.max_unavailable.split(",")
    if len(unavailable) == 1:
        unavailable *= len(surges)
    with tempfile.TemporaryDirectory(prefix="rollout-live-") as tmp:
        rolls = asyncio.run(
            run(args.replicas, surges, unavailable, args.callers, args.delay_s, Path(tmp))
        )
    print(f"\nrolling updates of {args.replicas} echo replicas, {args.callers} callers per path")
    for r in rolls:
        print(
            f"  max_surge {r.surge:>4} max_unavailable {r.unavailable}: {r.seconds:6.1f} s, "
            f"at most {r.peak_targets} targets; "
            f"handle sent {r.handle.sent} ok {r.handle.ok} failed {r.handle.failed}; "
            f"http sent {r.http.sent} ok {r.http.ok} failed {r.http.failed}"
        )
        for kind, tally in (("handle", r.handle), ("http", r.http)):
            for err, n in tally.errors.most_common(5):
                print(f"    {kind} {n} x {err}")
        result_line(
            "rollout_live",
            replicas=args.replicas,
            max_surge=r.surge,
            max_unavailable=r.unavailable,
            rollout_s=round(r.seconds, 2),
            handle_sent=r.handle.sent,
            handle_failed=r.handle.failed,
            http_sent=r.http.sent,
            http_failed=r.http.failed,
        )
    if args.json:
        write_json(args.json, {"args": vars(args), "rolls": [r.as_dict() for r in rolls]})
    return 0 if all(r.handle.failed == r.http.failed == 0 for r in rolls) else 1


if __name__ == "__main__":
    sys.exit(main())

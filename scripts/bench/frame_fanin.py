"""Frame fan-in: one router process holding a long request to each of N replicas.

What runs: an embedded nats-server; a replica farm process (`--role farm`) that answers for N
simulated replicas of one deployment: it admits each request declaring health frames, then
holds it and sends one `HealthFrame` per replica per health period (phases spread evenly, as
independent checks are), and answers probes with the replica's health; and the measured router
process (`--role router`): fleetpulse's own `Router` and handle, one unary call in flight to
each replica (power of two choices spreads N calls over N members; the farm admits up to
`--per-replica` each), frames folded by the real response reader, liveness probes sent by it.

Measured in a steady window per (N, health period): frames/s and probes/s (counted by the
farm), the router process's CPU (cores, /proc), and as the baseline the same process holding
the same requests with frames off (the farm's admissions decline them), so the difference is what frames
cost over the held requests' own liveness traffic.

    .venv/bin/python -m scripts.bench.frame_fanin [--sizes 1024 4096 16384] [--periods 10 1]

`--smoke`: 32 replicas, a 1 s health period, 1 s warm-up and a 2 s window, frames off and on
(scripts/bench/smoke.py runs it).

Output: a table, bench-results/frame_fanin.json, one RESULT line per point.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scripts.bench.common import ROOT, add_smoke, print_table, result_line, write_json
from shared.natsbus import NatsBus
from shared.natsserver import NatsServer
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.wire.codec import decode_as, encode
from shared.wire.messages import Admission, HealthFrame, HealthStatus, Request

APP, DEP = "bench", "held"
CLK_TCK = os.sysconf("SC_CLK_TCK")
SMOKE: dict[str, Any] = {"sizes": [32], "periods": [1.0], "warm_s": 1.0, "measure_s": 2.0}


def rid(i: int) -> str:
    return f"r{i:05d}"


# -- the replica farm ------------------------------------------------------------------------


async def farm(url: str, n: int, period: float, frames_on: bool) -> None:
    bus = await NatsBus.connect(url, name="farm")
    held: dict[str, list[str]] = {}  # replica -> reply inboxes of its held requests
    sent = {"frames": 0, "probes": 0, "admitted": 0}

    def health(r: str) -> HealthStatus:
        return HealthStatus(r, True, time.time(), 0)

    async def on_request(msg: Any) -> None:
        r = msg.subject.rsplit(".", 1)[1]
        req = decode_as(msg.data, Request)
        frames = req.supports_health_frames and frames_on
        await bus.publish(msg.reply, encode(Admission(True, 1, health(r), frames)))
        sent["admitted"] += 1
        if frames:
            held.setdefault(r, []).append(msg.reply)

    async def on_probe(msg: Any) -> None:
        sent["probes"] += 1
        await bus.publish(msg.reply, encode(health(msg.subject.rsplit(".", 1)[1])))

    await bus.subscribe(f"{S.prefix}.rpc.{APP}.{DEP}.*", on_request)
    await bus.subscribe(f"{S.prefix}.probe.*", on_probe)
    print(json.dumps({"ready": True}), flush=True)
    ids = [rid(i) for i in range(n)]
    step = period / n
    start = time.monotonic()
    k = 0
    report_at = start + 1.0
    while True:
        # replica k's check is due at start + k * step (mod period): send the frames now due
        due = int((time.monotonic() - start) / step)
        while k < due:
            r = ids[k % n]
            inboxes = held.get(r)
            if inboxes:  # one frame per check, on one of its held requests (as replicas do)
                await bus.publish(inboxes[(k // n) % len(inboxes)], encode(HealthFrame(health(r))))
                sent["frames"] += 1
            k += 1
        if time.monotonic() >= report_at:
            report_at += 1.0
            print(json.dumps(sent), flush=True)
        await asyncio.sleep(0.005)


# -- the measured router -----------------------------------------------------------------------


async def router_main(url: str, n: int, per_replica: int) -> None:
    from services.router.config import RouterConfig
    from services.router.handle import connect_handle
    from services.router.testing import Seat, put_membership

    bus = await NatsBus.connect(url, name="router")
    await put_membership(
        bus, APP, DEP, 1, [Seat(rid(i), S.rpc(APP, DEP, rid(i))) for i in range(n)]
    )
    handle = await connect_handle(APP, DEP, bus=bus, config=RouterConfig())
    router = handle.router
    await router.wait_ready(60)
    h = handle.options(method="hold", deadline_s=3600)
    calls = [asyncio.create_task(h.remote()) for _ in range(n * per_replica)]
    while True:
        await asyncio.sleep(1.0)
        print(
            json.dumps(
                {"in_flight": router.chooser.in_flight_total(),
                 "failed": sum(1 for c in calls if c.done())}
            ),
            flush=True,
        )  # fmt: skip


# -- orchestration -----------------------------------------------------------------------------


class Child:
    """A role process; a thread keeps its latest status line (it prints one a second)."""

    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "scripts.bench.frame_fanin", *args],
            cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        self.last: dict[str, Any] = {}
        self.lines = 0
        threading.Thread(target=self._follow, daemon=True).start()

    def _follow(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.last = json.loads(line)
            self.lines += 1

    async def read(self) -> dict[str, Any]:
        """The next status line (waits for it)."""
        seen = self.lines
        while self.lines == seen:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.proc.args!r} exited with {self.proc.returncode}")
            await asyncio.sleep(0.05)
        return self.last

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait(10)


async def point(
    n: int, per_replica: int, period: float, frames: bool, warm_s: float, measure_s: float
) -> dict[str, Any]:
    server = NatsServer()
    server.start()
    farm_p = router_p = None
    try:
        farm_p = Child(
            ["--role", "farm", "--nats", server.url, "--n", str(n), "--period", str(period)]
            + ([] if frames else ["--no-frames"])
        )
        await farm_p.read()
        router_p = Child(
            [
                "--role",
                "router",
                "--nats",
                server.url,
                "--n",
                str(n),
                "--per-replica",
                str(per_replica),
            ]
        )
        deadline = time.monotonic() + 300
        while (await router_p.read()).get("in_flight", 0) < n * per_replica:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {router_p.last} of {n} requests in flight")
        t_end = time.monotonic() + warm_s
        while time.monotonic() < t_end:
            await router_p.read()
        cpu0, t0 = router_p.cpu_s(), time.monotonic()
        farm0 = await farm_p.read()
        while time.monotonic() < t0 + measure_s:
            await router_p.read()
        farm1 = await farm_p.read()
        span = time.monotonic() - t0
        return {
            "replicas": n, "held": n * per_replica, "period_s": period, "frames": frames,
            "frames_per_s": (farm1["frames"] - farm0["frames"]) / span,
            "probes_per_s": (farm1["probes"] - farm0["probes"]) / span,
            "router_cpu": (router_p.cpu_s() - cpu0) / span,
            "failed": router_p.last["failed"],
        }  # fmt: skip
    finally:
        for c in (router_p, farm_p):
            if c is not None:
                c.stop()
        server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--periods", type=float, nargs="+", default=[10.0, 1.0])
    ap.add_argument("--warm-s", type=float, default=5.0)
    ap.add_argument("--measure-s", type=float, default=20.0)
    ap.add_argument("--per-replica", type=int, default=1, help="requests held on each replica")
    ap.add_argument("--role", choices=("farm", "router"), help=argparse.SUPPRESS)
    ap.add_argument("--nats", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--period", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--no-frames", action="store_true", help=argparse.SUPPRESS)
    add_smoke(ap, "32 replicas, 1 s period, a 2 s window, frames off and on")
    a = ap.parse_args(argv)
    if a.smoke:
        for k, v in SMOKE.items():
            setattr(a, k, v)
    if a.role == "farm":
        asyncio.run(farm(a.nats, a.n, a.period, not a.no_frames))
        return 0
    if a.role == "router":
        asyncio.run(router_main(a.nats, a.n, a.per_replica))
        return 0
    rows: list[dict[str, Any]] = []
    for n in a.sizes:
        for period in a.periods:
            for frames in (False, True):
                row = asyncio.run(point(n, a.per_replica, period, frames, a.warm_s, a.measure_s))
                print(f"  replicas={n} period={period:g}s frames={frames}: {row}", flush=True)
                rows.append(row)
    table = []
    for r in rows:
        if not r["frames"]:
            continue
        base = next(
            b
            for b in rows
            if not b["frames"] and (b["held"], b["period_s"]) == (r["held"], r["period_s"])
        )
        r["cpu_ratio_over_no_frames"] = (
            r["router_cpu"] / base["router_cpu"] if base["router_cpu"] else None
        )
        table.append([
            r["replicas"], r["held"], f"{r['period_s']:g}", f"{r['frames_per_s']:.0f}", f"{r['probes_per_s']:.0f}",
            f"{base['probes_per_s']:.0f}", f"{r['router_cpu']:.2f}", f"{base['router_cpu']:.2f}",
        ])  # fmt: skip
    print_table(
        "One router process, one held request per replica",
        [
            "replicas",
            "held",
            "period s",
            "frames/s",
            "probes/s",
            "probes/s no frames",
            "cpu",
            "cpu no frames",
        ],
        table,
    )
    out = write_json("frame_fanin", {"args": vars(a), "rows": rows})
    print(f"wrote {out}")
    for r in rows:
        if r["frames"]:
            result_line(
                "frame_fanin", replicas=r["replicas"], held=r["held"], period_s=r["period_s"],
                frames_per_s=r["frames_per_s"], probes_per_s=r["probes_per_s"],
                router_cpu=r["router_cpu"],
            )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Controller failover benchmark: SIGKILL the member that owns a busy app, time its successor.

Setup: a 3-node loopback NATS cluster (KV buckets and FP_REPORTS with 3 replicas), three
`fleetpulse controller` member processes (one per node), one `fleetpulse agent` (on node 0) that
runs the app's replicas as real processes (`services.examples.model:Model`), and one autoscaling
app whose handle reports the benchmark publishes itself at 5/s with 6 queued requests (target 2
per replica, so the app's target is 3 once its first replica runs: the policy holds a target
while none of its replicas runs). The agent's replicas serve nothing (the load is the reports);
they make the running count real, so the policy's normal path decides, as in production.

Each round: read the busy partition's lease in KV `fp_leases`, SIGKILL its owner, and time
- takeover: until the lease names a surviving member at a higher epoch, and
- first decision: until the first `fp_status` or `fp_targets` write for the app stamped with an
  `owner_epoch` above the killed owner's (the successor has rebuilt the window and acted).
Then a replacement member (new id) starts on the killed member's node and the round waits until
the 16 partitions are balanced over the three live members and the current owner has written a
target of 3 with 3 replicas running. Per round, from the kill until the next round:
- lost window: a write ever shows a target below 3 (a decision made on a partial window);
- partial: a successor's status says it held because its look-back window was not full (it
  wanted to scale down on a partial window and the no-scale-down-before-a-full-window rule
  stopped it: the rebuild missed history);
- the fewest replicas running in the status writes (the kill must not touch the replicas).
A lost window or a partial round makes the run exit 1. What neither can show: whether the
successor replayed the history at all. The reports go on through the kill, so a successor that
skipped the replay would fill its window from live reports at the same demand and decide the
same; that needs reports that stop at the kill (a test, not this benchmark).

    .venv/bin/python -m scripts.bench.failover [--kills 20] [--quick | --smoke] [--member-ttl-s 2 --heartbeat-s 0.5]

`--smoke` (2 kills) checks that the benchmark still runs end to end; it writes its JSON and plot
to $FLEETPULSE_BENCH_OUT (else a temporary directory), never to bench-results/ or docs/img/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from scripts.bench.common import (
    OUT_ENV,
    ROOT,
    add_smoke,
    plot_path,
    print_table,
    result_line,
    shown,
    start_service,
    stop_services,
    write_json,
)
from services.controller.group import (
    DEFAULT_HEARTBEAT_S,
    DEFAULT_MEMBER_TTL_S,
    lease_key,
    partition_of,
)
from services.controller.group_shell import KV_LEASES
from services.controller.stream import DEFAULT_PARTITIONS
from shared.appconfig import AppConfig, AutoscalingConfig, DeploymentConfig
from shared.kv.status import AppStatusView
from shared.kv.targets import ReplicaTarget, app_pattern
from shared.kv.view import DocKV
from shared.natsbus import NatsBus
from shared.natsserver import NatsCluster
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.subjects import KV_APPS, KV_STATUS, KV_TARGETS
from shared.wire import encode
from shared.wire.messages import HandleReport

APP, DEPLOYMENT = "busy", "Model"
NODES = 3
PARTITIONS = DEFAULT_PARTITIONS
REPORT_INTERVAL_S = 0.2
QUEUED = 6.0
TARGET = 3
TARGET_P99_S = 3.0
REBUILD_S = 20.0
TAKEOVER_TIMEOUT_S = 15.0
DECISION_TIMEOUT_S = 15.0
SETTLE_TIMEOUT_S = 45.0
POLL_S = 0.05
SMOKE_KILLS = 2
AGENT_SLOTS = 8
# the policy's reason when it holds because the look-back window is not covered (policy.py)
PARTIAL_WINDOW = "window not full"
POLICY = AutoscalingConfig(
    min_replicas=1, max_replicas=6, target_ongoing_requests=2.0, upscale_delay_s=0.5,
    downscale_delay_s=2.0, look_back_period_s=2.0, metrics_interval_s=0.5,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Write:
    """One KV write for the busy app, as the benchmark's watch saw it."""

    at: float
    bucket: str
    owner_epoch: int
    target: int
    running: int = -1  # fp_status only: the deployment's running replicas (-1: a target write)
    reason: str = ""  # fp_status only: the policy's last decision


@dataclass(frozen=True, slots=True)
class Round:
    killed: str
    successor: str
    old_epoch: int
    new_epoch: int
    takeover_s: float
    decision_s: float
    decided_by: str
    first_reason: str
    min_target: int
    min_running: int
    partial: int  # successor status writes in the round saying the window was not full

    @property
    def lost_window(self) -> bool:
        return self.min_target < TARGET


def busy_app() -> AppConfig:
    model = DeploymentConfig(
        DEPLOYMENT, "services.examples.model:Model", graceful_shutdown_timeout_s=2.0,
        health_check_period_s=1.0, autoscaling=POLICY,
    )  # fmt: skip
    return AppConfig(APP, (model,), version="v1")


class Members:
    """The controller member processes; `stop_all` leaves none behind."""

    def __init__(self, cluster: NatsCluster, log_dir: Path, extra: Sequence[str] = ()) -> None:
        self.cluster, self.log_dir, self.extra = cluster, log_dir, list(extra)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.node_of: dict[str, int] = {}
        self._next = 0

    def start(self, node: int) -> str:
        self._next += 1
        member = f"c{self._next:02d}"
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        env["FLEETPULSE_KV_REPLICAS"] = str(NODES)
        args = [
            "-m", "services.cli", "controller", "--nats", self.cluster.urls[node],
            "--member-id", member, "--rebuild-s", str(REBUILD_S), "--stream-replicas", str(NODES),
            *self.extra,
        ]  # fmt: skip
        with open(self.log_dir / f"{member}.log", "wb") as log:
            self.procs[member] = subprocess.Popen(
                [sys.executable, *args], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        self.node_of[member] = node
        return member

    def kill(self, member: str) -> None:
        proc = self.procs.pop(member)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    @property
    def live(self) -> set[str]:
        return {m for m, p in self.procs.items() if p.poll() is None}

    def stop_all(self, timeout: float = 15.0) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()


class Watch:
    """Follows the app's fp_status and fp_targets writes (with local receipt times)."""

    def __init__(self, bus: NatsBus) -> None:
        self.bus = bus
        self.writes: list[Write] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._follow_status()),
            asyncio.create_task(self._follow_targets()),
        ]

    async def _follow_status(self) -> None:
        async for entry in await (await self.bus.kv(KV_STATUS)).watch(APP):
            if entry is None or entry.op != "PUT":
                continue
            st = AppStatusView.decode(entry.value)
            dep = st.deployments.get(DEPLOYMENT)
            if dep is not None:
                self.writes.append(
                    Write(
                        time.monotonic(),
                        KV_STATUS,
                        st.owner_epoch,
                        dep.target_replicas,
                        dep.running_replicas,
                        dep.last_decision,
                    )
                )

    async def _follow_targets(self) -> None:
        """One key per replica: a write's target is the number of the deployment's keys after
        it; a delete carries no owner epoch (-1 here)."""
        live: set[str] = set()
        docs = DocKV(await self.bus.kv(KV_TARGETS), ReplicaTarget)
        async for change in await docs.watch(app_pattern(APP)):
            if change is None:
                continue
            if change.doc is None:
                if change.key not in live:
                    continue
                live.discard(change.key)
                epoch = -1
            elif change.doc.deployment != DEPLOYMENT:
                continue
            else:
                live.add(change.key)
                epoch = change.doc.owner_epoch
            self.writes.append(Write(time.monotonic(), KV_TARGETS, epoch, len(live)))

    def first_after(self, since: float, above_epoch: int) -> Write | None:
        return next((w for w in self.writes if w.at >= since and w.owner_epoch > above_epoch), None)

    def between(self, start: float, end: float) -> list[Write]:
        return [w for w in self.writes if start <= w.at < end]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def lease_of(bus: NatsBus, partition: int) -> tuple[str, int]:
    entry = await (await bus.kv(KV_LEASES)).get(lease_key(partition))
    if entry is None:
        return "", 0
    doc = json.loads(entry.value)
    return str(doc["owner"]), int(doc["epoch"])


async def balanced(bus: NatsBus, ids: set[str]) -> bool:
    owners = [(await lease_of(bus, p))[0] for p in range(PARTITIONS)]
    if set(owners) != ids:
        return False
    counts = [owners.count(m) for m in ids]
    return max(counts) - min(counts) <= 1


async def until(cond: Any, within_s: float, what: str) -> Any:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        value = await cond()
        if value:
            return value
        await asyncio.sleep(POLL_S)
    raise TimeoutError(f"not within {within_s:g} s: {what}")


async def pump_reports(bus: NatsBus, stop: asyncio.Event) -> None:
    """Steady load, sent on a fixed schedule so a slow loop iteration does not thin it out."""
    seq = 0
    next_at = time.monotonic()
    subject = S.report("handle", APP, DEPLOYMENT)
    while not stop.is_set():
        seq += 1
        report = HandleReport("bench", APP, DEPLOYMENT, time.time(), seq, QUEUED, {}, (), 1)
        await bus.publish(subject, encode(report))
        next_at += REPORT_INTERVAL_S
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))


async def settled(bus: NatsBus, members: Members, watch: Watch, part: int) -> bool:
    """Balanced over the live members, and the busy app's owner has written target 3 with 3
    replicas running."""
    if not await balanced(bus, members.live):
        return False
    _, epoch = await lease_of(bus, part)
    mine = [w for w in watch.writes if w.owner_epoch == epoch]
    status = [w for w in mine if w.bucket == KV_STATUS]
    return bool(status) and mine[-1].target == TARGET and status[-1].running == TARGET


async def one_round(
    bus: NatsBus, members: Members, watch: Watch, part: int, n: int
) -> tuple[Round, float]:
    victim, old_epoch = await lease_of(bus, part)
    node = members.node_of[victim]
    killed_at = time.monotonic()
    members.kill(victim)
    survivors = members.live

    async def taken() -> tuple[str, int] | None:
        owner, epoch = await lease_of(bus, part)
        return (owner, epoch) if owner in survivors and epoch > old_epoch else None

    successor, new_epoch = await until(taken, TAKEOVER_TIMEOUT_S, f"round {n}: takeover")
    takeover_s = time.monotonic() - killed_at

    async def decided() -> Write | None:
        return watch.first_after(killed_at, old_epoch)

    first = await until(decided, DECISION_TIMEOUT_S, f"round {n}: first decision")
    members.start(node)
    await until(lambda: settled(bus, members, watch, part), SETTLE_TIMEOUT_S, f"round {n}: settled")
    r = Round(
        killed=victim, successor=successor, old_epoch=old_epoch, new_epoch=new_epoch,
        takeover_s=takeover_s, decision_s=first.at - killed_at, decided_by=first.bucket,
        first_reason="", min_target=TARGET, min_running=TARGET, partial=0,
    )  # fmt: skip
    return r, killed_at


async def run(kills: int, log_dir: Path, member_args: Sequence[str] = ()) -> list[Round]:
    os.environ["FLEETPULSE_KV_REPLICAS"] = str(NODES)
    cluster = NatsCluster(NODES)
    cluster.start()
    members = Members(cluster, log_dir, member_args)
    agent: subprocess.Popen[bytes] | None = None
    stop = asyncio.Event()
    bus: NatsBus | None = None
    watch: Watch | None = None
    pump: asyncio.Task[None] | None = None
    try:
        bus = await NatsBus.connect(cluster.url, name="bench-failover", reconnect_wait=0.1)
        await (await bus.kv(KV_APPS)).put(APP, busy_app().to_json())
        for node in range(NODES):
            members.start(node)
        agent = start_service(
            ["-m", "services.cli", "agent", "--nats", cluster.urls[0], "--agent-id", "a1",
             "--max-replicas", str(AGENT_SLOTS), "--log-dir", str(log_dir / "replicas")],
            log_dir / "agent.log",
        )  # fmt: skip
        await until(lambda: balanced(bus, members.live), SETTLE_TIMEOUT_S, "initial balance")
        watch = Watch(bus)
        await watch.start()
        pump = asyncio.create_task(pump_reports(bus, stop))
        part = partition_of(APP, PARTITIONS)
        await until(
            lambda: settled(bus, members, watch, part), SETTLE_TIMEOUT_S, "target 3, 3 running"
        )
        rounds: list[Round] = []
        starts: list[float] = []
        for n in range(1, kills + 1):
            r, killed_at = await one_round(bus, members, watch, part, n)
            rounds.append(r)
            starts.append(killed_at)
            print(
                f"  kill {n}/{kills}: {r.killed} -> {r.successor} "
                f"takeover {r.takeover_s:.2f} s, first decision {r.decision_s:.2f} s",
                file=sys.stderr,
                flush=True,
            )
        await asyncio.sleep(1.0)  # the last round's tail
        ends = [*starts[1:], time.monotonic()]
        return [
            _with_round_writes(r, watch.between(s, e))
            for r, s, e in zip(rounds, starts, ends, strict=True)
        ]
    finally:
        stop.set()
        if pump is not None:
            await asyncio.gather(pump, return_exceptions=True)
        if watch is not None:
            await watch.stop()
        if bus is not None:
            await bus.close()
        members.stop_all()
        if agent is not None:
            stop_services([agent])  # drains its replicas
        cluster.stop()
        os.environ.pop("FLEETPULSE_KV_REPLICAS", None)


def _with_round_writes(r: Round, writes: Sequence[Write]) -> Round:
    """The round's lowest target and running count, and what its successors' status said."""
    status = [w for w in writes if w.bucket == KV_STATUS]
    successors = [w for w in status if w.owner_epoch > r.old_epoch]
    return replace(
        r,
        min_target=min((w.target for w in writes), default=TARGET),
        min_running=min((w.running for w in status), default=TARGET),
        first_reason=successors[0].reason if successors else "",
        partial=sum(PARTIAL_WINDOW in w.reason for w in successors),
    )


def plot(rounds: Sequence[Round]) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(
            "WARNING: matplotlib is not installed, skipping the plot "
            "(install it with `.venv/bin/pip install matplotlib`)",
            file=sys.stderr,
        )
        return None
    x = np.arange(1, len(rounds) + 1)
    takeover = np.array([r.takeover_s for r in rounds])
    rebuild = np.array([r.decision_s for r in rounds]) - takeover
    fig, ax = plt.subplots(figsize=(8, 3.8))
    ax.bar(x, takeover, label="lease taken over (member TTL)", color="tab:blue")
    ax.bar(x, rebuild, bottom=takeover, label="rebuild + first decision", color="tab:orange")
    for i, r in enumerate(rounds):
        if r.lost_window:
            ax.annotate("lost", (x[i], r.decision_s), ha="center", va="bottom", color="tab:red")
    ax.axhline(TARGET_P99_S, color="tab:red", lw=0.8, ls="--", label="target p99")
    ax.set(xlabel="kill", ylabel="seconds after SIGKILL", xticks=x)
    ax.set_ylim(0, max(TARGET_P99_S, *(r.decision_s for r in rounds)) * 1.3)
    ax.set_title("Controller failover: time to the successor's first decision")
    ax.legend(loc="upper center", ncol=3, fontsize="small")
    fig.tight_layout()
    path = plot_path("failover.png")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return shown(path)


def summarize(rounds: Sequence[Round]) -> dict[str, Any]:
    def pct(values: Sequence[float]) -> dict[str, float]:
        a = np.asarray(values, dtype=np.float64)
        return {
            "p50_s": float(np.percentile(a, 50)),
            "p90_s": float(np.percentile(a, 90)),
            "p99_s": float(np.percentile(a, 99)),
            "max_s": float(a.max()),
        }

    decision = pct([r.decision_s for r in rounds])
    return {
        "kills": len(rounds),
        "takeover": pct([r.takeover_s for r in rounds]),
        "first_decision": decision,
        "lost_windows": sum(r.lost_window for r in rounds),
        "partial_windows": sum(r.partial > 0 for r in rounds),
        "min_running": min(r.min_running for r in rounds),
        "target_p99_s": TARGET_P99_S,
        "met": decision["p99_s"] <= TARGET_P99_S,
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--kills", type=int, default=20, help="SIGKILLs of the owner (default 20)")
    ap.add_argument("--quick", action="store_true", help="5 kills")
    add_smoke(ap, f"{SMOKE_KILLS} kills")
    ap.add_argument("--keep-logs", action="store_true", help="keep the member logs")
    ap.add_argument(
        "--member-ttl-s", type=float, default=DEFAULT_MEMBER_TTL_S, help="passed to every member"
    )
    ap.add_argument(
        "--heartbeat-s", type=float, default=DEFAULT_HEARTBEAT_S, help="passed to every member"
    )
    args = ap.parse_args(argv)
    kills = SMOKE_KILLS if args.smoke else 5 if args.quick else args.kills
    if args.smoke and not os.environ.get(OUT_ENV):
        os.environ[OUT_ENV] = tempfile.mkdtemp(prefix="fleetpulse-smoke-")
    member_args = ["--member-ttl-s", str(args.member_ttl_s), "--heartbeat-s", str(args.heartbeat_s)]
    log_dir = Path(tempfile.mkdtemp(prefix="fleetpulse-failover-"))
    try:
        rounds = asyncio.run(run(kills, log_dir, member_args))
    except BaseException:
        print(f"member logs kept in {log_dir}", file=sys.stderr)
        raise
    if not args.keep_logs:
        shutil.rmtree(log_dir, ignore_errors=True)
    else:
        print(f"member logs in {log_dir}")
    rows = [
        [i, r.killed, r.successor, r.new_epoch, r.takeover_s, r.decision_s, r.decided_by,
         r.min_target, r.min_running, r.partial, "LOST" if r.lost_window else "",
         r.first_reason]
        for i, r in enumerate(rounds, 1)
    ]  # fmt: skip
    print_table(
        f"controller failover, {NODES} nodes, {NODES} members (TTL {args.member_ttl_s:g} s, "
        f"heartbeat {args.heartbeat_s:g} s), SIGKILL of the busy owner",
        ["kill", "killed", "successor", "epoch", "takeover s", "decision s", "first write",
         "min target", "min running", "partial", "", "successor's first status"],
        rows,
    )  # fmt: skip
    summary = summarize(rounds)
    d, t = summary["first_decision"], summary["takeover"]
    print_table(
        "summary (seconds after SIGKILL)",
        ["phase", "p50", "p90", "p99", "max"],
        [
            ["lease taken over", t["p50_s"], t["p90_s"], t["p99_s"], t["max_s"]],
            ["first decision", d["p50_s"], d["p90_s"], d["p99_s"], d["max_s"]],
        ],
    )
    verdict = "met" if summary["met"] else "MISSED"
    print(f"\ntarget: first decision p99 <= {TARGET_P99_S:g} s: {verdict}")
    print(
        f"lost windows (target below {TARGET}): {summary['lost_windows']} of {len(rounds)}; "
        f"rounds whose successor held on a window not full: {summary['partial_windows']}; "
        f"fewest replicas running: {summary['min_running']}"
    )
    image = plot(rounds)
    payload = {
        **summary,
        "rounds": [asdict(r) | {"lost_window": r.lost_window} for r in rounds],
        "setup": {
            "nodes": NODES,
            "partitions": PARTITIONS,
            "report_interval_s": REPORT_INTERVAL_S,
            "queued_requests": QUEUED,
            "target": TARGET,
            "agent_slots": AGENT_SLOTS,
            "import_path": busy_app().deployments[0].import_path,
            "rebuild_s": REBUILD_S,
            "member_ttl_s": args.member_ttl_s,
            "heartbeat_s": args.heartbeat_s,
            "policy": asdict(POLICY),
        },
        "plot": image,
    }
    path = write_json("failover", payload)
    print(f"\nwrote {shown(path)}" + (f" and {image}" if image else ""))
    result_line(
        "failover", kills=len(rounds), p50_s=d["p50_s"], p99_s=d["p99_s"],
        lost_windows=summary["lost_windows"], partial_windows=summary["partial_windows"],
    )  # fmt: skip
    # a decision on a partial window is a failover bug, not noise: fail the run (and CI's smoke)
    return 1 if summary["lost_windows"] or summary["partial_windows"] else 0


if __name__ == "__main__":
    sys.exit(main())

"""Auth callout benchmark: the request path and a connection storm, with the callout on vs off.

Two embedded nats-servers run side by side in one run: one as today (no auth), one with the
auth callout answered by `fleetpulse auth` (its own process). On each, a replica process hosts
`Echo.echo` (on the callout side with the credential an agent would give it) and a
`DeploymentHandle` calls it (on the callout side logged in as the router role). Rounds
alternate between the two so drift in machine load hits both alike; the result is ratios.

The storm then opens N connections at once, as N replicas would after a NATS restart (each
with its own credential file and inboxes, through `NatsBus.connect`), to each server in turn,
and measures the time until all are connected and the CPU the auth service and the server used.

    .venv/bin/python -m scripts.bench.auth [--requests 3000] [--connections 1000] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts.bench.common import (
    ROOT,
    add_smoke,
    percentiles,
    print_table,
    result_line,
    stop_services,
    write_json,
)
from services.auth.embedded import AUTH_USER
from services.auth.serverconf import callout_config
from services.router.config import RouterConfig
from services.router.handle import connect_handle
from services.router.testing import Seat, put_membership
from shared.natsauth import NatsAuth
from shared.natsbus import NatsBus
from shared.natsjwt import PREFIX_ACCOUNT, PREFIX_USER, KeyPair
from shared.natsserver import NatsServer
from shared.replicacred import inbox_prefix, mint, write_credential
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.subjects import KV_APPS, KV_MEMBERSHIP, KV_STATUS

READY_TIMEOUT_S = 60.0
ROLES = ("router", "controller")
WARMUP = 200
SMOKE = {"requests": 40, "rounds": 2, "connections": 20, "storms": 1, "warmup": 10}


@dataclass
class Side:
    """One server and what runs on it: `auth` is None for the side without the callout."""

    name: str
    server: NatsServer
    tmp: Path
    key: KeyPair | None = None
    passwords: dict[str, str] = field(default_factory=dict)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def auth_pid(self) -> int | None:
        return self.procs[0].pid if self.key is not None else None

    def role(self, role: str) -> NatsAuth:
        return NatsAuth(user=role, password=self.passwords[role]) if self.key else NatsAuth()

    def replica_auth(self, app: str, rid: str, now: float) -> tuple[NatsAuth, dict[str, str]]:
        if self.key is None:
            return NatsAuth(), {}
        path = self.tmp / f"{rid}.cred"
        write_credential(path, mint(self.key, app, "Echo", rid, now=now, ttl_s=3600))
        auth = NatsAuth(token_file=str(path), inbox_prefix=inbox_prefix(rid))
        return auth, auth.to_env()

    def stop(self) -> None:
        stop_services(self.procs, 10.0)
        self.server.stop()


def spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("FLEETPULSE_NATS_")}
    full.update(env, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, *args], cwd=ROOT, env=full, stdout=out, stderr=subprocess.STDOUT
        )


async def start_side(name: str, callout: bool) -> Side:
    tmp = Path(tempfile.mkdtemp(prefix=f"fleetpulse-bench-auth-{name}-"))
    if not callout:
        return Side(name, NatsServer().start(), tmp)
    issuer, key = KeyPair.generate(PREFIX_ACCOUNT), KeyPair.generate(PREFIX_USER)
    auth_pw = secrets.token_hex(16)
    conf = tmp / "server.conf"
    conf.write_text(callout_config(issuer.public_key, {AUTH_USER: auth_pw}))
    side = Side(name, NatsServer(config_file=conf).start(), tmp, key)
    side.passwords = {r: secrets.token_hex(8) for r in ROLES}
    (tmp / "issuer.seed").write_text(issuer.seed)
    env = {
        "FLEETPULSE_NATS_USER": AUTH_USER,
        "FLEETPULSE_NATS_PASSWORD": auth_pw,
        "FLEETPULSE_AUTH_REPLICA_KEYS": key.public_key,
        **{f"FP_{r.upper()}_PASSWORD": pw for r, pw in side.passwords.items()},
    }
    args = [
        "-m",
        "services.auth",
        "--nats",
        side.server.url,
        "--issuer-seed",
        str(tmp / "issuer.seed"),
    ]
    side.procs.append(spawn(args, env, tmp / "auth.log"))
    deadline = time.monotonic() + READY_TIMEOUT_S
    while "auth callout up" not in (tmp / "auth.log").read_text():
        if time.monotonic() > deadline or side.procs[0].poll() is not None:
            raise RuntimeError("auth service did not start: " + (tmp / "auth.log").read_text())
        await asyncio.sleep(0.1)
    return side


async def request_path(
    sides: list[Side], requests: int, payload_size: int, rounds: int, warmup: int = WARMUP
) -> dict[str, Any]:
    payload = os.urandom(payload_size)
    calls = {}
    closers = []
    for side in sides:
        _, env = side.replica_auth("bench", "b1", time.time())
        side.procs.append(
            spawn(
                ["-m", "services.replica", "--nats", side.server.url, "--app", "bench",
                 "--deployment", "Echo", "--import-path", "services.examples.echo:Echo",
                 "--replica-id", "b1", "--max-ongoing-requests", "100"],
                env, side.tmp / "replica.log",
            )
        )  # fmt: skip
        admin = await NatsBus.connect(side.server.url, name="bench", auth=side.role("controller"))
        for bucket in (KV_MEMBERSHIP, KV_APPS, KV_STATUS, "fp_routes"):
            await admin.kv(bucket)
        await put_membership(admin, "bench", "Echo", 1, [Seat("b1", S.rpc("bench", "Echo", "b1"))])
        bus = await NatsBus.connect(side.server.url, name="bench-client", auth=side.role("router"))
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            try:
                await bus.request(S.probe("b1"), b"", timeout=0.5)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
        handle = await connect_handle("bench", "Echo", bus=bus, config=RouterConfig())
        calls[side.name] = handle.options(method="echo")
        closers += [handle.close, bus.close, admin.close]

    async def once(name: str) -> float:
        t0 = time.perf_counter()
        assert await calls[name].remote(payload) == payload
        return time.perf_counter() - t0

    for name in calls:
        for _ in range(warmup):
            await once(name)
    samples: dict[str, list[float]] = {name: [] for name in calls}
    per_round = max(1, requests // rounds)
    names = list(calls)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            for _ in range(per_round):
                samples[name].append(await once(name))
        print(f"  request round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
    for close in closers:
        await close()
    return {name: percentiles(s) for name, s in samples.items()}


def cpu_s(pid: int | None) -> float:
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.refused = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "auth service may be down" in record.getMessage():
            self.refused += 1


async def storm(side: Side, n: int) -> dict[str, float]:
    now = time.time()
    auths = [side.replica_auth("storm", f"s{i}", now)[0] for i in range(n)]
    counter = _Count()
    logging.getLogger("shared.natsbus").addHandler(counter)
    auth0, server0 = cpu_s(side.auth_pid), cpu_s(side.server.pid)
    t0 = time.perf_counter()
    buses = await asyncio.gather(
        *(
            NatsBus.connect(side.server.url, name=f"s{i}", auth=a, connect_timeout=120)
            for i, a in enumerate(auths)
        )
    )
    elapsed = time.perf_counter() - t0
    auth_cpu, server_cpu = cpu_s(side.auth_pid) - auth0, cpu_s(side.server.pid) - server0
    logging.getLogger("shared.natsbus").removeHandler(counter)
    await asyncio.gather(*(b.close() for b in buses))
    return {
        "connections": n,
        "all_connected_s": elapsed,
        "auth_cpu_s": auth_cpu,
        "auth_cpu_ms_per_connection": 1e3 * auth_cpu / n,
        "server_cpu_s": server_cpu,
        "refused_then_retried": counter.refused,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    sides = [await start_side("off", False), await start_side("on", True)]
    try:
        res: dict[str, Any] = {"payload_bytes": args.payload}
        if args.requests:
            warmup = SMOKE["warmup"] if args.smoke else WARMUP
            res["request"] = await request_path(
                sides, args.requests, args.payload, args.rounds, warmup
            )
        if args.connections:
            res["storm"] = {}
            for rep in range(args.storms):
                for side in sides if rep % 2 == 0 else sides[::-1]:
                    res["storm"].setdefault(side.name, []).append(
                        await storm(side, args.connections)
                    )
        return res
    finally:
        for side in sides:
            side.stop()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=3000, help="per side (default 3000; 0: skip)")
    p.add_argument("--payload", type=int, default=256, help="payload bytes (default 256)")
    p.add_argument("--rounds", type=int, default=10, help="alternating rounds (default 10)")
    p.add_argument("--connections", type=int, default=1000, help="storm size (0: skip)")
    p.add_argument("--storms", type=int, default=2, help="storms per side, alternating (default 2)")
    add_smoke(p, "40 requests per side in 2 rounds, one storm of 20 connections per side")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.smoke:
        for k in ("requests", "rounds", "connections", "storms"):
            setattr(args, k, SMOKE[k])
    logging.basicConfig(level=logging.ERROR)
    res = asyncio.run(run(args))
    fields: dict[str, float | int | str] = {}
    if "request" in res:
        off, on = res["request"]["off"], res["request"]["on"]
        print_table(
            f"request path, {args.payload} B payload: handle.remote(), auth callout off vs on",
            ["auth", "n", "p50 ms", "p90 ms", "p99 ms"],
            [
                [k, v["n"], v["p50_ms"], v["p90_ms"], v["p99_ms"]]
                for k, v in (("off", off), ("on", on))
            ],
        )
        fields["p50_ratio"] = res["p50_ratio"] = on["p50_ms"] / off["p50_ms"]
        fields["p99_ratio"] = res["p99_ratio"] = on["p99_ms"] / off["p99_ms"]
    if "storm" in res:
        rows = [
            [k, s["connections"], s["all_connected_s"], s["auth_cpu_s"], s["server_cpu_s"],
             s["refused_then_retried"]]
            for k, runs in res["storm"].items() for s in runs
        ]  # fmt: skip
        print_table(
            f"connection storm: {args.connections} replicas connecting at once",
            ["auth", "n", "all connected s", "auth CPU s", "server CPU s", "retried"],
            rows,
        )
        best = {k: min(s["all_connected_s"] for s in runs) for k, runs in res["storm"].items()}
        fields["storm_ratio"] = res["storm_ratio"] = best["on"] / best["off"]
        fields["storm_on_s"] = best["on"]
        fields["auth_cpu_ms_per_conn"] = max(
            s["auth_cpu_ms_per_connection"] for s in res["storm"]["on"]
        )
    path = write_json("auth", res)
    print(f"\nwrote {path}")
    result_line("auth", **fields)


if __name__ == "__main__":
    main()

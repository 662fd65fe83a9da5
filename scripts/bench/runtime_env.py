"""Runtime environments: shipping a working_dir to a fleet of agents.

What it measures, on a real nats-server with a controller and N agent processes (each its own
package cache), for an app whose code is a working_dir of SIZE MB (incompressible bytes plus the
app module) and one replica per agent:
- deploy: what `fleetpulse deploy` does for the code, in process (zip, hash, upload to the
  object store, write fp_apps; the CLI's own start and the app's build are left out);
- cold: from the fp_apps write until every replica runs (each agent fetches the package from
  the object store, verifies it, unpacks it, starts its replica);
- warm: the app deleted and deployed again unchanged: nothing is uploaded (same content address)
  and no agent fetches (its cache has it): the same path minus the transfer;
- bytes: what the object store's stream grew by per deploy (first and second);
- rezip: the warm deploy's packaging without deploy's package index (services/ops/pkgindex.py),
  which zips and hashes the unchanged directory again; warm uses the index as the CLI does.
The ratio cold/warm is the price of the transfer; timings are noisy on a shared machine, so
compare ratios within one run.

    .venv/bin/python -m scripts.bench.runtime_env [--agents 4] [--size-mb 10] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from scripts.bench.common import (
    add_smoke,
    print_table,
    result_line,
    shown,
    start_service,
    stop_services,
    write_json,
)
from services.ops import packaging, pkgindex
from shared.appbuild import build_apps
from shared.kv.agents import AGENT_TTL_S
from shared.kv.status import AppStatusView
from shared.natsbus import NatsBus
from shared.natsserver import NatsServer
from shared.subjects import KV_AGENTS, KV_APPS, KV_STATUS

APP = "shipped"
READY_S = 300.0
MODULE = """
from fleetpulse import serve


@serve.deployment
class Model:
    def __call__(self, request: object = None) -> str:
        return "ok"


app = Model.bind()
"""


def write_working_dir(root: Path, size_mb: float) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "bench_model.py").write_text(MODULE)
    weights = root / "weights"
    weights.mkdir(exist_ok=True)
    left = int(size_mb * (1 << 20))
    i = 0
    while left > 0:
        n = min(left, 1 << 20)
        (weights / f"part-{i:03d}.bin").write_bytes(os.urandom(n))
        left -= n
        i += 1


def app_yaml(wd: Path, agents: int) -> str:
    return (
        f"applications:\n  - name: {APP}\n    route_prefix: null\n"
        "    import_path: bench_model:app\n"
        f"    runtime_env: {{working_dir: {wd}}}\n"
        "    deployments:\n      - name: Model\n"
        f"        num_replicas: {agents}\n        max_replicas_per_node: 1\n"
    )


async def store_bytes(bus: NatsBus) -> int:
    try:
        info = await bus.js.stream_info("OBJ_fp_packages")
    except Exception:  # no package was ever uploaded
        return 0
    return int(info.state.bytes)


async def wait_running(bus: NatsBus, replicas: int, since: float) -> float:
    kv = await bus.kv(KV_STATUS)
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        entry = await kv.get(APP)
        if entry is not None:
            view = AppStatusView.decode(entry.value)
            d = view.deployments.get("Model")
            if view.status == "RUNNING" and d is not None and d.healthy_replicas >= replicas:
                return time.monotonic() - since
            if view.status == "DEPLOY_FAILED":
                raise RuntimeError(f"{APP} DEPLOY_FAILED: {d.message if d else ''}")
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{APP} not running with {replicas} replicas within {READY_S} s")


async def wait_agents(bus: NatsBus, agents: int) -> None:
    kv = await bus.kv(KV_AGENTS, ttl=AGENT_TTL_S)
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if len(await kv.keys()) >= agents:
            await asyncio.sleep(2.0)  # their imports done, the machine quiet again
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"fewer than {agents} agents registered within {READY_S} s")


async def wait_gone(bus: NatsBus) -> None:
    kv = await bus.kv(KV_STATUS)
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if await kv.get(APP) is None:
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{APP} still has a status {READY_S} s after delete")


async def run(agents: int, size_mb: float, tmp: Path) -> dict[str, Any]:
    wd = tmp / "wd"
    write_working_dir(wd, size_mb)
    config = tmp / "app.yaml"
    config.write_text(app_yaml(wd, agents))
    server = NatsServer()
    server.start()
    procs = []
    try:
        url = server.url
        procs.append(
            start_service(
                ["-m", "services.cli", "controller", "--nats", url], tmp / "controller.log"
            )
        )
        for i in range(agents):
            procs.append(
                start_service(
                    [
                        "-m",
                        "services.cli",
                        "agent",
                        "--nats",
                        url,
                        "--agent-id",
                        f"a{i}",
                        "--max-replicas",
                        "2",
                        "--cache-dir",
                        str(tmp / f"cache-{i}"),
                        "--log-dir",
                        str(tmp / f"replicas-{i}"),
                    ],
                    tmp / f"agent-{i}.log",
                )
            )
        bus = await NatsBus.connect(url, name="bench-runtime-env")
        try:
            await wait_agents(bus, agents)  # registered and idle: placement spreads over them
            out: dict[str, Any] = {"agents": agents, "size_mb": size_mb}
            apps = await asyncio.to_thread(build_apps, str(config))
            kv = await bus.kv(KV_APPS)
            index = pkgindex.PackageIndex(tmp / "deploy-packages.json")
            for phase in ("cold", "warm"):
                before = await store_bytes(bus)
                t0 = time.monotonic()
                packager = packaging.Packager(packaging.store_of(bus, create=True), index=index)
                (app,) = await packaging.resolve_apps(apps, packager)
                await kv.put(app.name, app.to_json())
                t1 = time.monotonic()
                out[f"{phase}_deploy_s"] = t1 - t0
                out[f"{phase}_running_s"] = await wait_running(bus, agents, t1)
                out[f"{phase}_uploaded_bytes"] = packager.stats.uploaded_bytes
                out[f"{phase}_store_bytes"] = max(0, await store_bytes(bus) - before)
                out[f"{phase}_not_zipped"] = packager.stats.unzipped
                await kv.delete(APP)
                await wait_gone(bus)
            t0 = time.monotonic()
            await packaging.resolve_apps(
                apps, packaging.Packager(packaging.store_of(bus, create=True))
            )
            out["rezip_deploy_s"] = time.monotonic() - t0
            fetched = sum(
                (tmp / f"agent-{i}.log").read_text().count("services.agent.packages: package")
                for i in range(agents)
            )
            out["fetches"] = fetched
            return out
        finally:
            await bus.close()
    finally:
        stop_services(procs)
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--size-mb", type=float, default=10.0)
    add_smoke(ap, "2 agents, a 1 MB working_dir")
    args = ap.parse_args()
    agents, size = (2, 1.0) if args.smoke else (args.agents, args.size_mb)
    with tempfile.TemporaryDirectory(prefix="fp-bench-runtime-env-") as tmp:
        r = asyncio.run(run(agents, size, Path(tmp)))
    print_table(
        f"runtime_env: a {size:g} MB working_dir to {agents} agents (one replica each)",
        ["phase", "package+upload s", "write->all running s", "uploaded bytes", "store grew"],
        [
            [
                p,
                r[f"{p}_deploy_s"],
                r[f"{p}_running_s"],
                r[f"{p}_uploaded_bytes"],
                r[f"{p}_store_bytes"],
            ]
            for p in ("cold", "warm")
        ],
    )
    print(f"package fetches by agents: {r['fetches']} (one per agent, none when warm)")
    print(
        f"warm packaging {r['warm_deploy_s'] * 1000:.1f} ms with deploy's package index "
        f"({r['warm_not_zipped']} not zipped), {r['rezip_deploy_s'] * 1000:.1f} ms zipping again"
    )
    path = write_json("runtime_env" + ("_smoke" if args.smoke else ""), r)
    print(f"wrote {shown(path)}")
    result_line(
        "runtime_env",
        agents=agents,
        size_mb=size,
        deploy_s=r["cold_deploy_s"],
        cold_s=r["cold_running_s"],
        warm_s=r["warm_running_s"],
        cold_over_warm=r["cold_running_s"] / r["warm_running_s"],
        warm_deploy_s=r["warm_deploy_s"],
        rezip_deploy_s=r["rezip_deploy_s"],
        warm_not_zipped=r["warm_not_zipped"],
        uploaded_first=r["cold_uploaded_bytes"],
        uploaded_again=r["warm_uploaded_bytes"],
        store_grew_first=r["cold_store_bytes"],
        fetches=r["fetches"],
    )


if __name__ == "__main__":
    main()

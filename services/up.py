"""`fleetpulse up`: the whole system on one machine, with a demo that shows what it does.

Without `--nats` it starts an embedded nats-server (JetStream on, temporary store). It then runs
a controller and a node agent in this process (the agent starts replicas as their own processes),
deploys the bundled demo app (or `--config app.yaml`) and, unless `--forever`, drives a load ramp
through a DeploymentHandle while a live status table shows the fleet react:

    scaled to zero -> first request wakes it -> load ramp scales up -> idle scales down to zero
    -> the next request wakes it again

and exits 0 when every step happened. Ctrl-C stops everything (replicas drain, no orphans).
Service logs go to a file (printed at start) so they do not tear up the table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from services.agent.config import AgentConfig, parse_resources, replica_auth
from services.agent.service import AgentService
from services.auth.embedded import EmbeddedAuth
from services.controller.core import ControllerConfig
from services.controller.service import ControllerService, ServiceConfig
from services.ops import packaging, pkgindex
from services.ops.status import Mirror, render_table
from services.proxy.config import ProxyConfig
from services.proxy.server import ProxyServer
from services.router.config import RouterConfig
from services.router.errors import RouterError
from services.router.handle import DeploymentHandle, connect_handle
from services.up_args import add_up_arguments
from shared import settings
from shared.appbuild import build_apps
from shared.appconfig import AppConfig, AutoscalingConfig, DeploymentConfig
from shared.errors import UsageError
from shared.kv.status import AppStatusView
from shared.kvfollow import follow
from shared.natsauth import REPLICA_ENV_PREFIX, NatsAuth, process_auth, set_process_auth
from shared.natsbus import NatsBus
from shared.natsserver import NatsServer
from shared.subjects import KV_APPS, KV_STATUS

__all__ = ["add_up_arguments", "run_up"]

log = logging.getLogger(__name__)

DEMO_APP = "demo"
DEMO_DEPLOYMENT = "Model"


def demo_app(quick: bool) -> AppConfig:
    policy = AutoscalingConfig(
        min_replicas=0,
        max_replicas=4,
        target_ongoing_requests=2,
        upscale_delay_s=1.0,
        downscale_delay_s=3.0 if quick else 6.0,
        downscale_to_zero_delay_s=3.0 if quick else 6.0,
        look_back_period_s=2.0,
        metrics_interval_s=0.5,
    )
    model = DeploymentConfig(
        name=DEMO_DEPLOYMENT,
        import_path="services.examples.model:Model",
        init_kwargs={"base_latency_s": 0.05, "contention": 0.5},
        max_ongoing_requests=6,
        health_check_period_s=2.0,
        health_check_timeout_s=5.0,
        graceful_shutdown_timeout_s=5.0,
        autoscaling=policy,
    )
    return AppConfig(DEMO_APP, (model,), route_prefix="/model", ingress=DEMO_DEPLOYMENT)


@dataclass
class DemoReport:
    steps: list[tuple[str, bool, str]] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    peak_replicas: int = 0

    def step(self, name: str, ok: bool, detail: str) -> None:
        self.steps.append((name, ok, detail))

    @property
    def ok(self) -> bool:
        return all(ok for _, ok, _ in self.steps)


class Stack:
    """The embedded server (optional), controller, agent and a client connection."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.server: NatsServer | None = None
        self.url: str = args.external_nats or ""
        self.tasks: list[asyncio.Task[None]] = []
        self.bus: NatsBus | None = None
        self.controller: ControllerService | None = None
        self.agent: AgentService | None = None
        self.proxy: ProxyServer | None = None
        self.auth = EmbeddedAuth() if getattr(args, "auth", False) else None

    async def start(self) -> None:
        if not self.url:
            conf = self.auth.write_server_config(self.workdir) if self.auth else None
            server = NatsServer(port=self.args.port, config_file=conf)
            self.server = await asyncio.to_thread(server.start)
            self.url = self.server.url
        if self.auth is not None:
            set_process_auth(self.auth.stack_auth)  # the in-process stack, trusted as before
            await self.auth.start(self.url)
        self.bus = await NatsBus.connect(self.url, name="fleetpulse-up")
        self.controller = ControllerService(
            ServiceConfig(nats_url=self.url, core=ControllerConfig(member_id="up"), rebuild_s=30.0)
        )
        self.agent = AgentService(
            AgentConfig(
                nats_url=self.url,
                agent_id="local",
                max_replicas=self.args.max_replicas,
                resources=parse_resources(self.args.resource),
                workdir=str(Path.cwd()),
                log_dir=str(self.workdir / "replicas"),
                replica_auth=replica_auth(
                    NatsAuth.from_env(prefix=REPLICA_ENV_PREFIX),
                    process_auth(),
                    minted=self.auth is not None,
                ),
                replica_key=self.auth.replica_key if self.auth else None,
                cache_dir=settings.AGENT_CACHE_DIR.resolve(None, os.environ),
            )
        )
        self.tasks = [
            asyncio.create_task(self.controller.run(), name="controller"),
            asyncio.create_task(self.agent.run(), name="agent"),
        ]
        front = settings.PROXY_FRONT.resolve(getattr(self.args, "front", None), os.environ)
        self.proxy = ProxyServer(
            self.bus,
            ProxyConfig(nats_url=self.url, port=_free_or(self.args.http_port), front=front),
        )
        await self.proxy.start()

    async def stop(self) -> None:
        if self.proxy is not None:
            with contextlib.suppress(Exception):
                await self.proxy.stop()
        if self.agent is not None:
            self.agent.stop()  # drains its replicas (SIGTERM, then SIGKILL after their grace)
        if self.controller is not None:
            self.controller._stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*self.tasks, return_exceptions=True), 30)
        if self.controller is not None:
            await self.controller.stop()
        if self.bus is not None:
            await self.bus.close()
        if self.auth is not None:
            await self.auth.stop()
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)


class StatusView:
    """Follows fp_apps and fp_status; renders the table with the demo's current step."""

    def __init__(self) -> None:
        self.mirror = Mirror()
        self.step = "starting"
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, bus: NatsBus) -> None:
        ready = asyncio.Event(), asyncio.Event()
        self._tasks = [
            asyncio.create_task(
                follow(
                    bus,
                    KV_STATUS,
                    AppStatusView.decode,
                    self.mirror.statuses,
                    self.mirror.bad,
                    ready[0],
                    live=True,
                )
            ),
            asyncio.create_task(
                follow(
                    bus,
                    KV_APPS,
                    AppConfig.from_json,
                    self.mirror.apps,
                    self.mirror.bad,
                    ready[1],
                    live=True,
                )
            ),
        ]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def deployment(self, app: str, dep: str) -> tuple[str, int, int]:
        st = self.mirror.statuses.get(app)
        d = st.deployments.get(dep) if st else None
        return (d.status, d.target_replicas, d.running_replicas) if d else ("", -1, -1)

    def render(self) -> Group:
        table = render_table(self.mirror.statuses, self.mirror.apps, time.time())
        return Group(Text(f"▶ {self.step}", style="bold cyan"), table)


async def wait_until(cond: Callable[[], bool], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if cond():
            return True
        await asyncio.sleep(0.2)
    return cond()


def _free_or(port: int) -> int:
    """`port` if it can be bound on loopback, else 0 (a free one): the demo must not fail
    because something else already serves on 8000."""
    import socket

    if port == 0:
        return 0
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return 0
    return port


async def http_call(url: str) -> tuple[int, str]:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.post(url, json={"x": 2.0}) as resp:
        return resp.status, await resp.text()


async def run_demo(
    handle: DeploymentHandle, view: StatusView, quick: bool, http_url: str = ""
) -> DemoReport:
    report = DemoReport()
    predict = handle.options(method="predict", deadline_s=60)

    def dep() -> tuple[str, int, int]:
        status, target, running = view.deployment(DEMO_APP, DEMO_DEPLOYMENT)
        report.peak_replicas = max(report.peak_replicas, running)
        return status, target, running

    view.step = "deployed with min_replicas 0: waiting for it to settle at zero"
    ok = await wait_until(lambda: dep()[0] == "HEALTHY" and dep()[1] == 0, 30)
    report.step("settled at zero", ok, "HEALTHY with 0 replicas (still reachable)")

    async def one_call() -> float:
        t0 = time.monotonic()
        await predict.remote(1.0)
        return time.monotonic() - t0

    view.step = "first request: it waits while the deployment wakes from zero"
    try:
        cold = await one_call()
        report.step("woke from zero", True, f"first request answered after {cold:.1f} s")
    except RouterError as exc:
        report.step("woke from zero", False, str(exc))

    ramp_s, peak = (8.0, 10) if quick else (20.0, 16)
    view.step = f"load ramp: 1 -> {peak} concurrent callers over {ramp_s:.0f} s"
    stop = asyncio.Event()

    async def caller(start_after: float) -> None:
        await asyncio.sleep(start_after)
        while not stop.is_set():
            try:
                report.latencies.append(await one_call())
            except RouterError:
                report.errors += 1
                await asyncio.sleep(0.1)

    callers = [asyncio.create_task(caller(i * ramp_s / peak)) for i in range(peak)]
    grew = await wait_until(lambda: dep()[2] >= 3, ramp_s + 20)
    await asyncio.sleep(2.0)
    stop.set()
    await asyncio.gather(*callers)
    report.step("scaled up under load", grew, f"peak {report.peak_replicas} replicas")

    view.step = "idle: scaling down, then to zero"
    zero = await wait_until(lambda: dep()[1] == 0 and dep()[2] == 0, 60 if quick else 90)
    report.step("scaled to zero when idle", zero, f"status {dep()[0]} with {dep()[2]} replicas")

    view.step = "a request at zero: woken again"
    try:
        again = await one_call()
        report.step("woke again", True, f"answered after {again:.1f} s")
    except RouterError as exc:
        report.step("woke again", False, str(exc))
    if http_url:
        view.step = f"an HTTP request through the ingress: POST {http_url}"
        try:
            status, body = await http_call(http_url)
            report.step("answered over HTTP", status == 200, f"{status} {body[:60]}")
        except Exception as exc:  # the demo reports, it does not crash
            report.step("answered over HTTP", False, f"{type(exc).__name__}: {exc}")
    view.step = "demo finished"
    return report


def print_report(console: Console, report: DemoReport) -> None:
    console.print()
    for name, ok, detail in report.steps:
        mark = "[green]✔[/green]" if ok else "[red]✘[/red]"
        console.print(f" {mark} {name}: {detail}")
    if report.latencies:
        lat = sorted(report.latencies)
        p50 = statistics.median(lat) * 1000
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000
        console.print(
            f"   {len(lat)} requests under load, p50 {p50:.0f} ms, p99 {p99:.0f} ms, "
            f"{report.errors} errors"
        )


async def run_up_async(args: argparse.Namespace, console: Console) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="fleetpulse-up-"))
    _log_to_file(workdir / "fleetpulse.log")
    apps = build_apps(args.config) if args.config else [demo_app(args.quick)]
    stack = Stack(args, workdir)
    view = StatusView()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    code = 0
    report: DemoReport | None = None
    try:
        console.print("[bold]fleetpulse up[/bold]: starting NATS, controller and agent ...")
        await stack.start()
        assert stack.bus is not None
        console.print(f"  NATS:  {stack.url}   (services and callers connect here)")
        if stack.auth is not None:
            console.print(
                "  auth:  callout on: each replica has its own credential; other clients log "
                "in as a role (FP_{ROLE}_PASSWORD)"
            )
        assert stack.proxy is not None
        console.print(f"  HTTP:  {stack.proxy.url}   (apps by route prefix, e.g. POST /model)")
        console.print(
            f"  logs:  {workdir / 'fleetpulse.log'}  (replica logs in {workdir / 'replicas'})"
        )
        if packaging.unresolved(apps):  # code shipped with the apps: into the object store
            limit = settings.DEPLOY_MAX_PACKAGE_MB.resolve(None, os.environ) << 20
            packager = packaging.Packager(
                packaging.store_of(stack.bus, create=True),
                limit=limit,
                index=pkgindex.PackageIndex(pkgindex.default_path()),
            )
            apps = await packaging.resolve_apps(apps, packager)
            console.print(f"  {packaging.describe(packager.stats)}")
        kv = await stack.bus.kv(KV_APPS)
        for app in apps:
            await kv.put(app.name, app.to_json())
            console.print(f"  deployed {app.name} ({len(app.deployments)} deployment(s))")
        await view.start(stack.bus)
        with (
            Live(view.render(), console=console, refresh_per_second=4, transient=False)
            if not args.no_live
            else contextlib.nullcontext() as live
        ):
            refresher = asyncio.create_task(_refresh(view, live, console, args.no_live))
            try:
                if not args.config:
                    handle = await connect_handle(
                        DEMO_APP,
                        DEMO_DEPLOYMENT,
                        bus=stack.bus,
                        config=RouterConfig(metrics_interval_s=0.5),
                    )
                    http_url = f"{stack.proxy.url.rstrip('/')}/model"
                    demo = asyncio.create_task(run_demo(handle, view, args.quick, http_url))
                    done, _ = await asyncio.wait(
                        {demo, asyncio.create_task(stop.wait())},
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                    if demo in done:
                        report = demo.result()
                        code = 0 if report.ok else 1
                    else:
                        demo.cancel()
                        code = 130
                    await handle.close()
                if args.forever or args.config:
                    view.step = "serving (Ctrl-C to stop)"
                    await stop.wait()
            finally:
                refresher.cancel()
                await asyncio.gather(refresher, return_exceptions=True)
        if report is not None:
            print_report(console, report)
    finally:
        console.print("stopping: draining replicas, stopping agent and controller ...")
        await view.stop()
        await stack.stop()
        console.print("stopped.")
    return code


async def _refresh(view: StatusView, live: Live | None, console: Console, plain: bool) -> None:
    last = ""
    while True:
        if live is not None:
            live.update(view.render())
        elif plain:
            status, target, running = view.deployment(DEMO_APP, DEMO_DEPLOYMENT)
            line = f"{view.step} | {DEMO_DEPLOYMENT}: {status} target={target} running={running}"
            if line != last:
                console.print(line)
                last = line
        await asyncio.sleep(0.25)


def _log_to_file(path: Path) -> None:
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def run_up(args: argparse.Namespace) -> int:
    if getattr(args, "auth", False) and args.external_nats:
        raise UsageError(
            "--auth configures the embedded server; for your own server run `fleetpulse auth` "
            "and give it an auth_callout block (docs/operations.md)"
        )
    return asyncio.run(run_up_async(args, Console()))

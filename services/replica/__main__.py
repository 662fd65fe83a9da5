"""`python -m services.replica` / `fleetpulse replica`: run one replica process until SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Coroutine
from typing import Any

from fleetpulse.serve import context as serve_context
from fleetpulse.serve.handle import DeploymentHandle
from shared import aioloop, memtrim, settings
from shared.bus import Bus
from shared.leanimport import defer_module, import_deferred
from shared.metrics_catalog import serve_metrics
from shared.natsauth import process_auth
from shared.natsbus import NatsBus
from shared.replicahttp import route_prefix_of
from shared.signals import on_stop_signals
from shared.startup import retrying
from shared.subjects import Subjects

from . import logsetup
from .config import ReplicaConfig, add_replica_arguments, config_from_args
from .runtime import ReplicaRuntime
from .user_config import UserConfigFollower
from .usercode import UserDeployment, load_target

log = logging.getLogger(__name__)


async def serve(cfg: ReplicaConfig) -> int:
    spec = cfg.spec
    try:
        extra = logsetup.apply(
            spec.logging_config, app=cfg.app, deployment=cfg.deployment, replica_id=cfg.replica_id
        )
    except OSError as exc:  # a log file must not stop a replica from serving
        log.warning("replica %s: logging_config.logs_dir not usable: %s", cfg.replica_id, exc)
    else:
        if extra is not None:
            log.info("replica %s: also logging to %s", cfg.replica_id, extra)
    target = load_target(spec.import_path)  # a bad import path fails before anything connects
    bus = await connect(cfg)
    follower: asyncio.Task[None] | None = None
    trimmer: asyncio.Task[None] | None = None
    try:
        user = await create_user(cfg, bus, target)
        route_prefix = route_prefix_of(os.environ)  # set for an ingress's replicas only
        runtime = ReplicaRuntime(cfg, bus, user, serves_http=route_prefix is not None)
        try:
            serve_metrics(cfg.metrics_port, f"replica {cfg.replica_id}")
        except OSError as exc:  # serving requests matters more than being scraped
            log.warning(
                "replica %s: no metrics on port %d: %s", cfg.replica_id, cfg.metrics_port, exc
            )
        stop = asyncio.Event()
        with on_stop_signals(stop.set):  # also while draining: a second signal waits for it
            try:
                if route_prefix is None:
                    await runtime.start()
                else:
                    await runtime.start(lambda: serve_http(cfg, runtime, user, route_prefix))
            except Exception:  # e.g. the HTTP server did not start: say "exited", then fail
                await runtime.stop(exit_code=1)
                raise
            trimmer = asyncio.create_task(idle_trim(runtime), name="idle_trim")
            if user.has_reconfigure:
                follow = UserConfigFollower(
                    bus, user, cfg.app, cfg.deployment, cfg.version, spec.user_config
                )
                follower = asyncio.create_task(follow.run(), name="user_config")
            await stop.wait()
            log.info("replica %s: signal received, draining", cfg.replica_id)
            await runtime.drain()
    finally:
        for task in (follower, trimmer):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        serve_context._leave()
        await bus.close()
    return 0


def idle_trim(runtime: ReplicaRuntime) -> Coroutine[Any, Any, None]:
    """Free heap back to the kernel once the replica goes idle after serving (shared/memtrim.py):
    what a burst of requests left in malloc's free lists would stay resident otherwise.
    Activity is every request that asked to run (NATS or HTTP, admitted or refused)."""
    stats, admission = runtime.stats, runtime.admission
    return memtrim.run_idle_trim(lambda: stats.admitted + stats.rejected, lambda: admission.ongoing)


async def serve_http(
    cfg: ReplicaConfig, runtime: ReplicaRuntime, user: UserDeployment, route_prefix: str
) -> str:
    """Start this replica's own HTTP server (http_server.py); returns the address it announces.
    Imported here: only an ingress's replicas load uvicorn."""
    import_uvicorn_lean()
    from .asgi import build_asgi_app
    from .http_server import AdmissionGate, ReplicaHttpServer

    env = os.environ
    host = settings.REPLICA_HTTP_HOST.resolve(None, env)
    app = AdmissionGate(build_asgi_app(user, route_prefix=route_prefix), runtime)
    server = ReplicaHttpServer(
        app,
        host=host,
        advertise=settings.REPLICA_HTTP_ADVERTISE.resolve(None, env) or host,
        graceful_timeout_s=cfg.spec.graceful_shutdown_timeout_s,
    )
    address = await server.start()
    runtime.drain_also.append(server.drain)
    return address


def import_uvicorn_lean() -> bool:
    """uvicorn's Config and Server without the package's `__init__` until another name of it is
    used (shared/leanimport.py; then with watchfiles hidden, as http_server.py imports it): its
    command line (click) and reload supervisors (multiprocessing) stay out, 1.4 MB less
    resident in an ingress replica; and logging.config, which uvicorn.config imports for a
    log_config the replica does not give (http_server.py), until it is used: 0.7 MB more.
    False when uvicorn was imported already."""
    if "uvicorn" in sys.modules:
        return False
    defer_module("logging.config")
    return import_deferred(
        "uvicorn",
        ["uvicorn.config", "uvicorn.server"],
        names={"Config": "uvicorn.config", "Server": "uvicorn.server"},
        hide=["watchfiles"],
    )


async def connect(cfg: ReplicaConfig) -> NatsBus:
    """With a credential file (the auth callout), a refused or unanswered connect is retried
    until it gets in: the auth service may be down for a while, and a replica that gave up
    would be replaced only to wait the same way. Otherwise the first failure is final."""
    name = f"replica-{cfg.replica_id}"
    if process_auth().token_file is None:
        return await NatsBus.connect(cfg.nats_url, name=name)
    return await retrying(
        "connect to NATS", lambda: NatsBus.connect(cfg.nats_url, name=name), asyncio.Event(), log
    )


async def create_user(cfg: ReplicaConfig, bus: Bus, target: object) -> UserDeployment:
    """The user's object, constructed inside the replica context (fleetpulse.serve): handles
    for the bound deployments among its arguments, its user_config given to reconfigure()."""
    loop = asyncio.get_running_loop()
    subjects = Subjects(cfg.namespace)
    context = serve_context.ReplicaContext(cfg.app, cfg.deployment, cfg.replica_id)
    serve_context._enter(context, bus, loop, subjects)

    def handle(name: str) -> DeploymentHandle:
        return DeploymentHandle._connect(cfg.app, name, bus, loop, subjects)

    spec = cfg.spec
    user = await UserDeployment.create(
        spec.import_path,
        spec.init_args,
        dict(spec.init_kwargs),
        target=target,
        handles=handle,
        user_config=spec.user_config,
    )
    serve_context._set_servable(user.instance)
    return user


def run_from_args(args: argparse.Namespace) -> int:
    return run(serve(config_from_args(args)))


def run(main: Coroutine[Any, Any, int]) -> int:
    """On uvloop where it is installed (the HTTP server and nats-py both run on it: measured in
    docs/dataplane.md), else on asyncio's own loop (shared/aioloop.py, as every service)."""
    return aioloop.run(main)


def main() -> int:
    from shared.cliargs import standalone_main

    return standalone_main(
        "python -m services.replica", __doc__, add_replica_arguments, run_from_args
    )


if __name__ == "__main__":
    sys.exit(main())

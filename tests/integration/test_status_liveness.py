"""`fleetpulse status` tells a looked-after app from an orphaned one by the group's lease, not by
the status's age: the controller no longer rewrites unchanged statuses.

A real controller process looks after a deployed app: `status --json` says `stale: false`, and
its status is not rewritten while nothing changes. The controller is killed (SIGKILL: no clean
hand-over, its member entry left to expire): the same status now reads `stale: true`, its owner
gone. A new controller takes the partition over at a new epoch, writes the status once, and the
app is looked after again.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from services.ops.deploy import run_deploy
from services.ops.status import run_status
from shared.bus import Bus
from shared.kv.status import AppStatusView
from shared.natsbus import NatsBus
from shared.subjects import KV_STATUS
from tests.procs import ServiceProcesses
from tests.waiting import eventually

CONNECT_TIMEOUT_S = 2.0

APP_YAML = """\
applications:
  - name: quiet
    route_prefix: /quiet
    deployments:
      - name: Echo
        import_path: services.examples.echo:Echo
        num_replicas: 1
"""
GONE_S = 30.0
"""Generous: the killed member's entry expires after 2 x its member TTL (4 s by default)."""


@pytest.fixture
async def client(nats_url: str) -> AsyncIterator[Bus]:
    bus = await NatsBus.connect(nats_url, name="test")
    try:
        yield bus
    finally:
        await bus.close()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[ServiceProcesses]:
    p = ServiceProcesses()
    try:
        yield p
    finally:
        p.stop_all(timeout=15)
        for log in sorted(tmp_path.glob("*.log")):  # shown by pytest only when the test fails
            print(f"--- {log.name} (tail)\n" + "\n".join(log.read_text().splitlines()[-30:]))


def controller(procs: ServiceProcesses, url: str, member: str, tmp: Path) -> Any:
    return procs.start(
        ["-m", "services.cli", "controller", "--nats", url, "--member-id", member],
        log=tmp / f"{member}.log",
    )


def cli_args(url: str, **kw: Any) -> argparse.Namespace:
    return argparse.Namespace(nats=url, connect_timeout=CONNECT_TIMEOUT_S, **kw)


async def status_doc(url: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    args = cli_args(url, app=None, json=True, watch=False, interval=1.0, duration=None)
    capsys.readouterr()
    assert await asyncio.to_thread(run_status, args) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


async def test_status_judges_liveness_by_the_lease_through_a_kill_and_a_takeover(
    nats_url: str,
    client: Bus,
    procs: ServiceProcesses,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "app.yaml").write_text(APP_YAML)
    deploy = cli_args(nats_url, file=str(tmp_path / "app.yaml"), dry_run=False)
    assert await asyncio.to_thread(run_deploy, deploy) == 0
    first = controller(procs, nats_url, "c1", tmp_path)
    statuses = await client.kv(KV_STATUS)

    async def quiet() -> dict[str, Any] | None:
        app = (await status_doc(nats_url, capsys))["applications"].get("quiet", {})
        return app if app.get("stale") is False else None

    shown = await eventually(quiet, 60, "the app looked after by c1")
    assert "stale_reason" not in shown
    entry = await statuses.get("quiet")
    assert entry is not None
    view = AppStatusView.decode(entry.value)
    assert view.partition is not None and view.owner_epoch >= 1

    # nothing changes (no agent: the replica waits for room): the status is not rewritten, and
    # it stays looked after however old it gets
    await asyncio.sleep(5.0)  # a span to observe, not a wait for a condition
    again = await statuses.get("quiet")
    assert again is not None and again.revision == entry.revision
    assert (await status_doc(nats_url, capsys))["applications"]["quiet"]["stale"] is False

    # a live watch sees the same change: the group is read again at each refresh (an expired
    # member entry is never announced to a watch)
    watch_log = tmp_path / "watch.log"
    procs.start(
        ["-m", "services.cli", "status", "--nats", nats_url, "--watch", "--json",
         "--interval", "0.2", "--duration", "120"],
        log=watch_log,
    )  # fmt: skip

    def watched() -> list[dict[str, Any]]:
        lines = watch_log.read_text().splitlines() if watch_log.exists() else []
        return [json.loads(line) for line in lines if line.startswith("{")]

    def watched_stale(stale: bool) -> bool:
        return any(d["applications"].get("quiet", {}).get("stale") is stale for d in watched())

    await eventually(lambda: watched_stale(False), 30, "the watch's first document")
    first.send_signal(signal.SIGKILL)
    first.wait(10)

    async def orphaned() -> str | None:
        app = (await status_doc(nats_url, capsys))["applications"]["quiet"]
        return str(app["stale_reason"]) if app.get("stale") else None

    why = await eventually(orphaned, GONE_S, "the status marked stale once c1's entry expired")
    assert why == f"partition {view.partition}'s owner c1 is gone"
    await eventually(lambda: watched_stale(True), GONE_S, "the watch marking the status stale")

    controller(procs, nats_url, "c2", tmp_path)
    await eventually(quiet, 60, "the app looked after by c2 after its takeover")
    taken = await statuses.get("quiet")
    assert taken is not None
    assert AppStatusView.decode(taken.value).owner_epoch > view.owner_epoch

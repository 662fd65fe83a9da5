"""A controller that starts before JetStream is usable waits for it instead of exiting."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

from services.controller.group_shell import KV_LEASES
from shared.natsbus import NatsBus
from shared.natsserver import NatsServer, free_ports
from tests.procs import ServiceProcesses


async def test_controller_waits_for_jetstream_then_joins(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    log = tmp_path / "controller.log"
    procs = ServiceProcesses()
    bare = NatsServer(port=port, jetstream=False).start()
    full: NatsServer | None = None
    try:
        proc = procs.start(
            ["-m", "services.cli", "controller", "--nats", bare.url, "--member-id", "c1"], log=log
        )
        deadline = time.monotonic() + 20
        while "retrying" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, "the controller exited:\n" + log.read_text()
            await asyncio.sleep(0.1)
        assert "could not set up streams and buckets" in log.read_text(), log.read_text()

        # the same address, now with JetStream: it reconnects and joins the group
        bare.stop()
        full = NatsServer(port=port).start()
        bus = await NatsBus.connect(full.url, name="test")
        try:
            owners: set[str] = set()
            deadline = time.monotonic() + 30
            while owners != {"c1"} and time.monotonic() < deadline:
                assert proc.poll() is None, "the controller exited:\n" + log.read_text()
                try:
                    kv = await bus.kv(KV_LEASES, create=False)
                    entries = [await kv.get(k) for k in await kv.keys()]
                    owners = {json.loads(e.value)["owner"] for e in entries if e is not None}
                except Exception:
                    owners = set()
                await asyncio.sleep(0.2)
            assert owners == {"c1"}, log.read_text()
        finally:
            await bus.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        procs.stop_all()
        bare.stop()
        if full is not None:
            full.stop()

"""Deploy and delete records (KV fp_audit, shared/kv/audit.py): written after each change to
fp_apps by `fleetpulse deploy`/`delete`, read by `fleetpulse audit`.

A change whose record cannot be written is reported as an error (exit 1) after the change: the
app is deployed, and the operator learns that its record is missing rather than nothing.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import socket
import time
from collections.abc import Mapping

from services.ops import EXIT_OK, add_connect_timeout, connect, run_command
from shared.bus import Bus
from shared.errors import WireError
from shared.kv import buckets, envelope
from shared.kv.audit import ANONYMOUS, AuditRecord
from shared.kvfollow import existing_kv
from shared.natsauth import process_auth


def _client() -> str:
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except (OSError, KeyError):  # no passwd entry for the uid (a container's)
        return f"uid{os.getuid()}@{socket.gethostname()}"


async def record(
    bus: Bus, action: str, app: str, revision: int, versions: Mapping[str, str] | None = None
) -> AuditRecord:
    """Write one record under this process's NATS user; BusError when the server refuses."""
    rec = AuditRecord(
        action=action,
        app=app,
        user=process_auth().user or ANONYMOUS,
        at=time.time(),
        revision=revision,
        versions=dict(versions or {}),
        client=_client(),
    )
    kv = await buckets.open_bucket(bus, buckets.AUDIT)
    await kv.put(rec.key, envelope.encode(rec))
    return rec


async def read_records(bus: Bus, app: str | None = None) -> list[AuditRecord]:
    """Every record kept (each key's history), oldest first; undecodable ones are skipped."""
    kv = await existing_kv(bus, buckets.AUDIT.name)
    if kv is None:
        return []
    watcher = await kv.watch(f"*.{app}" if app else ">", include_history=True)
    out: list[AuditRecord] = []
    try:
        async for entry in watcher:
            if entry is None:
                break
            if entry.op != "PUT":
                continue
            try:
                out.append(envelope.decode(entry.value, AuditRecord))
            except WireError:
                continue  # not ours to fix here; the reader shows what it can
    finally:
        await watcher.stop()
    return sorted(out, key=lambda r: (r.at, r.app))


def add_audit_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--app", help="only this application's records")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    add_connect_timeout(p)


def render(rec: AuditRecord) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(rec.at))
    versions = ", ".join(f"{d}={v}" for d, v in sorted(rec.versions.items()))
    what = (
        f"{rec.action:6} {rec.app} (revision {rec.revision}{'; ' + versions if versions else ''})"
    )
    return f"{when}  {rec.user:10} {what}  [{rec.client}]"


def run_audit(args: argparse.Namespace) -> int:
    async def main() -> int:
        bus = await connect(args, "fleetpulse-audit")
        try:
            records = await read_records(bus, args.app)
        finally:
            await bus.close()
        for rec in records:
            print(
                json.dumps({"v": 1, "kind": rec.KIND, **rec.to_doc()}) if args.json else render(rec)
            )
        if not records and not args.json:
            print("no deploy or delete recorded" + (f" for {args.app}" if args.app else ""))
        return EXIT_OK

    return run_command("audit", main)

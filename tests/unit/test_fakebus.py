"""What only the fake promises (flush semantics, determinism, fake-clock TTL) and the shared
bus helpers. The Bus contract itself is tests/integration/test_bus_contract.py."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import pytest

from shared.bus import (
    HandlerGuard,
    KVEntry,
    Msg,
    RateLimiter,
    Subscription,
    subject_matches,
    validate_key,
    validate_subject,
)
from shared.clock import FakeClock
from shared.errors import BusError, BusTimeout, UsageError
from shared.fakebus import FakeBus, FakeServer


@pytest.fixture
def server() -> FakeServer:
    return FakeServer()


@pytest.mark.parametrize(
    ("pattern", "subject", "expected"),
    [
        ("a.b", "a.b", True),
        ("a.b", "a.c", False),
        ("a.*", "a.b", True),
        ("a.*", "a.b.c", False),
        ("a.*", "a", False),
        ("a.>", "a.b.c", True),
        ("a.>", "a", False),
        (">", "x", True),
        ("*.b.>", "a.b.c", True),
        ("*.b.>", "a.c.c", False),
        ("a.b.c", "a.b", False),
    ],
)
def test_subject_matches_like_nats(pattern: str, subject: str, expected: bool) -> None:
    assert subject_matches(pattern, subject) is expected


def test_validation() -> None:
    validate_subject("fp.v1.report.>", wildcards=True)
    validate_key("fp.app-1/x=y_z")
    validate_key("apps.*", pattern=True)
    for bad in ("a.", ".a", "a b", "a*"):
        with pytest.raises(UsageError):
            validate_key(bad)


def test_rate_limiter_uses_the_clock() -> None:
    clock = FakeClock()
    limiter = RateLimiter(1.0, clock)
    assert limiter.allow() and not limiter.allow()
    clock.advance(0.99)
    assert not limiter.allow()
    clock.advance(0.01)
    assert limiter.allow()


async def test_handler_guard_logs_again_after_the_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()

    async def boom(msg: Msg) -> None:
        raise RuntimeError("boom")

    guard = HandlerGuard("s", boom, clock)
    with caplog.at_level(logging.ERROR, logger="shared.bus"):
        await guard(Msg("s", b""))
        await guard(Msg("s", b""))
        clock.advance(1.0)
        await guard(Msg("s", b""))
    assert guard.errors == 3
    assert len([r for r in caplog.records if r.name == "shared.bus"]) == 2


async def test_flush_waits_until_handlers_finish(server: FakeServer) -> None:
    a, b = server.connect(), server.connect()
    done: list[bytes] = []

    async def slow(msg: Msg) -> None:
        await asyncio.sleep(0.01)
        done.append(msg.data)

    await b.subscribe("s", slow)
    for i in range(3):
        await a.publish("s", bytes([i]))
    assert done == []  # delivery is asynchronous
    await a.flush()
    assert done == [b"\x00", b"\x01", b"\x02"]


async def test_flush_inside_a_handler_does_not_wait_for_itself(server: FakeServer) -> None:
    bus = server.connect()
    flushed = asyncio.Event()

    async def handler(msg: Msg) -> None:
        await bus.flush(timeout=1)
        flushed.set()

    await bus.subscribe("s", handler)
    await bus.publish("s", b"")
    await bus.flush()
    assert flushed.is_set()


async def test_flush_times_out_on_a_stuck_handler(server: FakeServer) -> None:
    bus = server.connect()
    release = asyncio.Event()

    async def stuck(msg: Msg) -> None:
        await release.wait()

    await bus.subscribe("s", stuck)
    await bus.publish("s", b"")
    with pytest.raises(BusTimeout):
        await bus.flush(timeout=0.05)
    release.set()
    await bus.flush()


async def test_queue_group_is_round_robin(server: FakeServer) -> None:
    bus = server.connect()
    got: dict[str, list[int]] = {"x": [], "y": []}

    def member(name: str) -> Callable[[Msg], Awaitable[None]]:
        async def handle(msg: Msg) -> None:
            got[name].append(msg.data[0])

        return handle

    await bus.subscribe("q", member("x"), queue="g")
    await bus.subscribe("q", member("y"), queue="g")
    for i in range(6):
        await bus.publish("q", bytes([i]))
    await bus.flush()
    assert got == {"x": [0, 2, 4], "y": [1, 3, 5]}
    assert server.interest("q") == 2 and server.interest("other") == 0


async def test_unsubscribe_from_own_handler_drops_the_rest(server: FakeServer) -> None:
    bus = server.connect()
    seen: list[bytes] = []
    subs: list[Subscription] = []

    async def once(msg: Msg) -> None:
        seen.append(msg.data)
        await subs[0].unsubscribe()

    subs.append(await bus.subscribe("s", once))
    for data in (b"1", b"2", b"3"):
        await bus.publish("s", data)
    await bus.flush()
    assert seen == [b"1"]
    assert server.interest("s") == 0


async def test_close_cancels_stuck_handlers_and_refuses_work(server: FakeServer) -> None:
    bus = server.connect()
    cancelled = asyncio.Event()

    async def forever(msg: Msg) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    await bus.subscribe("s", forever)
    await bus.publish("s", b"")
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    await bus.close()
    assert cancelled.is_set()
    assert server.interest("s") == 0
    for op in (bus.publish("s", b""), bus.flush(), bus.kv("b")):
        with pytest.raises(BusError):
            await op
    await bus.close()


async def test_published_headers_are_copied(server: FakeServer) -> None:
    bus = server.connect()
    got: list[Msg] = []

    async def keep(msg: Msg) -> None:
        got.append(msg)

    await bus.subscribe("s", keep)
    headers = {"A": "1"}
    await bus.publish("s", b"", headers=headers)
    headers["A"] = "changed"
    await bus.flush()
    assert got[0].headers == {"A": "1"}


async def test_kv_ttl_follows_the_server_clock() -> None:
    clock = FakeClock()
    bus = FakeServer(clock=clock).connect()
    kv = await bus.kv("agents", ttl=10)
    r1 = await kv.put("a1", b"cap")
    clock.advance(5)
    await kv.put("a2", b"cap")
    clock.advance(5)
    assert await kv.get("a1") is None  # expired at 10 s
    assert await kv.keys() == ["a2"]
    assert await kv.create("a1", b"back") > r1  # revisions never go back
    clock.advance(10)
    assert await kv.keys() == []


async def test_kv_history_keeps_the_newest_revisions(server: FakeServer) -> None:
    kv = await server.connect().kv("h", history=2)
    revs = [await kv.put("k", bytes([i])) for i in range(3)]
    watcher = await kv.watch(include_history=True)
    it = aiter(watcher)
    assert await anext(it) == KVEntry("h", "k", b"\x01", revs[1], "PUT")
    assert await anext(it) == KVEntry("h", "k", b"\x02", revs[2], "PUT")
    assert await anext(it) is None


async def test_watcher_stop_ends_iteration_and_close_stops_watchers(server: FakeServer) -> None:
    writer: FakeBus = server.connect()
    reader: FakeBus = server.connect()
    kv = await writer.kv("w")
    watcher = await (await reader.kv("w")).watch()
    await kv.put("k", b"queued")  # queued, but stop() wins
    await watcher.stop()
    assert [e async for e in watcher] == []
    other = await (await reader.kv("w")).watch()
    await reader.close()
    assert [e async for e in other] == []

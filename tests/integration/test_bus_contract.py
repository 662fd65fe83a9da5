"""The Bus contract: every test runs on the in-memory fake and on a real nats-server.

With NATS, interest from another connection is known to the server only after that connection
flushes, so tests flush the subscriber before publishing, and wait for deliveries with a
deadline instead of assuming synchronous delivery.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import pytest

from shared.bus import Bus, KVEntry, KVWatcher, MaxPayloadExceeded, Msg
from shared.errors import BusError, BusTimeout, KVConflict, NoResponders, UsageError
from shared.natsbus import NatsBus
from tests import waiting
from tests.conftest import BusFactory

WAIT_S = 5.0


class Inbox:
    """A handler that queues what it gets."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Msg] = asyncio.Queue()

    async def __call__(self, msg: Msg) -> None:
        self.queue.put_nowait(msg)

    async def get(self) -> Msg:
        return await asyncio.wait_for(self.queue.get(), WAIT_S)

    async def take(self, n: int) -> list[Msg]:
        got: list[Msg] = []
        try:
            for _ in range(n):
                got.append(await self.get())
        except TimeoutError:
            raise AssertionError(f"got {len(got)} of {n} messages in time: {got}") from None
        return got


async def eventually(cond: Callable[[], bool], within: float = WAIT_S) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


async def next_entry(watcher: KVWatcher) -> KVEntry | None:
    return await asyncio.wait_for(anext(aiter(watcher)), WAIT_S)


def responder(bus: Bus, reply: Callable[[Msg], bytes]) -> Callable[[Msg], Awaitable[None]]:
    async def handle(msg: Msg) -> None:
        assert msg.reply is not None
        await bus.publish(msg.reply, reply(msg))

    return handle


# -- pub/sub ----------------------------------------------------------------------------------


async def test_publish_reaches_subscriber_in_order(bus_factory: BusFactory) -> None:
    pub, sub_conn = await bus_factory(), await bus_factory()
    inbox = Inbox()
    await sub_conn.subscribe("t.order", inbox)
    await sub_conn.flush()
    for i in range(20):
        await pub.publish("t.order", str(i).encode())
    got = await inbox.take(20)
    assert [m.data for m in got] == [str(i).encode() for i in range(20)]
    assert all(m.subject == "t.order" and m.reply is None for m in got)


async def test_wildcard_subscriptions(bus: Bus) -> None:
    star, tail = Inbox(), Inbox()
    await bus.subscribe("w.*", star)
    await bus.subscribe("w.>", tail)
    for subject in ("w.a", "w.a.b", "x.a", "w"):
        await bus.publish(subject, b"")
    await bus.publish("w.end", b"")
    assert [m.subject for m in await star.take(2)] == ["w.a", "w.end"]
    assert [m.subject for m in await tail.take(3)] == ["w.a", "w.a.b", "w.end"]


async def test_unsubscribe_stops_delivery(bus: Bus) -> None:
    gone, stays = Inbox(), Inbox()
    sub = await bus.subscribe("u.x", gone)
    await bus.subscribe("u.x", stays)
    await bus.publish("u.x", b"1")
    await gone.get()
    await sub.unsubscribe()
    await sub.unsubscribe()  # twice is fine
    await bus.publish("u.x", b"2")
    await stays.take(2)
    await bus.flush()
    assert gone.queue.empty()


async def test_queue_group_delivers_each_message_to_exactly_one_member(
    bus_factory: BusFactory,
) -> None:
    pub = await bus_factory()
    members = [Inbox(), Inbox()]
    plain = Inbox()
    for inbox in members:
        conn = await bus_factory()
        await conn.subscribe("q.work", inbox, queue="workers")
        await conn.flush()
    await pub.subscribe("q.work", plain)
    total = 100
    for i in range(total):
        await pub.publish("q.work", str(i).encode())
    assert len(await plain.take(total)) == total  # a plain subscriber gets everything
    await eventually(lambda: sum(m.queue.qsize() for m in members) >= total)
    await pub.flush()
    got = [[m.data for m in await inbox.take(inbox.queue.qsize())] for inbox in members]
    assert sorted(got[0] + got[1], key=int) == [str(i).encode() for i in range(total)]
    assert got[0] and got[1]


async def test_handler_exception_does_not_kill_subscription(
    bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[bytes] = []

    async def flaky(msg: Msg) -> None:
        seen.append(msg.data)
        if msg.data != b"ok":
            raise ValueError("boom")

    sub = await bus.subscribe("h.x", flaky)
    with caplog.at_level(logging.ERROR, logger="shared.bus"):
        for data in (b"bad1", b"bad2", b"bad3", b"ok"):
            await bus.publish("h.x", data)
        await eventually(lambda: len(seen) == 4)
    assert seen == [b"bad1", b"bad2", b"bad3", b"ok"]
    assert sub.handler_errors == 3
    failures = [r for r in caplog.records if r.name == "shared.bus" and "failed" in r.message]
    assert len(failures) == 1  # rate-limited: one line per second per subscription


async def test_publish_nowait_keeps_order_with_publish(bus_factory: BusFactory) -> None:
    pub, sub_conn = await bus_factory(), await bus_factory()
    inbox = Inbox()
    await sub_conn.subscribe("t.nowait", inbox)
    await sub_conn.flush()
    for i in range(30):
        if i % 3:
            pub.publish_nowait("t.nowait", str(i).encode())
        else:
            await pub.publish("t.nowait", str(i).encode())
    got = await inbox.take(30)
    assert [m.data for m in got] == [str(i).encode() for i in range(30)]


async def test_publish_nowait_checks_like_publish(bus_factory: BusFactory) -> None:
    bus = await bus_factory()
    with pytest.raises(UsageError):
        bus.publish_nowait("bad..subject", b"x")
    with pytest.raises(UsageError):
        bus.publish_nowait("t.*", b"x")
    with pytest.raises(MaxPayloadExceeded):
        bus.publish_nowait("t.big", b"x" * (bus.max_payload + 1))
    await bus.close()
    with pytest.raises(BusError):
        bus.publish_nowait("t.closed", b"x")


async def test_inline_subscription_in_order_guarded_with_headers(
    bus_factory: BusFactory, caplog: pytest.LogCaptureFixture
) -> None:
    pub, sub_conn = await bus_factory(), await bus_factory()
    seen: list[Msg] = []

    def handler(msg: Msg) -> None:
        seen.append(msg)
        if msg.data == b"3":
            raise ValueError("boom")

    sub = await sub_conn.subscribe_inline("t.inline", handler)
    await sub_conn.flush()
    with caplog.at_level(logging.ERROR, logger="shared.bus"):
        for i in range(10):
            await pub.publish("t.inline", str(i).encode(), reply="t.back" if i == 5 else None)
        await pub.publish("t.inline", b"h", headers={"Fp-Trace": "abc"})
        await eventually(lambda: len(seen) == 11)
    assert [m.data for m in seen] == [str(i).encode() for i in range(10)] + [b"h"]
    assert seen[5].reply == "t.back" and seen[4].reply is None
    assert seen[10].headers is not None and seen[10].headers["Fp-Trace"] == "abc"
    assert sub.handler_errors == 1  # counted, and the subscription went on
    await sub.unsubscribe()
    await sub_conn.flush()
    await pub.publish("t.inline", b"after")
    await pub.flush()
    await sub_conn.flush()
    assert len(seen) == 11


async def test_headers_round_trip(bus: Bus) -> None:
    inbox = Inbox()
    await bus.subscribe("hd.x", inbox)
    await bus.publish("hd.x", b"body", headers={"Fp-Trace": "abc", "Fp-Kind": "report"})
    msg = await inbox.get()
    assert msg.data == b"body"
    assert msg.headers is not None
    assert msg.headers["Fp-Trace"] == "abc" and msg.headers["Fp-Kind"] == "report"


async def test_publish_rejects_bad_subjects(bus: Bus) -> None:
    for subject in ("a.*", "a.>", "", "a..b", "a b"):
        with pytest.raises(UsageError):
            await bus.publish(subject, b"")
    with pytest.raises(UsageError):
        await bus.subscribe("a.>.b", Inbox())


async def test_max_payload_exceeded_names_both_sizes(bus: Bus) -> None:
    limit = bus.max_payload
    assert limit == 1024 * 1024
    inbox = Inbox()
    await bus.subscribe("big.x", inbox)
    await bus.publish("big.x", bytes(limit))  # exactly the limit is fine
    assert len((await inbox.get()).data) == limit
    with pytest.raises(MaxPayloadExceeded) as info:
        await bus.publish("big.x", bytes(limit + 1))
    assert info.value.size == limit + 1 and info.value.max_payload == limit
    assert str(limit + 1) in str(info.value) and str(limit) in str(info.value)
    with pytest.raises(MaxPayloadExceeded):
        await bus.request("big.x", bytes(limit + 1), timeout=1)


async def test_closed_bus_refuses_to_publish(bus_factory: BusFactory) -> None:
    bus = await bus_factory()
    await bus.close()
    with pytest.raises(BusError):
        await bus.publish("c.x", b"")


# -- request/reply ----------------------------------------------------------------------------


async def test_request_reply(bus_factory: BusFactory) -> None:
    client, server = await bus_factory(), await bus_factory()
    await server.subscribe("r.upper", responder(server, lambda m: m.data.upper()))
    await server.flush()
    reply = await client.request("r.upper", b"hello", timeout=WAIT_S)
    assert reply.data == b"HELLO"


async def test_request_headers_reach_responder(bus: Bus) -> None:
    await bus.subscribe("r.hdr", responder(bus, lambda m: (m.headers or {})["X-Id"].encode()))
    reply = await bus.request("r.hdr", b"", timeout=WAIT_S, headers={"X-Id": "42"})
    assert reply.data == b"42"


async def test_request_without_subscriber_is_no_responders(bus: Bus) -> None:
    started = asyncio.get_running_loop().time()
    with pytest.raises(NoResponders):
        await bus.request("r.nobody", b"", timeout=WAIT_S)
    assert asyncio.get_running_loop().time() - started < WAIT_S / 2  # fails fast


async def test_request_unanswered_times_out(bus: Bus) -> None:
    await bus.subscribe("r.silent", Inbox())
    with pytest.raises(BusTimeout):
        await bus.request("r.silent", b"", timeout=0.2)


async def test_request_stream_gets_replies_in_order(bus_factory: BusFactory) -> None:
    client, server = await bus_factory(), await bus_factory()

    async def stream_back(msg: Msg) -> None:
        assert msg.reply is not None
        for i in range(5):
            await server.publish(msg.reply, f"chunk{i}".encode(), headers={"Seq": str(i)})

    await server.subscribe("rs.x", stream_back)
    await server.flush()
    stream = await client.request_stream("rs.x", b"go")
    got = [await stream.next(WAIT_S) for _ in range(5)]
    assert [m.data for m in got] == [f"chunk{i}".encode() for i in range(5)]
    assert [(m.headers or {})["Seq"] for m in got] == [str(i) for i in range(5)]
    with pytest.raises(BusTimeout):
        await stream.next(0.2)
    await stream.close()
    await stream.close()


async def test_request_stream_without_subscriber_is_no_responders(bus: Bus) -> None:
    stream = await bus.request_stream("rs.nobody", b"")
    with pytest.raises(NoResponders):
        await stream.next(WAIT_S)
    await stream.close()


async def test_new_inbox_is_unique_and_subscribable(bus: Bus) -> None:
    a, b = bus.new_inbox(), bus.new_inbox()
    assert a != b
    inbox = Inbox()
    await bus.subscribe(a, inbox)
    await bus.publish(a, b"x")
    assert (await inbox.get()).data == b"x"


# -- KV ---------------------------------------------------------------------------------------


async def test_kv_put_get_create_update_delete(bus: Bus) -> None:
    kv = await bus.kv("t_kv")
    assert await kv.get("a") is None
    assert await kv.keys() == []
    r1 = await kv.put("a", b"1")
    entry = await kv.get("a")
    assert entry == KVEntry("t_kv", "a", b"1", r1, "PUT")
    with pytest.raises(KVConflict) as conflict:
        await kv.create("a", b"again")
    assert conflict.value.key == "a"
    r2 = await kv.create("b.c", b"2")
    assert r2 > r1  # one revision counter per bucket
    r3 = await kv.update("a", b"3", r1)
    with pytest.raises(KVConflict) as stale:
        await kv.update("a", b"4", r1)
    assert stale.value.expected_revision == r1
    assert (await kv.get("a")) == KVEntry("t_kv", "a", b"3", r3, "PUT")
    assert await kv.keys() == ["a", "b.c"]
    with pytest.raises(KVConflict):
        await kv.delete("a", last_revision=r1)
    await kv.delete("a", last_revision=r3)
    assert await kv.get("a") is None
    assert await kv.keys() == ["b.c"]
    r5 = await kv.create("a", b"reborn")  # a deleted key may be re-created
    assert (await kv.get("a")) == KVEntry("t_kv", "a", b"reborn", r5, "PUT")
    await kv.delete("b.c")
    assert await kv.keys() == ["a"]


async def test_kv_bind_and_missing_bucket(bus_factory: BusFactory) -> None:
    a, b = await bus_factory(), await bus_factory()
    with pytest.raises(BusError):
        await a.kv("t_missing", create=False)
    await (await a.kv("t_shared", history=5)).put("k", b"v")
    bound = await b.kv("t_shared", create=False)
    entry = await bound.get("k")
    assert entry is not None and entry.value == b"v"
    with pytest.raises(UsageError):
        await a.kv("bad.name")
    with pytest.raises(UsageError):
        await bound.put("bad key", b"")


async def test_kv_watch_initial_values_marker_then_live_changes(bus_factory: BusFactory) -> None:
    writer, reader = await bus_factory(), await bus_factory()
    kv = await writer.kv("t_watch")
    ra = await kv.put("a", b"1")
    rb = await kv.put("b", b"2")
    await kv.put("gone", b"x")
    await kv.delete("gone")
    watcher = await (await reader.kv("t_watch")).watch()
    assert await next_entry(watcher) == KVEntry("t_watch", "a", b"1", ra, "PUT")
    assert await next_entry(watcher) == KVEntry("t_watch", "b", b"2", rb, "PUT")
    assert await next_entry(watcher) is None  # initial values done; deleted keys left out
    rc = await kv.put("c", b"3")
    assert await next_entry(watcher) == KVEntry("t_watch", "c", b"3", rc, "PUT")
    await kv.delete("a")
    deleted = await next_entry(watcher)
    assert deleted is not None and (deleted.key, deleted.op) == ("a", "DEL")
    assert deleted.revision > rc
    await watcher.stop()
    await watcher.stop()
    assert [e async for e in watcher] == []


async def test_kv_watch_empty_bucket_and_key_pattern(bus: Bus) -> None:
    kv = await bus.kv("t_watch_pattern")
    watcher = await kv.watch("app.*")
    assert await next_entry(watcher) is None
    await kv.put("other", b"")
    await kv.put("app.one", b"1")
    entry = await next_entry(watcher)
    assert entry is not None and entry.key == "app.one"
    await watcher.stop()


async def test_kv_snapshot_reads_many_patterns_at_once_without_deletes(bus: Bus) -> None:
    kv = await bus.kv("t_snapshot")
    assert await kv.snapshot([]) == []
    assert await kv.snapshot(["*.app1.>"]) == []
    r1 = await kv.put("w1.app1.Dep.0", b"1")
    await kv.put("w1.app2.Dep.0", b"2")
    r3 = await kv.put("w2.app3.Dep.0", b"3")
    await kv.put("w2.app1.Dep.1", b"gone")
    await kv.delete("w2.app1.Dep.1")
    r5 = await kv.put("w1.app1.Dep.0", b"1b")
    got = await kv.snapshot(["*.app3.>", "*.app1.>", "*.app1.>"])  # a repeat is read once
    assert got == [
        KVEntry("t_snapshot", "w2.app3.Dep.0", b"3", r3, "PUT"),
        KVEntry("t_snapshot", "w1.app1.Dep.0", b"1b", r5, "PUT"),
    ]
    assert r5 > r1
    with pytest.raises(UsageError):
        await kv.snapshot(["bad key"])


async def test_kv_snapshot_of_more_patterns_than_one_read_takes(bus: Bus) -> None:
    kv = await bus.kv("t_snapshot_many")
    apps = [f"app{i}" for i in range(1200)]  # beyond one consumer's filter subjects
    await asyncio.gather(*(kv.put(f"{a}.r", a.encode()) for a in apps))
    await kv.put("other.r", b"")
    got = await kv.snapshot([f"{a}.>" for a in apps])
    assert sorted(e.key for e in got) == sorted(f"{a}.r" for a in apps)
    assert [e.revision for e in got] == sorted(e.revision for e in got)


async def test_kv_snapshot_leaves_no_consumer_on_the_server(nats_url: str) -> None:
    """A watch per pattern would leave one consumer each until its inactivity threshold."""
    bus = await NatsBus.connect(nats_url, name="snapshot")
    try:
        kv = await bus.kv("t_snapshot_consumers")
        await kv.put("a.x", b"1")
        for _ in range(3):
            assert len(await kv.snapshot([f"{c}.>" for c in "abcdefgh"])) == 1
        info = await bus.js.stream_info("KV_t_snapshot_consumers")
        assert info.state.consumer_count == 0
    finally:
        await bus.close()


async def test_kv_snapshot_of_an_entry_that_expires_before_it_is_read(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A member entry counted as pending when the consumer is made can reach the bucket's max
    age before it is fetched: the snapshot is then empty, not a timeout."""
    bus = await NatsBus.connect(nats_url, name="snapshot-expiry")
    try:
        kv = await bus.kv("t_snapshot_expiry", ttl=1.0)
        await kv.put("member", b"1")
        made = bus.js.add_consumer

        async def made_then_expired(stream: str, **kw: object) -> object:
            info = await made(stream, **kw)  # type: ignore[arg-type]
            assert info.num_pending == 1

            async def expired() -> bool:
                return not (await bus.js.stream_info(stream)).state.messages

            await waiting.eventually(expired, WAIT_S, "the entry expired")
            return info

        monkeypatch.setattr(bus.js, "add_consumer", made_then_expired)
        assert await asyncio.wait_for(kv.snapshot([">"]), WAIT_S) == []
    finally:
        await bus.close()


async def test_kv_watch_with_history(bus: Bus) -> None:
    kv = await bus.kv("t_history", history=5)
    r1 = await kv.put("k", b"1")
    r2 = await kv.put("k", b"2")
    await kv.delete("k")
    watcher = await kv.watch("k", include_history=True)
    got = [await next_entry(watcher) for _ in range(4)]
    assert got[:2] == [
        KVEntry("t_history", "k", b"1", r1, "PUT"),
        KVEntry("t_history", "k", b"2", r2, "PUT"),
    ]
    assert got[2] is not None and got[2].op == "DEL"
    assert got[3] is None
    await watcher.stop()

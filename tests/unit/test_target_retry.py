"""KV writes the controller could not make are retried until they land (kv_writer.py), still
fenced by partition epoch and revision; the tick does not wait for them."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence

import pytest

from services.controller.core import ControllerConfig, DeleteKey, PutStatus
from services.controller.fenced import FencedWriter
from services.controller.group import partition_of
from services.controller.kv_delta import DeleteDoc, PutDoc
from services.controller.machinery.kv_writer import KVWriter, WriteBacklog
from services.controller.service import ControllerService, ServiceConfig
from shared.bus import KV, KVEntry, KVWatcher, MaxPayloadExceeded
from shared.errors import BusTimeout
from shared.fakebus import FakeServer
from shared.kv import envelope
from shared.kv.status import AppStatusView
from shared.kv.targets import ReplicaTarget
from shared.replicaspec import ReplicaSpec
from shared.subjects import KV_STATUS, KV_TARGETS

# -- the backlog (pure) --------------------------------------------------------------------------


def test_latest_value_per_key_in_the_order_of_the_latest_submits() -> None:
    b: WriteBacklog[str] = WriteBacklog()
    b.submit("m", "m1", 0.0)
    b.submit("t", "t1", 0.0)
    b.submit("m", "m2", 0.0)  # replaces m1 and moves behind t1
    got = []
    while (n := b.next(0.0)) is not None:
        got.append(n[1])
        b.landed(n[0], n[2])
    assert got == ["t1", "m2"]
    assert len(b) == 0


def test_a_failed_write_backs_off_doubling_up_to_the_cap() -> None:
    b: WriteBacklog[str] = WriteBacklog(first_retry_s=1.0, max_retry_s=5.0)
    b.submit("k", "v", 0.0)
    now, waits = 0.0, []
    for _ in range(5):
        n = b.next(now)
        assert n is not None
        f = b.failed(n[0], n[2], now)
        waits.append(f.retry_in)
        assert b.next(now) is None  # not due yet
        assert b.wake_at() == now + f.retry_in
        now += f.retry_in
    assert waits == [1.0, 2.0, 4.0, 5.0, 5.0]
    n = b.next(now)
    assert n is not None
    assert b.landed(n[0], n[2]) == 5
    assert len(b) == 0 and b.wake_at() is None


def test_warnings_are_rate_limited_per_key() -> None:
    b: WriteBacklog[str] = WriteBacklog(first_retry_s=1.0, max_retry_s=1.0, warn_every_s=10.0)
    b.submit("k", "v", 0.0)
    warned = []
    for t in range(25):
        n = b.next(float(t))
        assert n is not None
        warned.append(b.failed(n[0], n[2], float(t)).warn)
    assert [t for t, w in enumerate(warned) if w] == [0, 10, 20]


def test_a_newer_value_is_tried_at_once_and_survives_the_old_ones_outcome() -> None:
    b: WriteBacklog[str] = WriteBacklog(first_retry_s=30.0)
    b.submit("k", "v1", 0.0)
    n = b.next(0.0)
    assert n is not None
    b.submit("k", "v2", 0.5)  # while v1 is being written
    assert b.next(0.5) is None  # one write per key at a time
    b.failed(n[0], n[2], 1.0)
    n2 = b.next(1.0)  # no backoff for the newer value
    assert n2 is not None and n2[1] == "v2"
    b.submit("k", "v3", 1.5)
    b.landed(n2[0], n2[2])  # v2 landed, v3 still queued
    n3 = b.next(1.5)
    assert n3 is not None and n3[1] == "v3"


# -- the writer task -----------------------------------------------------------------------------


async def run_until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met"
        await asyncio.sleep(0.005)


async def with_writer(writer: KVWriter[str], body: Callable[[], Awaitable[None]]) -> None:
    task = asyncio.create_task(writer.run())
    try:
        await body()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_writer_retries_until_the_write_lands(caplog: pytest.LogCaptureFixture) -> None:
    store: dict[str, str] = {}
    fails = {"n": 3}

    async def write(item: str) -> None:
        if fails["n"]:
            fails["n"] -= 1
            raise BusTimeout("kv update timed out")
        store["k"] = item

    writer: KVWriter[str] = KVWriter(write, backlog=WriteBacklog(first_retry_s=0.01))

    async def body() -> None:
        writer.submit("k", "v1")
        await run_until(lambda: store.get("k") == "v1")
        assert await writer.flush(1.0)

    with caplog.at_level(logging.WARNING, logger="services.controller.machinery.kv_writer"):
        await with_writer(writer, body)
    assert (writer.failures, writer.written) == (3, 1)
    msgs = [r.getMessage() for r in caplog.records]
    assert any("failed (1 in a row): BusTimeout" in m for m in msgs)
    assert any("after 3 failed attempt(s)" in m for m in msgs)


# -- the service: a target write that failed is written later, fenced as before ---------------


class FlakyKV:
    """A KV whose next `fail` writes raise (a value over max_payload, as on a real server)."""

    def __init__(self, kv: KV, fail: int) -> None:
        self.kv, self.fail = kv, fail
        self.fail_keys: set[str] = set()
        """Keys whose writes always fail."""

    def _maybe_fail(self, key: str, value: bytes) -> None:
        if key in self.fail_keys:
            raise MaxPayloadExceeded(f"$KV.fp_targets.{key}", len(value), 64)
        if self.fail:
            self.fail -= 1
            raise MaxPayloadExceeded(f"$KV.fp_targets.{key}", len(value), 64)

    async def get(self, key: str) -> KVEntry | None:
        return await self.kv.get(key)

    async def put(self, key: str, value: bytes) -> int:
        self._maybe_fail(key, value)
        return await self.kv.put(key, value)

    async def create(self, key: str, value: bytes) -> int:
        self._maybe_fail(key, value)
        return await self.kv.create(key, value)

    async def update(self, key: str, value: bytes, last_revision: int) -> int:
        self._maybe_fail(key, value)
        return await self.kv.update(key, value, last_revision)

    async def delete(self, key: str, last_revision: int | None = None) -> None:
        await self.kv.delete(key, last_revision)

    async def keys(self) -> list[str]:
        return await self.kv.keys()

    async def watch(self, keys: str = ">", *, include_history: bool = False) -> KVWatcher:
        return await self.kv.watch(keys, include_history=include_history)

    async def snapshot(self, patterns: Sequence[str]) -> list[KVEntry]:
        return await self.kv.snapshot(patterns)


def target(
    app: str = "demo", slot: int = 0, version: str = "v1", agent: str = "w1"
) -> ReplicaTarget:
    rid = f"{app}-d-ab12-{slot:x}"
    spec = ReplicaSpec("m:Model")
    return ReplicaTarget(app, "d", rid, agent, slot, slot + 1, version, f"rpc.{rid}", spec)


def put(t: ReplicaTarget) -> PutDoc:
    return PutDoc(KV_TARGETS, t.key, t)


KEY = "w1.demo.d.0"


async def service_with(fail: int) -> tuple[ControllerService, KV, FlakyKV]:
    svc = ControllerService(ServiceConfig(nats_url="nats://unused:1", core=ControllerConfig()))
    kv = await FakeServer().connect().kv(KV_TARGETS)
    flaky = FlakyKV(kv, fail)
    svc._writers[KV_TARGETS] = FencedWriter(flaky, 0)
    svc._epochs[partition_of("demo", svc.cfg.partitions)] = 7
    svc._kv.backlog.first_retry_s = 0.01
    return svc, kv, flaky


async def value_of(kv: KV, key: str) -> dict[str, object] | None:
    entry = await kv.get(key)
    return None if entry is None else json.loads(entry.value)


async def test_a_target_whose_write_failed_lands_later() -> None:
    svc, kv, flaky = await service_with(fail=2)
    task = asyncio.create_task(svc._kv.run())
    try:
        await svc._execute([put(target())])
        await run_until(lambda: flaky.fail == 0)
        assert await svc._kv.flush(2.0)
        doc = await value_of(kv, KEY)
        assert doc is not None
        assert doc["owner_epoch"] == 7  # stamped with the partition epoch, as before
        got = envelope.decode((await kv.get(KEY)).value, ReplicaTarget)  # type: ignore[union-attr]
        assert got == ReplicaTarget(**{**_fields(target()), "owner_epoch": 7})
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_tick_does_not_wait_for_a_failing_write() -> None:
    svc, kv, _ = await service_with(fail=10**6)
    # no writer task running: _execute only queues, so it returns at once
    await asyncio.wait_for(svc._execute([put(target())]), 0.5)
    assert len(svc._kv.backlog) == 1
    assert await value_of(kv, KEY) is None


async def test_a_newer_target_replaces_the_failing_one() -> None:
    svc, kv, flaky = await service_with(fail=3)
    task = asyncio.create_task(svc._kv.run())
    try:
        await svc._execute([put(target(version="v1"))])
        await run_until(lambda: flaky.fail <= 2)
        await svc._execute([put(target(version="v2"))])
        await run_until(lambda: flaky.fail == 0)
        assert await svc._kv.flush(2.0)
        doc = await value_of(kv, KEY)
        assert doc is not None and doc["version"] == "v2"
        assert (await kv.get(KEY)).revision == 1  # type: ignore[union-attr]  # v1 never landed
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_writes_to_other_keys_do_not_wait_behind_a_failing_one() -> None:
    svc, kv, flaky = await service_with(fail=10**6)
    svc._kv.backlog.first_retry_s = 0.05
    task = asyncio.create_task(svc._kv.run())
    try:
        await svc._execute([put(target(slot=0))])
        await run_until(lambda: svc._kv.failures >= 1)
        flaky.fail = 0  # the next key's write succeeds while slot 0 is still backing off
        flaky.fail_keys = {KEY}
        await svc._execute([put(target(slot=1))])
        await run_until(lambda: svc._kv.written >= 1)
        assert await value_of(kv, "w1.demo.d.1") is not None
        assert await value_of(kv, KEY) is None
        flaky.fail_keys = set()
        assert await svc._kv.flush(2.0)
        assert await value_of(kv, KEY) is not None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_retry_is_dropped_once_the_partition_changed_hands() -> None:
    svc, kv, flaky = await service_with(fail=1)
    svc._kv.backlog.first_retry_s = 0.2
    task = asyncio.create_task(svc._kv.run())
    try:
        await svc._execute([put(target())])
        await run_until(lambda: flaky.fail == 0)
        # taken over, then taken back under a newer epoch: the value decided at 7 is not ours
        svc._epochs[partition_of("demo", svc.cfg.partitions)] = 8
        assert await svc._kv.flush(2.0)
        assert await value_of(kv, KEY) is None
        assert svc._kv.written == 1  # done (dropped), not failed again
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_value_of_a_newer_owner_is_not_overwritten_by_a_retry() -> None:
    svc, kv, _ = await service_with(fail=1)
    newer = ReplicaTarget(**{**_fields(target(agent="w1")), "owner_epoch": 9})
    await kv.create(KEY, envelope.encode(newer))
    task = asyncio.create_task(svc._kv.run())
    try:
        await svc._execute([put(target(version="v5"))])
        assert await svc._kv.flush(2.0)
        doc = await value_of(kv, KEY)
        assert doc is not None and doc["owner_epoch"] == 9 and doc["version"] == "v1"
        assert svc._writers[KV_TARGETS].fenced == 1
        # nor deleted by one
        await svc._execute([DeleteDoc(KV_TARGETS, KEY)])
        assert await svc._kv.flush(2.0)
        assert await value_of(kv, KEY) is not None
        assert svc._writers[KV_TARGETS].fenced == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_status_and_deletes_go_through_the_same_queue() -> None:
    svc, _, _ = await service_with(fail=0)
    status_kv = await FakeServer().connect().kv(KV_STATUS)
    svc._writers[KV_STATUS] = FencedWriter(FlakyKV(status_kv, 1), 0)
    view = AppStatusView("demo", "RUNNING", None, None, 1.0, 0, {})
    task = asyncio.create_task(svc._kv.run())
    try:
        await svc._execute([PutStatus("demo", view)])
        await run_until(lambda: svc._kv.written == 1)
        assert await value_of(status_kv, "demo") is not None
        await svc._execute([DeleteKey(KV_STATUS, "demo")])
        assert await svc._kv.flush(2.0)
        assert await value_of(status_kv, "demo") is None
        await svc._execute([put(target())])
        assert await svc._kv.flush(2.0)
        assert await value_of(svc._writers[KV_TARGETS].kv, KEY) is not None
        await svc._execute([DeleteDoc(KV_TARGETS, KEY)])
        assert await svc._kv.flush(2.0)
        assert await value_of(svc._writers[KV_TARGETS].kv, KEY) is None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _fields(t: ReplicaTarget) -> dict[str, object]:
    return {f: getattr(t, f) for f in ReplicaTarget.__slots__}

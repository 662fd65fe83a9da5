"""Membership from KV fp_membership: epochs, deletes, bad values, carried-health pruning."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from services.router.router import Router
from shared.bus import FakeBus, FakeServer
from shared.clock import FakeClock
from shared.control import Member, Membership
from shared.subjects import KV_MEMBERSHIP
from shared.wire.messages import Admission, HealthStatus

APP, DEP = "shop", "cart"


def members(*ids: str) -> tuple[Member, ...]:
    return tuple(Member(i, f"fp.v1.rpc.{APP}.{DEP}.{i}") for i in ids)


@pytest.fixture
async def bus() -> AsyncIterator[FakeBus]:
    b = FakeServer().connect()
    yield b
    await b.close()


def test_only_newer_epochs_apply_and_health_is_pruned() -> None:
    clock = FakeClock()
    router = Router(APP, DEP, bus=FakeServer().connect(), clock=clock)
    assert router.apply_membership(Membership(APP, DEP, 5, members("a", "b")))
    for rid in ("a", "b"):
        status = HealthStatus(rid, True, clock.wall(), 0)
        router.admitted(rid, Admission(True, 0, status, False), clock.monotonic())
    assert set(router.health) == {"a", "b"}
    # an equal epoch is a re-delivery, an older one a replay: both are no-ops
    assert not router.apply_membership(Membership(APP, DEP, 5, members("z")))
    assert not router.apply_membership(Membership(APP, DEP, 4, members("z")))
    assert set(router.members) == {"a", "b"}
    assert router.apply_membership(Membership(APP, DEP, 6, members("b", "c")))
    assert set(router.members) == {"b", "c"} and router.epoch == 6
    assert set(router.health) == {"b"}
    assert router.probe_subjects == {"b": "fp.v1.probe.b", "c": "fp.v1.probe.c"}
    # a deleted key empties the members but keeps the epoch, so old values stay ignored
    assert router.apply_membership(None)
    assert router.members == {} and len(router.health) == 0 and router.epoch == 6
    assert not router.apply_membership(Membership(APP, DEP, 6, members("a")))


async def wait_for(cond: object) -> None:
    assert callable(cond)
    async with asyncio.timeout(2.0):
        while not cond():  # noqa: ASYNC110 - polling a plain attribute of the router
            await asyncio.sleep(0.005)


async def test_router_follows_the_kv_watch(bus: FakeBus) -> None:
    kv = await bus.kv(KV_MEMBERSHIP)
    key = f"{APP}.{DEP}"
    await kv.put(key, Membership(APP, DEP, 2, members("a")).encode())
    await kv.put("other.dep", Membership("other", "dep", 9, members("x")).encode())
    router = Router(APP, DEP, bus=bus)
    try:
        await router.wait_ready(2.0)
        assert set(router.members) == {"a"} and router.epoch == 2
        await kv.put(key, b"\xc1 not msgpack")
        await kv.put(key, Membership("shop", "other", 3, members("q")).encode())
        await kv.put(key, Membership(APP, DEP, 1, members("old")).encode())
        await kv.put(key, Membership(APP, DEP, 3, members("a", "b")).encode())
        await wait_for(lambda: router.epoch == 3)
        assert set(router.members) == {"a", "b"}
        assert router.bad_input.counts["malformed"] == 1
        assert router.bad_input.counts["wrong_key"] == 1
        await kv.delete(key)
        await wait_for(lambda: not router.members)
    finally:
        await router.close()


async def test_missing_bucket_means_no_replicas(bus: FakeBus) -> None:
    router = Router(APP, DEP, bus=bus)
    try:
        await router.wait_ready(2.0)
        assert router.members == {} and router.epoch == -1
    finally:
        await router.close()

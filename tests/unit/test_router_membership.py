"""Membership from KV fp_membership (one key per slot): puts and deletes per slot, epochs that
never go back, bad values, a re-established watch that never shows a half-read set, coalesced
refreshes, and carried-health pruning."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest

from services.router.config import RouterConfig
from services.router.router import WATCH_RETRY_S, Router
from services.router.testing import Seat, members_of
from shared.bus import Msg
from shared.clock import FakeClock
from shared.fakebus import FakeBus, FakeServer
from shared.kv import buckets
from shared.kv.membership import Member, MembershipView
from shared.kv.view import DocKV
from shared.wire.messages import Admission, HealthStatus

APP, DEP = "shop", "cart"


def seats(*ids: str) -> list[Seat]:
    return [Seat(i, f"fp.v1.rpc.{APP}.{DEP}.{i}") for i in ids]


def member(rid: str, slot: int, epoch: int, app: str = APP, dep: str = DEP) -> Member:
    return Member(app, dep, slot, rid, f"fp.v1.rpc.{app}.{dep}.{rid}", slot + 1, epoch)


@pytest.fixture
async def bus() -> AsyncIterator[FakeBus]:
    b = FakeServer().connect()
    yield b
    await b.close()


def test_members_apply_and_health_is_pruned_and_the_epoch_never_goes_back() -> None:
    clock = FakeClock()
    router = Router(APP, DEP, bus=FakeServer().connect(), clock=clock)
    assert router.apply_members(5, members_of(APP, DEP, 5, seats("a", "b")))
    for rid in ("a", "b"):
        status = HealthStatus(rid, True, clock.wall(), 0)
        router.admitted(rid, Admission(True, 0, status, False), clock.monotonic())
    assert set(router.health) == {"a", "b"} and router.epoch == 5
    # a re-delivery of the same set changes nothing (carried health kept)
    assert not router.apply_members(5, members_of(APP, DEP, 5, seats("a", "b")))
    assert set(router.members) == {"a", "b"} and set(router.health) == {"a", "b"}
    assert router.apply_members(6, members_of(APP, DEP, 6, seats("b", "c")))
    assert set(router.members) == {"b", "c"} and router.epoch == 6
    assert set(router.health) == {"b"}
    assert router.probe_subjects == {"b": "fp.v1.probe.b", "c": "fp.v1.probe.c"}
    # no members left: empty, the epoch kept
    assert router.apply_members(6, [])
    assert router.members == {} and len(router.health) == 0 and router.epoch == 6
    assert not router.apply_members(6, [])
    # the view epoch is the largest applied: an older value never lowers it
    router.apply_members(4, members_of(APP, DEP, 4, seats("a")))
    assert router.epoch == 6


def test_a_changed_rpc_subject_is_a_change() -> None:
    router = Router(APP, DEP, bus=FakeServer().connect(), clock=FakeClock())
    assert router.apply_members(1, members_of(APP, DEP, 1, seats("a")))
    assert router.apply_members(2, members_of(APP, DEP, 2, [Seat("a", "other.subject")]))
    assert router.members["a"].rpc_subject == "other.subject"


async def wait_for(cond: object) -> None:
    assert callable(cond)
    async with asyncio.timeout(2.0):
        while not cond():  # noqa: ASYNC110 - polling a plain attribute of the router
            await asyncio.sleep(0.005)


async def test_router_follows_the_kv_watch_per_slot(bus: FakeBus) -> None:
    raw = await buckets.open_bucket(bus, buckets.MEMBERSHIP)
    kv = DocKV(raw, Member)
    await kv.put(f"{APP}.{DEP}.0", member("a", 0, 2))
    await kv.put("other.dep.0", member("x", 0, 9, app="other", dep="dep"))
    await kv.put(f"{APP}.{DEP}x.0", member("y", 0, 9, dep=f"{DEP}x"))  # a longer name, same prefix
    router = Router(APP, DEP, bus=bus)
    try:
        await router.wait_ready(2.0)
        assert set(router.members) == {"a"} and router.epoch == 2
        await raw.put(f"{APP}.{DEP}.1", b"\xc1 not json")
        await kv.put(f"{APP}.{DEP}.2", member("q", 2, 3, dep="other"))  # another deployment's
        await kv.put(f"{APP}.{DEP}.3", member("q", 4, 3))  # another slot's
        await kv.put(f"{APP}.{DEP}.1", member("b", 1, 3))
        await wait_for(lambda: router.epoch == 3)
        await wait_for(lambda: set(router.members) == {"a", "b"})
        assert router.bad_input.counts["malformed"] == 1
        assert router.bad_input.counts["bad_value"] == 2
        # a put replaces the member of its slot, a delete empties it
        await kv.put(f"{APP}.{DEP}.0", member("c", 0, 4))
        await wait_for(lambda: set(router.members) == {"b", "c"})
        assert router.epoch == 4
        await kv.delete(f"{APP}.{DEP}.1")
        await wait_for(lambda: set(router.members) == {"c"})
        await kv.delete(f"{APP}.{DEP}.0")
        await wait_for(lambda: not router.members)
        assert router.epoch == 4  # kept
    finally:
        await router.close()


async def test_a_burst_of_changes_refreshes_the_chooser_once_not_per_change(
    bus: FakeBus,
) -> None:
    raw = await buckets.open_bucket(bus, buckets.MEMBERSHIP)
    kv = DocKV(raw, Member)
    router = Router(APP, DEP, bus=bus)
    sets: list[frozenset[str]] = []
    original = router._notify

    def spy() -> None:  # called once per refresh that changed the set the chooser holds
        sets.append(frozenset(router.chooser._members))
        original()

    router._notify = spy  # type: ignore[method-assign]
    try:
        await router.wait_ready(2.0)
        for i in range(50):
            await kv.put(f"{APP}.{DEP}.{i}", member(f"r{i}", i, 1))
        await wait_for(lambda: len(router.members) == 50)
        assert sets[-1] == frozenset(f"r{i}" for i in range(50))
        assert len(sets) <= 5  # coalesced (one, with this bus), not one per change
    finally:
        await router.close()


async def test_a_reestablished_watch_converges_without_showing_a_half_read_set(
    bus: FakeBus,
) -> None:
    raw = await buckets.open_bucket(bus, buckets.MEMBERSHIP)
    kv = DocKV(raw, Member)
    for i, rid in enumerate(("a", "b", "c")):
        await kv.put(f"{APP}.{DEP}.{i}", member(rid, i, i + 1))
    router = Router(APP, DEP, bus=bus)
    sets: list[frozenset[str]] = []
    original = router._notify

    def spy() -> None:  # called once per refresh that changed the set the chooser holds
        sets.append(frozenset(router.chooser._members))
        original()

    router._notify = spy  # type: ignore[method-assign]
    try:
        await router.wait_ready(2.0)
        assert set(router.members) == {"a", "b", "c"} and router.epoch == 3
        assert router._watcher is not None
        await router._watcher.stop()  # the watch ends (as on a lost connection)
        # while nobody watches: one replica is replaced
        await kv.delete(f"{APP}.{DEP}.0")
        await kv.put(f"{APP}.{DEP}.3", member("d", 3, 4))
        await asyncio.sleep(WATCH_RETRY_S)
        await wait_for(lambda: set(router.members) == {"b", "c", "d"})
        assert router.epoch == 4
        # every set the chooser was given was whole: the old one, then the new one at once
        assert sets == [frozenset("abc"), frozenset("bcd")]
    finally:
        await router.close()


async def test_missing_bucket_means_no_replicas(bus: FakeBus) -> None:
    router = Router(APP, DEP, bus=bus)
    try:
        await router.wait_ready(2.0)
        assert router.members == {} and router.epoch == -1
    finally:
        await router.close()


def test_the_report_interval_is_the_newest_members() -> None:
    view = MembershipView(APP, DEP)
    assert view.report_interval_s is None
    at = dataclasses.replace
    view.put(f"{APP}.{DEP}.0", at(member("a", 0, 3), report_interval_s=2.0))
    view.put(f"{APP}.{DEP}.1", at(member("b", 1, 2), report_interval_s=9.0))  # older: ignored
    view.put(f"{APP}.{DEP}.2", member("c", 2, 5))  # carries none (an older writer): kept
    assert view.report_interval_s == 2.0
    view.put(f"{APP}.{DEP}.0", at(member("a", 0, 6), report_interval_s=0.5))
    assert view.report_interval_s == 0.5
    view.delete(f"{APP}.{DEP}.0")
    assert view.report_interval_s == 0.5  # still the deployment's setting


async def test_a_new_interval_on_the_members_rearms_the_report_wait(bus: FakeBus) -> None:
    """The router's own setting is 30 s; the members say 0.05 s: reports flow at once, and a
    change back to a long interval stops them."""
    raw = await buckets.open_bucket(bus, buckets.MEMBERSHIP)
    kv = DocKV(raw, Member)
    sent: list[int] = []

    async def on_report(msg: Msg) -> None:
        sent.append(1)

    await bus.subscribe(f"fp.v1.report.handle.{APP}.{DEP}", on_report)
    router = Router(APP, DEP, bus=bus, config=RouterConfig(metrics_interval_s=30.0))
    try:
        await router.wait_ready(2.0)
        assert router.report_interval_s == 30.0
        await kv.put(
            f"{APP}.{DEP}.0", dataclasses.replace(member("a", 0, 1), report_interval_s=0.05)
        )
        await wait_for(lambda: len(sent) >= 5)
        await kv.put(
            f"{APP}.{DEP}.0", dataclasses.replace(member("a", 0, 2), report_interval_s=30.0)
        )
        await wait_for(lambda: router.report_interval_s == 30.0)
        await asyncio.sleep(0.1)  # let a report already due go out
        mark = len(sent)
        await asyncio.sleep(0.3)
        assert len(sent) == mark
    finally:
        await router.close()

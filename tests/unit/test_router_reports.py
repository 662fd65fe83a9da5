"""Handle reports: format gate, splitting, local health providers, the report the router sends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.router.config import RouterConfig
from services.router.reports import (
    build_handle_report,
    encode_handle_report,
    merge_health,
)
from services.router.router import Router
from services.router.testing import Seat, members_of
from shared.bus import Msg
from shared.clock import FakeClock
from shared.errors import BusError
from shared.fakebus import FakeBus, FakeServer
from shared.localhealth import LocalHealthProviders
from shared.wire.codec import decode_as, encode
from shared.wire.columnar import (
    columnar_parts_to_handle_report,
    decode_handle_report_columnar,
    detect_format,
)
from shared.wire.messages import Admission, HandleReport, HealthStatus


def hs(rid: str, at: float, healthy: bool = True) -> HealthStatus:
    return HealthStatus(rid, healthy, at, 0 if healthy else 2)


def report(width: int, *, seq: int = 1) -> HandleReport:
    ids = [f"replica-{i:05d}" for i in range(width)]
    return build_handle_report(
        handle_id="h1",
        app="shop",
        deployment="cart",
        seq=seq,
        sent_at=1_700_000_000.25,
        queued_requests=1.5,
        running={rid: i * 0.5 for i, rid in enumerate(ids)},
        carried_health=[hs(rid, 1_700_000_000.0 + i, i % 3 != 0) for i, rid in enumerate(ids)],
        membership_epoch=9,
    )


def decode_parts(parts: list[bytes]) -> HandleReport:
    if detect_format(parts[0]) == "msgpack":
        assert len(parts) == 1
        return decode_as(parts[0], HandleReport)
    return columnar_parts_to_handle_report([decode_handle_report_columnar(p) for p in parts])


def test_format_switches_at_the_gate_and_both_decode_to_the_same_report() -> None:
    r = report(5)
    narrow = encode_handle_report(r, columnar_min_replicas=6, max_payload=1 << 20)
    wide = encode_handle_report(r, columnar_min_replicas=5, max_payload=1 << 20)
    assert [detect_format(p) for p in narrow] == ["msgpack"]
    assert [detect_format(p) for p in wide] == ["columnar"]
    assert decode_parts(narrow) == decode_parts(wide) == r


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 300), st.integers(1, 400))
def test_any_width_round_trips_through_the_chosen_format(width: int, gate: int) -> None:
    r = report(width)
    parts = encode_handle_report(r, columnar_min_replicas=gate, max_payload=1 << 20)
    assert detect_format(parts[0]) == ("columnar" if width >= gate else "msgpack")
    assert decode_parts(parts) == r


def test_wide_report_is_split_under_max_payload() -> None:
    r = report(2000)
    parts = encode_handle_report(r, columnar_min_replicas=64, max_payload=16_384)
    assert len(parts) > 1
    assert all(len(p) <= 16_384 for p in parts)
    assert decode_parts(parts) == r


def test_narrow_report_too_big_for_msgpack_goes_columnar() -> None:
    r = report(40)
    assert len(encode(r)) > 3000
    parts = encode_handle_report(r, columnar_min_replicas=64, max_payload=3000)
    assert all(detect_format(p) == "columnar" and len(p) <= 3000 for p in parts)
    assert decode_parts(parts) == r


def test_merge_health_newest_wins() -> None:
    merged = merge_health([hs("a", 5.0), hs("b", 5.0)], [hs("a", 4.0, False), hs("b", 6.0, False)])
    assert merged == (hs("a", 5.0), hs("b", 6.0, False))


def test_provider_exception_is_isolated() -> None:
    providers = LocalHealthProviders()

    def broken() -> HealthStatus | None:
        raise RuntimeError("boom")

    def junk() -> HealthStatus | None:
        return "healthy"  # type: ignore[return-value]

    off = [
        providers.register(broken, app="a"),
        providers.register(lambda: hs("host", 1.0), app="a"),
        providers.register(junk, app="a"),
        providers.register(lambda: None, app="a"),
    ]
    assert providers.collect("a") == [hs("host", 1.0)]
    assert providers.errors == 2
    assert providers.collect("a") == [hs("host", 1.0)]
    assert providers.errors == 4
    for unregister in off:
        unregister()
        unregister()  # safe twice
    assert len(providers) == 0 and providers.collect("a") == []


# -- the router's own reports -------------------------------------------------------------------


@pytest.fixture
async def bus() -> AsyncIterator[FakeBus]:
    b = FakeServer().connect()
    yield b
    await b.close()


async def test_router_report_has_window_averages_health_and_local_providers(
    bus: FakeBus,
) -> None:
    clock = FakeClock()
    providers = LocalHealthProviders()
    providers.register(lambda: (_ for _ in ()).throw(RuntimeError("provider down")), app="shop")
    providers.register(lambda: hs("host", clock.wall()), app="shop")
    providers.register(lambda: hs("other-app-host", clock.wall()), app="elsewhere")
    router = Router("shop", "cart", bus=bus, clock=clock, providers=providers)
    got: list[Msg] = []

    async def on_report(msg: Msg) -> None:
        got.append(msg)

    await bus.subscribe("fp.v1.report.handle.shop.cart", on_report)
    router.apply_members(
        4, members_of("shop", "cart", 4, [Seat("a", "fp.v1.rpc.shop.cart.a"), Seat("b", "x.b")])
    )
    t = clock.monotonic()
    router.dispatched("a", t)
    router.admitted("a", Admission(True, 1, hs("a", clock.wall()), False), t)
    clock.advance(5.0)
    router.finished("a", clock.monotonic())
    clock.advance(5.0)
    first = await router.send_report()
    await bus.flush()
    assert decode_as(got[0].data, HandleReport) == first
    assert first.seq == 1 and first.membership_epoch == 4 and first.sent_at == clock.wall()
    assert first.running == pytest.approx({"a": 0.5, "b": 0.0})
    assert {h.replica_id for h in first.health} == {"a", "host"}
    assert providers.errors == 1  # the failing provider did not stop the report

    clock.advance(31.0)  # nothing refreshed a's health: it is not re-sent
    second = await router.send_report()
    assert second.seq == 2
    assert {h.replica_id for h in second.health} == {"host"}
    assert second.running == {"a": 0.0, "b": 0.0}


class _FailFirstPublish:
    """A bus whose first publish fails (a NATS hiccup)."""

    def __init__(self, inner: FakeBus) -> None:
        self.inner = inner
        self.failed = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def publish(self, subject: str, data: bytes, **kw: object) -> None:
        if not self.failed:
            self.failed += 1
            raise BusError("connection lost")
        await self.inner.publish(subject, data)


async def test_report_loop_keeps_its_cadence_and_survives_failures(bus: FakeBus) -> None:
    flaky = _FailFirstPublish(bus)
    router = Router(
        "shop",
        "cart",
        bus=flaky,  # type: ignore[arg-type]
        config=RouterConfig(metrics_interval_s=0.02),
        providers=LocalHealthProviders(),
    )
    seqs: list[int] = []

    async def on_report(msg: Msg) -> None:
        seqs.append(decode_as(msg.data, HandleReport).seq)

    await bus.subscribe("fp.v1.report.handle.shop.cart", on_report)
    await router.start()
    try:
        await asyncio.sleep(0.25)
    finally:
        await router.close()
    assert flaky.failed == 1
    assert len(seqs) >= 3
    # report 1 was lost on the wire; the sequence still advances by one per report
    assert seqs == list(range(2, len(seqs) + 2))

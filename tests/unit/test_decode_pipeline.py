"""The columnar decode worker (services/controller/machinery/decode_pipeline.py): messages are applied in
arrival order whatever the worker does, bad parts come back as their WireError in their place,
and with no thread everything is applied at once."""

from __future__ import annotations

import asyncio
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.controller.machinery import decode_pipeline
from services.controller.machinery.decode_pipeline import Decoded, DecodePipeline
from shared.errors import WireError
from shared.wire.columnar import ColumnarHandleReport, handle_report_to_columnar
from shared.wire.messages import HandleReport


def part(seq: int, width: int = 64) -> bytes:
    running = {f"r{i}": float(i % 3) for i in range(width)}
    rep = HandleReport("h", "app", "dep", 1.0, seq, 0.0, running, (), 1)
    (only,) = handle_report_to_columnar(rep)
    return only


async def drained(p: DecodePipeline, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while p.pending:  # noqa: ASYNC110 - the worker hands back through call_soon_threadsafe
            await asyncio.sleep(0.001)


def recorder(log: list[tuple[int, object]], i: int) -> decode_pipeline.Apply:
    def apply(decoded: Decoded) -> None:
        log.append((i, decoded))

    return apply


async def test_no_thread_applies_at_once() -> None:
    p = DecodePipeline(0)
    log: list[tuple[int, object]] = []
    p.submit(part(1), True, recorder(log, 1))
    assert log == [(1, None)]  # decoded where applied, as before
    p.close()


async def test_a_message_after_a_slow_part_waits_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    real = decode_pipeline._decode

    def slow(data: bytes) -> ColumnarHandleReport | WireError:
        release.wait(10)
        return real(data)

    monkeypatch.setattr(decode_pipeline, "_decode", slow)
    p = DecodePipeline(1)
    log: list[tuple[int, object]] = []
    p.submit(part(1), True, recorder(log, 1))
    p.submit(b"\x81\xa1k\x01", False, recorder(log, 2))  # a msgpack message behind it
    await asyncio.sleep(0.05)
    assert log == [] and p.applied_behind == 1
    release.set()
    await drained(p)
    assert [i for i, _ in log] == [1, 2]
    first = log[0][1]
    assert isinstance(first, ColumnarHandleReport) and first.seq == 1
    assert log[1][1] is None
    p.close()


async def test_a_bad_part_comes_back_as_its_error_in_its_place() -> None:
    p = DecodePipeline(1)
    log: list[tuple[int, object]] = []
    p.submit(b"FPC1 not arrow", True, recorder(log, 1))
    p.submit(part(2), True, recorder(log, 2))
    await drained(p)
    assert [i for i, _ in log] == [1, 2]
    assert isinstance(log[0][1], WireError) and log[0][1].reason == "malformed"
    assert isinstance(log[1][1], ColumnarHandleReport)
    p.close()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=40))
def test_property_order_is_arrival_order(columnar: list[bool]) -> None:
    async def run() -> list[int]:
        p = DecodePipeline(1)
        log: list[tuple[int, object]] = []
        for i, c in enumerate(columnar):
            p.submit(part(i) if c else b"\x80", c, recorder(log, i))
        await drained(p)
        p.close()
        return [i for i, _ in log]

    assert asyncio.run(run()) == list(range(len(columnar)))


async def test_after_close_messages_are_dropped_not_raised() -> None:
    """A message delivered while the service stops must not reach a shut-down worker (whose
    submit raises) nor be applied half-way through the stop: the stream keeps it."""
    p = DecodePipeline(1)
    log: list[tuple[int, object]] = []
    p.close()
    p.submit(part(1), True, recorder(log, 1))
    p.submit(b"\x81", False, recorder(log, 2))
    assert log == [] and p.pending == 0

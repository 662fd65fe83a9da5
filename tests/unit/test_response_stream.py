"""QueueResponseStream: the reply inbox of one request (shared/bus.py)."""

from __future__ import annotations

import asyncio

import pytest

from shared.bus import NO_RESPONDERS_STATUS, STATUS_HEADER, Msg, QueueResponseStream
from shared.errors import BusTimeout, NoResponders, UsageError


async def test_a_queued_reply_is_taken_without_waiting_and_in_order() -> None:
    stream = QueueResponseStream("s")
    for i in range(3):
        stream.push_nowait(Msg("inbox", str(i).encode()))
    assert [(await stream.next(0.001)).data for _ in range(3)] == [b"0", b"1", b"2"]


async def test_a_reply_wakes_the_reader_and_a_silence_times_out() -> None:
    stream = QueueResponseStream("s")
    reader = asyncio.ensure_future(stream.next(5.0))
    await asyncio.sleep(0)
    assert not reader.done()
    stream.push_nowait(Msg("inbox", b"late"))
    assert (await reader).data == b"late"
    with pytest.raises(BusTimeout, match=r"no reply on 's' within 0\.01s"):
        await stream.next(0.01)
    stream.push_nowait(Msg("inbox", b"after the timeout"))  # the stream goes on
    assert (await stream.next(0.01)).data == b"after the timeout"


async def test_one_reader_at_a_time_and_a_cancelled_reader_leaves_none() -> None:
    stream = QueueResponseStream("s")
    first = asyncio.ensure_future(stream.next(5.0))
    await asyncio.sleep(0)
    with pytest.raises(UsageError, match="has a reader"):
        await stream.next(1.0)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    stream.push_nowait(Msg("inbox", b"x"))
    assert (await stream.next(1.0)).data == b"x"


async def test_no_responders_and_closed() -> None:
    stream = QueueResponseStream("s")
    stream.push_nowait(Msg("inbox", b"", None, {STATUS_HEADER: NO_RESPONDERS_STATUS}))
    with pytest.raises(NoResponders):
        await stream.next(1.0)
    closed: list[bool] = []

    async def closer() -> None:
        closed.append(True)

    stream.attach(closer)
    await stream.close()
    await stream.close()
    assert closed == [True]
    with pytest.raises(UsageError, match="closed"):
        await stream.next(1.0)

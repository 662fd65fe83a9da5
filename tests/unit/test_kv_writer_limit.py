"""The write-behind's in-flight limit: many keys at once, halved when writes fail, grown back as
they land; and its log lines capped over all keys."""

from __future__ import annotations

import asyncio
import logging

import pytest

from services.controller.machinery.kv_writer import LOG_BURST, KVWriter, WriteBacklog
from shared.errors import BusTimeout


async def until(cond: object, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "condition not met"
        await asyncio.sleep(0.002)


async def test_writes_overlap_up_to_the_limit_which_halves_on_failure_and_grows_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = asyncio.Event()
    in_flight = {"now": 0, "max": 0}
    failing = {"on": True}
    landed: set[str] = set()

    async def write(key: str) -> None:
        in_flight["now"] += 1
        in_flight["max"] = max(in_flight["max"], in_flight["now"])
        try:
            await gate.wait()
            if failing["on"]:
                raise BusTimeout("server busy")
            landed.add(key)
        finally:
            in_flight["now"] -= 1

    writer: KVWriter[str] = KVWriter(
        write, backlog=WriteBacklog(first_retry_s=0.01, max_retry_s=0.02), concurrency=8
    )
    task = asyncio.create_task(writer.run())
    try:
        with caplog.at_level(logging.WARNING, logger="services.controller.machinery.kv_writer"):
            for i in range(200):
                writer.submit(f"k{i}", f"k{i}")
            await until(lambda: in_flight["now"] == 8)
            assert in_flight["max"] == 8  # different keys overlap, up to the limit
            started = asyncio.get_running_loop().time()
            gate.set()
            await until(lambda: writer.failures >= 100)
            windows = int(asyncio.get_running_loop().time() - started) + 2
            assert writer.limit == 1  # a busy server gets one write at a time
            lines = [r for r in caplog.records if "failed" in r.getMessage()]
            assert len(lines) <= windows * LOG_BURST < 100  # not one line per failing key
            failing["on"] = False
            assert await writer.flush(10.0)
        assert len(landed) == 200
        assert writer.limit > 1  # grown back as writes landed
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

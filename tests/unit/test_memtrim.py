"""Idle heap trimming (shared/memtrim.py) and its use by the replica (services/replica/__main__.py):
a replica gives the heap a burst of requests left behind back to the kernel once it goes idle."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.replica import __main__ as replica_main
from shared import memtrim
from shared.memtrim import IdleTrim
from tests.procs import ROOT
from tests.waiting import eventually


def test_trims_once_when_activity_stops_for_idle_s() -> None:
    d = IdleTrim(idle_s=1.0)
    assert not d.step(5, 0, 0.0)  # first sight: the count "moved"
    assert not d.step(5, 0, 0.9)
    assert d.step(5, 0, 1.0)
    assert not d.step(5, 0, 2.0)  # still idle, nothing new: no second trim
    assert not d.step(5, 0, 60.0)


def test_new_activity_means_a_new_trim_after_the_next_quiet_spell() -> None:
    d = IdleTrim(idle_s=1.0)
    d.step(0, 0, 0.0)
    assert d.step(0, 0, 1.0)
    assert not d.step(7, 0, 1.5)  # requests came
    assert not d.step(7, 0, 2.4)
    assert d.step(7, 0, 2.5)


def test_no_trim_while_a_request_runs_even_if_the_count_is_still() -> None:
    d = IdleTrim(idle_s=1.0)
    d.step(3, 1, 0.0)
    assert not d.step(3, 1, 5.0)  # a long request: never trimmed under it
    assert not d.step(3, 0, 5.5)  # it ended: the quiet spell starts now
    assert d.step(3, 0, 6.5)


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.floats(0, 3)), max_size=40))
def test_trims_only_after_a_quiet_spell_and_never_twice_for_one_count(
    steps: list[tuple[int, int, float]],
) -> None:
    d = IdleTrim(idle_s=1.0)
    now = 0.0
    last: tuple[int, int] | None = None
    quiet_since = 0.0
    trimmed: set[int] = set()
    count = 0
    for bump, in_flight, dt in steps:
        now += dt
        count += bump
        if (count, in_flight) != last or in_flight:
            quiet_since = now
        last = (count, in_flight)
        if d.step(count, in_flight, now):
            assert in_flight == 0
            assert now - quiet_since >= 1.0
            assert count not in trimmed
            trimmed.add(count)


def test_malloc_trim_is_glibcs_here() -> None:
    assert sys.platform == "linux"
    assert memtrim.trim_available()
    assert isinstance(memtrim.malloc_trim(), bool)


@dataclass
class _Stats:
    admitted: int = 0
    rejected: int = 0


@dataclass
class _Admission:
    ongoing: int = 0


@dataclass
class _Runtime:
    stats: _Stats = field(default_factory=_Stats)
    admission: _Admission = field(default_factory=_Admission)


async def test_the_replica_trims_its_heap_when_it_goes_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    runtime = _Runtime()
    monkeypatch.setattr(memtrim, "trim_available", lambda: True)

    def trim() -> bool:
        calls.append(runtime.stats.admitted)
        return True

    monkeypatch.setattr(memtrim, "malloc_trim", trim)
    monkeypatch.setattr(memtrim, "IDLE_S", 0.05)
    monkeypatch.setattr(memtrim, "PERIOD_S", 0.01)
    task = asyncio.create_task(replica_main.idle_trim(runtime))  # type: ignore[arg-type]
    try:
        await eventually(lambda: calls == [0], what="the trim once the replica is up and idle")
        runtime.admission.ongoing = 1  # a request runs (HTTP or NATS)
        runtime.stats.admitted = 1
        await asyncio.sleep(0.2)
        assert calls == [0], "no trim while a request runs"
        runtime.admission.ongoing = 0
        await eventually(lambda: calls == [0, 1], what="a trim after the request, once idle")
        await asyncio.sleep(0.2)
        assert calls == [0, 1], "an idle replica is not trimmed over and over"
        runtime.stats.rejected = 1  # refused requests are activity too
        await eventually(lambda: calls == [0, 1, 1], what="a trim after a refused request")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_the_replica_http_server_does_not_import_the_reloaders_file_watcher() -> None:
    """uvicorn's package pulls in watchfiles for its --reload; the embedded server never reloads
    (about 0.8 MB resident per replica measured). User code can still import it afterwards."""
    code = textwrap.dedent("""
        import sys
        import services.replica.http_server
        print("watchfiles" in sys.modules)
        import watchfiles
        print(watchfiles.__name__)
    """)
    res = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["False", "watchfiles"]

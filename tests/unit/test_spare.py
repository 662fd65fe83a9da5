"""The pure pieces of spare replica processes: the order a spare reads, where PYTHONPATH goes
on its sys.path, and when a spare starts a replica as a cold start would."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.agent.spare import same_start
from services.replica.spare import BadOrder, read_order, set_pythonpath

GOOD = {"args": ["--app", "a"], "env": {"K": "v"}, "cwd": "/w", "log": "/l/r.log"}


def test_an_order_is_read_back() -> None:
    assert read_order(json.dumps(GOOD).encode() + b"\n") == GOOD


@pytest.mark.parametrize(
    "line",
    [
        b"not json",
        b"[]",
        json.dumps({**GOOD, "extra": 1}).encode(),
        json.dumps({k: v for k, v in GOOD.items() if k != "log"}).encode(),
        json.dumps({**GOOD, "args": "--app a"}).encode(),
        json.dumps({**GOOD, "args": ["--x", 1]}).encode(),
        json.dumps({**GOOD, "env": {"K": 1}}).encode(),
        json.dumps({**GOOD, "cwd": None}).encode(),
    ],
)
def test_anything_else_is_a_bad_order(line: bytes) -> None:
    with pytest.raises(BadOrder):
        read_order(line)


def test_pythonpath_goes_right_after_the_first_entry() -> None:
    path = ["/work", "/stdlib", "/agent-paths", "/site"]
    set_pythonpath(path, os.pathsep.join(["/mine", "/agent-paths"]))
    assert path == ["/work", "/mine", "/agent-paths", "/stdlib", "/site"]
    started = ["/work", "/work", "/stdlib"]  # `python -m` in /work with PYTHONPATH=/work
    set_pythonpath(started, "/work")
    assert started == ["/work", "/work", "/stdlib"]  # the same again: nothing moves


paths = st.lists(st.sampled_from(["/a", "/b", "/c", "/d", "/e"]), max_size=6)


@given(path=paths.filter(bool), entries=paths)
def test_pythonpath_entries_come_first_in_order_and_nothing_is_lost(
    path: list[str], entries: list[str]
) -> None:
    before = list(path)
    set_pythonpath(path, os.pathsep.join(entries))
    assert path[0] == before[0]
    assert set(path) == set(before) | set(entries)
    wanted = list(dict.fromkeys(entries))
    assert path[1 : 1 + len(wanted)] == wanted


def test_the_same_start_is_the_same_python_startup_variables() -> None:
    spare = {"PATH": "/bin", "PYTHONUNBUFFERED": "1", "PYTHONPATH": "/x"}
    assert same_start(spare, {**spare, "OTHER": "1"})
    assert same_start(spare, {"PYTHONUNBUFFERED": "1", "PYTHONPATH": "/x"})  # PATH: applied
    assert not same_start(spare, {**spare, "PYTHONPATH": "/y:/x"})  # import roots: cold
    assert not same_start(spare, {**spare, "PYTHONOPTIMIZE": "1"})
    assert not same_start(spare, {k: v for k, v in spare.items() if k != "PYTHONUNBUFFERED"})
    assert not same_start(spare, {**spare, "PYTHONUNBUFFERED": "0"})

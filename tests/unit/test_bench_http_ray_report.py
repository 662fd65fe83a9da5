"""http_ray's report: the floor decomposition and the ratio verdicts, from results alone."""

from __future__ import annotations

from typing import Any

import pytest

from scripts.bench.http_ray_report import above_floor, evaluate


def _system(p50_ms: float) -> dict[str, Any]:
    return {"workloads": {"http_seq_256": {"p50_ms": p50_ms}}}


def test_above_floor_splits_each_p50_into_floor_and_replica() -> None:
    res = {"fleetpulse": _system(0.25), "ray-fastest": _system(0.40), "floor": _system(0.15)}
    got = above_floor(res)
    assert got is not None
    assert got["floor_ratio"] == pytest.approx(0.375)
    assert got["fleetpulse_above_ms"] == pytest.approx(0.10)
    assert got["ray_fastest_above_ms"] == pytest.approx(0.25)
    assert got["above_ratio"] == pytest.approx(0.4)


@pytest.mark.parametrize("missing", ["fleetpulse", "ray-fastest", "floor"])
def test_above_floor_needs_all_three(missing: str) -> None:
    res = {"fleetpulse": _system(0.25), "ray-fastest": _system(0.40), "floor": _system(0.15)}
    del res[missing]
    assert above_floor(res) is None


def test_a_floor_above_ray_gives_no_split() -> None:
    res = {"fleetpulse": _system(0.25), "ray-fastest": _system(0.10), "floor": _system(0.15)}
    assert above_floor(res) is None


def test_the_floor_is_a_column_not_the_compared_system() -> None:
    res = {"fleetpulse": _system(0.25), "ray-fastest": _system(0.40), "floor": _system(0.15)}
    row = next(r for r in evaluate(res) if r["metric"].startswith("HTTP sequential p50, 256"))
    assert row["values"]["floor"] == pytest.approx(0.15)
    assert row["ratio"] == pytest.approx(0.625) and row["pass"] is False

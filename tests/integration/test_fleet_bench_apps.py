"""The fleet benchmark's many-apps shape end to end, small: a real controller process (or a group
of three on a 3-node cluster) against the many-apps simulator, measured from its stats files."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from scripts.bench.fleet import Point, parser, with_defaults

pytestmark = pytest.mark.timeout(240)


def args(tmp_path: Path, *extra: str) -> tuple[Point, int]:
    a = with_defaults(parser().parse_args([
        "--apps", "30", "--routers", "2", "--warm-s", "3", "--measure-s", "4", "--faults", "0",
        "--retention-s", "60", "--startup-timeout-s", "120", *extra,
    ]))  # fmt: skip
    return Point(30 * a.replicas_per_app, a, tmp_path, apps=30), 30 * a.replicas_per_app


async def test_many_apps_on_one_member(tmp_path: Path) -> None:
    point, n = args(tmp_path)
    (row,) = await point.run()
    assert row["apps"] == 30 and row["replicas"] == n == 120 and row["members"] == 1
    (m,) = row["per_member"]
    assert m["ticks"] > 10 and math.isfinite(m["loop_p99_ms"]) and m["cpu"] > 0
    assert row["probes_healthy"] == 0
    assert row["sent_per_s"]["handle_msgpack"] > 0  # 60 routers every 10 s
    assert row["late_max_s"] < 5.0  # the simulator ran its events


async def test_many_apps_over_three_members_on_three_nodes(tmp_path: Path) -> None:
    point, _ = args(tmp_path, "--members", "3", "--nodes", "3")
    (row,) = await point.run()
    assert row["members"] == 3 and row["nodes"] == 3
    shares = {m["member"]: m for m in row["per_member"]}
    assert sorted(m["partitions"] for m in shares.values()) == [5, 5, 6]
    assert sum(m["apps"] for m in shares.values()) == 30
    assert all(m["ticks"] > 10 for m in shares.values())

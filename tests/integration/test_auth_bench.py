"""The auth benchmark's code, small (scripts/bench/auth.py): both sides serve, both storms connect."""

from __future__ import annotations

import pytest

from scripts.bench.auth import parser, run

pytestmark = pytest.mark.timeout(180)


async def test_auth_bench_small() -> None:
    res = await run(
        parser().parse_args(
            ["--requests", "40", "--rounds", "2", "--connections", "20", "--storms", "1"]
        )
    )
    assert set(res["request"]) == {"off", "on"}
    assert all(v["n"] == 40 for v in res["request"].values())
    (off,), (on,) = res["storm"]["off"], res["storm"]["on"]
    assert off["connections"] == on["connections"] == 20
    assert off["auth_cpu_s"] == 0 and on["refused_then_retried"] == 0

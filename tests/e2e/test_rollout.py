"""A rolling update of real replica processes under steady load loses no request: through a
DeploymentHandle and through the HTTP proxy, at the default surge and at a larger one, with
`fleetpulse controller`, `fleetpulse agent`, the proxy and `fleetpulse deploy` as processes
(the harness is scripts/bench/rollout_live.py, which measures the same at a larger size)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.bench.rollout_live import run

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(420)
async def test_rolling_update_under_load_loses_no_request(tmp_path: Path) -> None:
    rolls = await run(
        replicas=6, surges=["1", "50%"], unavailable=["0", "0"], callers=3, delay_s=0.05,
        tmp=tmp_path,
    )  # fmt: skip
    assert [r.version for r in rolls] == ["v2", "v3"]  # both completed (run waits for it)
    for r in rolls:
        for path, tally in (("handle", r.handle), ("http", r.http)):
            assert tally.failed == 0, (r.surge, path, tally.errors.most_common(3))
            assert tally.ok == tally.sent and tally.sent > 50, (r.surge, path, tally)
    default, wide = rolls
    # the surge as the targets show it (not as wall time, which a busy machine blurs): one new
    # replica at a time, then three at once
    assert default.peak_targets == 6 + 1, default
    assert wide.peak_targets > 6 + 1, wide

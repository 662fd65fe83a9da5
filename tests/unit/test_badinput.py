import logging

import pytest

from shared.badinput import BadInput
from shared.clock import FakeClock


def test_counts_every_drop_but_logs_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    bad = BadInput("test-sub", logging.getLogger("t"), clock=clock, interval_s=5.0)
    with caplog.at_level(logging.WARNING):
        for _ in range(100):
            bad.drop("truncated", "x")
        bad.drop("bad_magic")
        clock.advance(5.0)
        bad.drop("truncated")
    assert bad.counts["truncated"] == 101 and bad.counts["bad_magic"] == 1
    assert bad.total == 102
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert "99 more since last report" in lines[-1]

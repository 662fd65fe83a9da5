"""The router's request counters (HandleReport.stats): what the what-if model calibrates from."""

from __future__ import annotations

from services.router.reports import RequestCounters, build_handle_report
from shared.wire import codec
from shared.wire.messages import HandleReport, RequestStats


def test_counters_accumulate_and_ride_on_the_report() -> None:
    c = RequestCounters()
    c.arrived += 3
    c.completed(0.5, 0.2, 1)
    c.completed(-1e-9, 0.3, 3)  # clock noise never makes a negative wait
    c.failed("backpressure")
    c.failed("deadline_exceeded")
    c.failed("user_error")  # neither rejected nor timed out
    s = c.snapshot()
    assert s == RequestStats(3, 2, 0.5, 0.2**2 + 0.3**2, 0.5, 1, 1, 4, 10, 1 * 0.2 + 3 * 0.3)
    report = build_handle_report(
        handle_id="h", app="a", deployment="d", seq=1, sent_at=1.0, queued_requests=0.0,
        running={}, carried_health=(), membership_epoch=0, stats=s,
    )  # fmt: skip
    assert codec.decode_as(codec.encode(report), HandleReport).stats == s

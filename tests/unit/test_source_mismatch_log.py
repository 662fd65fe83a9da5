"""The controller logs reports dropped for speaking for another source: counted, rate-limited."""

from __future__ import annotations

import logging

import pytest

from services.controller.core import ControllerConfig
from services.controller.service import MISMATCH_LOG_INTERVAL_S, ControllerService, ServiceConfig
from services.controller.source_check import SOURCE_MISMATCH
from shared.clock import FakeClock


def test_mismatches_are_logged_at_most_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    svc = ControllerService(ServiceConfig("nats://127.0.0.1:1", ControllerConfig()), clock=clock)
    caplog.set_level(logging.WARNING, logger="services.controller.service")
    svc._log_mismatches()
    assert caplog.records == []  # nothing dropped, nothing said
    svc.core.stats.dropped[SOURCE_MISMATCH] += 3
    svc._log_mismatches()
    assert "dropped 3 report(s)" in caplog.text and "(3 so far)" in caplog.text
    caplog.clear()
    svc.core.stats.dropped[SOURCE_MISMATCH] += 2
    svc._log_mismatches()
    assert caplog.records == []  # within the interval: counted, not logged
    clock.advance(MISMATCH_LOG_INTERVAL_S)
    svc._log_mismatches()
    assert "dropped 2 report(s)" in caplog.text and "(5 so far)" in caplog.text

"""serve.run's driver side without a system: what is refused before anything starts."""

from __future__ import annotations

import sys

import pytest

from fleetpulse import serve

run_module = sys.modules["fleetpulse.serve.run"]


@pytest.fixture(autouse=True)
def no_system(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEETPULSE_NATS_URL", raising=False)
    monkeypatch.setattr(run_module, "_http_options", {})
    monkeypatch.setattr(run_module, "_driver", None)


def test_http_options_are_checked_as_the_proxy_checks_its_port() -> None:
    with pytest.raises(
        ValueError, match=r"http_options\['port'\] must be in 0\.\.65535, not 70000"
    ):
        serve.start(http_options={"port": 70000})
    assert run_module._driver is None  # nothing started


def test_ignored_arguments_warn() -> None:
    with pytest.warns(UserWarning, match="grpc_options is ignored"), pytest.raises(ValueError):
        serve.start(grpc_options={"port": 9000}, http_options={"port": -1})

"""ProxyConfig from flags, environment and defaults."""

from __future__ import annotations

import argparse

import pytest

from services.proxy.config import ProxyConfig, add_proxy_arguments
from services.router.config import RouterConfig
from shared.errors import ConfigError


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_proxy_arguments(p)
    args = p.parse_args(argv)
    args.nats = "nats://127.0.0.1:4999"
    return args


def test_defaults() -> None:
    cfg = ProxyConfig.from_args(parse(), env={})
    assert (cfg.host, cfg.port, cfg.namespace) == ("127.0.0.1", 8000, "fp")
    assert (cfg.max_held_per_app, cfg.max_wait_s, cfg.retry_after_s) == (1000, 60.0, 5)
    assert cfg.request_timeout_s is None and cfg.publish_routes
    assert cfg.router_config.max_queued_requests >= cfg.max_held_per_app


def test_flags_over_env_over_defaults() -> None:
    env = {
        "FLEETPULSE_PROXY_HOST": "0.0.0.0",
        "FLEETPULSE_PROXY_PORT": "9000",
        "FLEETPULSE_NAMESPACE": "blue",
        "FLEETPULSE_METRICS_INTERVAL_S": "2",
    }
    cfg = ProxyConfig.from_args(parse(), env=env)
    assert (cfg.host, cfg.port, cfg.namespace) == ("0.0.0.0", 9000, "blue")
    assert cfg.router.metrics_interval_s == 2.0
    cfg = ProxyConfig.from_args(
        parse("--port", "0", "--max-held", "5000", "--max-wait", "3", "--retry-after", "1",
              "--request-timeout", "9", "--metrics-interval", "0.5", "--no-publish-routes"),
        env=env,
    )  # fmt: skip
    assert cfg.port == 0 and cfg.max_held_per_app == 5000 and cfg.max_wait_s == 3.0
    assert cfg.retry_after_s == 1 and cfg.request_timeout_s == 9.0 and not cfg.publish_routes
    assert cfg.router.metrics_interval_s == 0.5
    # the routers' queues never refuse what the hold bound admits
    assert cfg.router_config.max_queued_requests == 5000


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"port": 70000}, "port"),
        ({"max_wait_s": 0.0}, "max_wait_s"),
        ({"request_timeout_s": float("inf")}, "request_timeout_s"),
        ({"max_held_per_app": -1}, "max_held_per_app"),
        ({"retry_after_s": -1}, "retry_after_s"),
    ],
)
def test_bad_values_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        ProxyConfig(nats_url="nats://x", router=RouterConfig(), **kwargs)  # type: ignore[arg-type]


def test_bad_env_port_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="FLEETPULSE_PROXY_PORT"):
        ProxyConfig.from_args(parse(), env={"FLEETPULSE_PROXY_PORT": "eighty"})

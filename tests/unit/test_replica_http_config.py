"""Which replicas serve HTTP (shared/replicahttp.py, the controller's marking of the ingress),
and where they bind and what they announce (the agent's settings, passed in the environment)."""

from __future__ import annotations

import argparse

import pytest

from services.agent.config import AgentConfig, add_agent_arguments, config_from_args
from services.controller.core import ControllerConfig, ControllerCore
from shared import settings
from shared.appconfig import AppConfig, DeploymentConfig
from shared.errors import ConfigError
from shared.replicahttp import ROUTE_PREFIX_ENV, ingress_name, route_prefix_of, with_serving_env

ECHO = "services.examples.echo:Echo"
API, SIDE = DeploymentConfig("Api", ECHO), DeploymentConfig("Side", ECHO, env={"A": "1"})


def test_the_ingress_is_the_named_one_else_the_first_and_none_without_a_route() -> None:
    assert ingress_name(AppConfig("a", (API, SIDE), route_prefix="/a", ingress="Side")) == "Side"
    assert ingress_name(AppConfig("a", (API, SIDE), route_prefix="/a")) == "Api"
    assert ingress_name(AppConfig("a", (API, SIDE))) is None


def test_only_the_ingress_gets_the_route_prefix_in_its_env() -> None:
    app = AppConfig("a", (API, SIDE), route_prefix="/a", ingress="Side")
    assert with_serving_env(app, API) is API
    side = with_serving_env(app, SIDE)
    assert dict(side.env) == {"A": "1", ROUTE_PREFIX_ENV: "/a"}
    assert with_serving_env(app, side) is side  # already marked: the same config
    assert route_prefix_of(side.env) == "/a"
    assert route_prefix_of({}) is None and route_prefix_of({ROUTE_PREFIX_ENV: ""}) is None
    # part of the version: a route given, changed or taken away rolls the ingress only
    assert app.version_of(side) != app.version_of(SIDE)
    moved = with_serving_env(AppConfig("a", (API, SIDE), route_prefix="/b", ingress="Side"), SIDE)
    assert app.version_of(moved) != app.version_of(side)


def test_the_controller_starts_the_ingress_replicas_with_the_marking() -> None:
    core = ControllerCore(ControllerConfig())
    app = AppConfig("a", (API, SIDE), route_prefix="/a", ingress="Api")
    core.set_apps({"a": app}, 0.0)
    api, side = core.deployments[("a", "Api")], core.deployments[("a", "Side")]
    assert api.cfg.env == {ROUTE_PREFIX_ENV: "/a"}
    assert side.cfg == SIDE
    spec = api.kv.spec_of(api.state.version)
    assert spec is not None and spec.env == {ROUTE_PREFIX_ENV: "/a"}
    # the same app again changes nothing (no new version, no reconfigure)
    version = api.state.version
    core.set_apps({"a": app}, 1.0)
    assert core.deployments[("a", "Api")].state.version == version


def parse(*argv: str) -> AgentConfig:
    p = argparse.ArgumentParser()
    p.add_argument("--nats", default="nats://127.0.0.1:1")
    add_agent_arguments(p)
    return config_from_args(p.parse_args(argv))


def test_agent_passes_bind_and_advertised_host_to_replicas(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("FLEETPULSE_REPLICA_HTTP_HOST", raising=False)
    monkeypatch.delenv("FLEETPULSE_REPLICA_HTTP_ADVERTISE", raising=False)
    default = parse()
    assert default.replica_http_env() == {
        "FLEETPULSE_REPLICA_HTTP_HOST": "127.0.0.1",
        "FLEETPULSE_REPLICA_HTTP_ADVERTISE": "127.0.0.1",  # the bind host
    }
    flags = parse("--replica-http-host", "0.0.0.0", "--replica-http-advertise", "node-3.lan")
    assert flags.replica_http_env() == {
        "FLEETPULSE_REPLICA_HTTP_HOST": "0.0.0.0",
        "FLEETPULSE_REPLICA_HTTP_ADVERTISE": "node-3.lan",
    }
    wild = parse("--replica-http-host", "0.0.0.0")
    assert wild.replica_http_env("node-9")["FLEETPULSE_REPLICA_HTTP_ADVERTISE"] == "node-9"
    monkeypatch.setenv("FLEETPULSE_REPLICA_HTTP_ADVERTISE", "::1")
    assert parse().replica_http_advertise == "::1"


@pytest.mark.parametrize("bad", ["", "host:80", "http://h", "a b", "[::1"])
def test_a_bad_host_is_refused_naming_where_it_came_from(
    bad: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert settings.REPLICA_HTTP_HOST.problem(bad) is not None
    with pytest.raises(ConfigError):
        AgentConfig(nats_url="nats://x:1", replica_http_host=bad)
    if bad:
        monkeypatch.setenv("FLEETPULSE_REPLICA_HTTP_ADVERTISE", bad)
        with pytest.raises(ConfigError, match="FLEETPULSE_REPLICA_HTTP_ADVERTISE"):
            parse()


@pytest.mark.parametrize("good", ["127.0.0.1", "0.0.0.0", "::", "::1", "node-3.lan", "localhost"])
def test_good_hosts(good: str) -> None:
    assert settings.REPLICA_HTTP_HOST.problem(good) is None
    assert settings.REPLICA_HTTP_ADVERTISE.problem(good) is None

"""ray_actor_options, max_replicas_per_node, max_queued_requests and logging_config: from YAML to
fp_apps and back, into the replica spec and the router's member values, and applied in the
replica (log level, JSON, access log, logs_dir)."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.agent.config import AgentConfig, machine_resources
from services.controller.core import ControllerConfig, ControllerCore
from services.controller.kv_delta import PutDoc
from services.replica import logsetup
from shared import logconfig
from shared.appconfig import AppConfig, DeploymentConfig
from shared.appyaml import parse_apps
from shared.errors import ConfigError
from shared.kv.membership import Member
from shared.replicaspec import ReplicaSpec
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.wire.codec import encode
from shared.wire.messages import Lifecycle
from tests.unit.test_replica_runtime import buses, call, collect, make_replica

__all__ = ["buses"]  # a fixture, used by name

RAY_STYLE = """
applications:
  - name: llm
    route_prefix: /llm
    deployments:
      - name: Model
        import_path: services.examples.echo:Echo
        ray_actor_options:
          num_cpus: 2
          num_gpus: 0.25
          memory: 4294967296
          resources: {nvme: 1}
        max_replicas_per_node: 2
        max_queued_requests: 50
        logging_config:
          log_level: debug
          encoding: JSON
          enable_access_log: false
"""


def test_ray_keys_parse_and_round_trip_through_fp_apps() -> None:
    (app,) = parse_apps(textwrap.dedent(RAY_STYLE))
    d = app.deployments[0]
    assert d.resources == {"cpus": 2.0, "gpus": 0.25, "memory": 4294967296.0, "nvme": 1.0}
    assert (d.max_replicas_per_node, d.max_queued_requests) == (2, 50)
    assert d.logging_config == {
        "log_level": "DEBUG", "encoding": "JSON", "enable_access_log": False, "logs_dir": None,
    }  # fmt: skip
    assert AppConfig.from_json(app.to_json()) == app
    spec = d.replica_spec()
    assert spec.resources == d.resources and spec.logging_config == d.logging_config
    assert ReplicaSpec.from_doc(spec.to_doc()) == spec


def test_defaults_are_rays_and_old_specs_keep_their_bytes_and_versions() -> None:
    d = DeploymentConfig("A", "m:A")
    assert (d.resources, d.max_replicas_per_node, d.max_queued_requests) == ({}, None, -1)
    spec = d.replica_spec()
    doc = spec.to_doc()
    assert "resources" not in doc and "logging_config" not in doc
    assert "--resources" not in spec.argv() and "--logging-config" not in spec.argv()
    # a spec without the new settings hashes as before they existed: no rollout on upgrade
    assert spec.version() == "36e2b6637b"  # what the version was before these settings
    assert DeploymentConfig("A", "m:A", resources={"gpus": 1.0}).replica_spec().version() != (
        spec.version()
    )


def test_null_ray_actor_options_and_logging_config_are_not_given() -> None:
    text = """
    applications:
      - name: a
        deployments:
          - {name: A, import_path: m:A, ray_actor_options: null, logging_config: null}
    """
    (app,) = parse_apps(textwrap.dedent(text))
    assert app.deployments[0].resources == {} and app.deployments[0].logging_config == {}


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ({}, logconfig.DEFAULTS),
        ({"log_level": 10}, {**logconfig.DEFAULTS, "log_level": "DEBUG"}),
        ({"log_level": "warn"}, {**logconfig.DEFAULTS, "log_level": "WARNING"}),
        (
            {"encoding": "json", "logs_dir": "logs"},
            {**logconfig.DEFAULTS, "encoding": "JSON", "logs_dir": "logs"},
        ),
    ],
)
def test_logging_config_normalises_to_rays_defaults(raw: dict[str, Any], want: Any) -> None:
    assert logconfig.normalise(raw) == dict(want)


def test_logging_config_refusals_name_the_key() -> None:
    with pytest.raises(ConfigError, match="additional_log_standard_attrs: not supported"):
        logconfig.normalise({"additional_log_standard_attrs": ["name"]})
    with pytest.raises(ConfigError, match="colour: unknown key"):
        logconfig.normalise({"colour": "red"})


def test_the_controller_tells_routers_the_deployments_queue_bound() -> None:
    def members(bound: int) -> list[Member]:
        d = DeploymentConfig("A", "m:A", num_replicas=1, max_queued_requests=bound)
        core.set_apps({"x": AppConfig("x", (d,), version="1")}, t[0])
        t[0] += 0.1
        return [
            a.doc
            for a in core.tick(t[0], 1.7e9 + t[0])
            if isinstance(a, PutDoc) and isinstance(a.doc, Member)
        ]

    core, t = ControllerCore(ControllerConfig()), [1.0]
    assert members(-1) == []
    (rid,) = core.deployments[("x", "A")].state.replicas
    for state in ("starting", "ready"):
        ev = Lifecycle(rid, "", state, 1.7e9, S.rpc("x", "A", rid), "1", None, "x", "A")
        core.ingest(S.report("lifecycle", "x", "A"), encode(ev), t[0])
    (m,) = members(-1)
    assert m.max_queued_requests is None  # -1: the router's own bound
    (m,) = members(7)  # a change of the bound rewrites the member, as the report interval does
    assert m.max_queued_requests == 7


def test_agents_offer_the_machines_cpus_and_memory_unless_told(tmp_path: Path) -> None:
    machine = machine_resources()
    assert machine["cpus"] >= 1 and machine["memory"] > 0
    cfg = AgentConfig(nats_url="nats://x", workdir=str(tmp_path), resources={"gpus": 2.0})
    assert cfg.offer == {**machine, "gpus": 2.0}
    cfg = AgentConfig(nats_url="nats://x", workdir=str(tmp_path), resources={"cpus": 3.0})
    assert cfg.offer["cpus"] == 3.0
    with pytest.raises(ConfigError, match="whole number of GPU devices"):
        AgentConfig(nats_url="nats://x", workdir=str(tmp_path), resources={"gpus": 1.5})


@contextlib.contextmanager
def restored_root_logging() -> Iterator[io.StringIO]:
    """The root logger with one handler, writing to the yielded buffer; afterwards its level, its
    handlers and their formatters as before. logsetup.apply sets the formatter of every handler on
    the root logger, and in a test those include pytest's capture handlers (added again for the
    call phase, after the fixtures' setup, and kept for the whole session): left with the JSON
    formatter, they no longer set `record.message`, which later tests' caplog.records need."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    formatters = {h: h.formatter for h in handlers}
    buf = io.StringIO()
    root.handlers = [logging.StreamHandler(buf)]
    try:
        yield buf
    finally:
        for h in root.handlers:
            if h not in formatters:
                h.close()
        root.setLevel(level)
        root.handlers = handlers
        for h, formatter in formatters.items():
            h.setFormatter(formatter)


@pytest.fixture
def root_logging() -> Iterator[io.StringIO]:
    with restored_root_logging() as buf:
        yield buf


def test_applying_a_logging_config_in_a_test_leaves_pytest_s_handlers_as_they_were(
    caplog: pytest.LogCaptureFixture,
) -> None:
    root = logging.getLogger()
    level, formatters = root.level, {h: h.formatter for h in root.handlers}
    assert caplog.handler in formatters
    with restored_root_logging():
        root.addHandler(caplog.handler)  # as pytest does when the test's call phase starts
        logsetup.apply(
            logconfig.normalise({"encoding": "JSON", "log_level": "ERROR"}),
            app="a", deployment="d", replica_id="r1",
        )  # fmt: skip
        assert isinstance(caplog.handler.formatter, logsetup.JsonFormatter)
    assert root.level == level
    assert {h: h.formatter for h in root.handlers} == formatters


def test_json_encoding_level_and_logs_dir_apply_in_the_replica(
    root_logging: io.StringIO, tmp_path: Path
) -> None:
    config = logconfig.normalise(
        {"encoding": "JSON", "log_level": "WARNING", "logs_dir": str(tmp_path / "logs")}
    )
    path = logsetup.apply(config, app="a", deployment="d", replica_id="r1")
    log = logging.getLogger("user.model")
    log.info("not at WARNING")
    log.warning("cache %s", "cold")
    (line,) = root_logging.getvalue().splitlines()
    doc = json.loads(line)
    assert doc["message"] == "cache cold" and doc["level"] == "WARNING"
    assert (doc["app"], doc["deployment"], doc["replica"]) == ("a", "d", "r1")
    assert path == tmp_path / "logs" / "replica_a_d_r1.log"
    for h in logging.getLogger().handlers:
        h.flush()
    assert json.loads(path.read_text().strip())["message"] == "cache cold"


def test_no_logging_config_leaves_logging_alone(root_logging: io.StringIO) -> None:
    level = logging.getLogger().level
    assert logsetup.apply({}, app="a", deployment="d", replica_id="r1") is None
    assert logging.getLogger().level == level and root_logging.getvalue() == ""


async def test_the_access_log_has_a_line_per_request(
    buses: Any, caplog: pytest.LogCaptureFixture
) -> None:
    rbus, cbus = buses
    caplog.set_level(logging.INFO, logger=logsetup.ACCESS_LOGGER)
    rt = await make_replica(rbus, logging_config=logconfig.normalise({}))
    try:
        await collect(cbus, call("echo", 1))
        await collect(cbus, call("no_such_method"))
        # HTTP requests and WebSockets the replica serves itself: named by method and path
        assert rt.admit_http()
        rt.release_http(rt.clock.monotonic(), "ok", {"method": "POST", "path": "/echo"})
        assert rt.admit_http()
        rt.release_http(rt.clock.monotonic(), "cancelled", {"type": "websocket", "path": "/ws"})
    finally:
        await rt.stop()
    lines = [r for r in caplog.records if r.name == logsetup.ACCESS_LOGGER]
    assert [(r.method, r.outcome) for r in lines] == [  # type: ignore[attr-defined]
        ("echo", "ok"), ("no_such_method", "method_not_found"),
        ("POST /echo", "ok"), ("WS /ws", "cancelled"),
    ]  # fmt: skip


async def test_the_access_log_is_off_without_logging_config_or_when_disabled(
    buses: Any, caplog: pytest.LogCaptureFixture
) -> None:
    rbus, cbus = buses
    caplog.set_level(logging.INFO, logger=logsetup.ACCESS_LOGGER)
    for config in ({}, logconfig.normalise({"enable_access_log": False})):
        rt = await make_replica(rbus, logging_config=config)
        try:
            await collect(cbus, call("echo", 1))
        finally:
            await rt.stop()
    assert not [r for r in caplog.records if r.name == logsetup.ACCESS_LOGGER]


def test_an_app_level_logging_config_is_each_deployment_s_that_sets_none() -> None:
    """As in Ray Serve: the application's logging_config applies to its deployments, and a
    deployment's own replaces it."""
    app = parse_apps(
        """
applications:
  - name: shop
    logging_config: {encoding: JSON, log_level: DEBUG}
    deployments:
      - {name: A, import_path: m:A}
      - {name: B, import_path: m:B, logging_config: {log_level: WARNING}}
"""
    )[0]
    a, b = app.deployments
    assert a.logging_config["encoding"] == "JSON" and a.logging_config["log_level"] == "DEBUG"
    assert b.logging_config["log_level"] == "WARNING" and b.logging_config["encoding"] == "TEXT"
    with pytest.raises(ConfigError, match=r"applications\[0\]\.logging_config\.encoding"):
        parse_apps(
            """
applications:
  - name: shop
    logging_config: {encoding: XML}
    deployments: [{name: A, import_path: m:A}]
"""
        )

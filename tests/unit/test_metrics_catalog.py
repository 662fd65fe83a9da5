"""shared/metrics_catalog.py against the metrics modules, and the shared `--metrics-port` flag."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics import MetricWrapperBase

import services.agent.metrics
import services.auth.metrics
import services.controller.metrics
import services.recorder.metrics
import services.replica.metrics
import services.router.metrics
from services.agent.config import add_agent_arguments
from services.agent.procs import child_env
from services.auth.config import add_auth_arguments
from services.controller.__main__ import add_controller_arguments
from services.proxy.metrics import ProxyMetrics
from services.recorder.record import add_record_arguments
from services.replica.config import add_replica_arguments
from services.router.config import GatewayConfig, add_gateway_arguments
from shared.errors import ConfigError
from shared.metrics_catalog import ENV_METRICS_PORT, METRIC_NAMES, metrics_port

MODULES: dict[str, ModuleType] = {
    "controller": services.controller.metrics,
    "agent": services.agent.metrics,
    "router": services.router.metrics,
    "replica": services.replica.metrics,
    "recorder": services.recorder.metrics,
    "auth": services.auth.metrics,
}
_TYPE_LINE = re.compile(r"^# TYPE (\S+) \S+$", re.MULTILINE)


def exposed(registry: CollectorRegistry) -> set[str]:
    """Family names as a scrape shows them (`# TYPE` lines), without the `_created` gauges the
    client adds next to unlabelled counters and histograms."""
    names = set(_TYPE_LINE.findall(generate_latest(registry).decode()))
    return {n for n in names if not n.endswith("_created")}


def module_registry(module: ModuleType) -> CollectorRegistry:
    """A registry holding exactly the metrics a module defines (they live in the default one)."""
    registry = CollectorRegistry(auto_describe=True)
    for value in vars(module).values():
        if isinstance(value, MetricWrapperBase):
            registry.register(value)
    for collector in getattr(module, "COLLECTORS", ()):  # metrics read when scraped
        registry.register(collector)
    return registry


def test_the_catalog_covers_every_service() -> None:
    assert set(METRIC_NAMES) == {*MODULES, "proxy"}
    for service, names in METRIC_NAMES.items():
        assert len(set(names)) == len(names), service
        assert all(n.startswith(f"fleetpulse_{service}_") for n in names), service


@pytest.mark.parametrize("service", sorted(MODULES))
def test_catalog_matches_what_the_module_registers(service: str) -> None:
    assert exposed(module_registry(MODULES[service])) == set(METRIC_NAMES[service])


def test_catalog_matches_the_proxy_registry() -> None:
    assert exposed(ProxyMetrics().registry) == set(METRIC_NAMES["proxy"])


def test_the_proxy_page_also_shows_its_routers() -> None:
    page = ProxyMetrics().render().decode()
    for name in METRIC_NAMES["router"]:
        assert f"# TYPE {name} " in page


def test_metrics_are_documented() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    for names in METRIC_NAMES.values():
        for name in names:
            assert f"`{name}`" in doc, name


def _parse(add: Callable[[argparse.ArgumentParser], None], argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add(p)
    return p.parse_args(argv)


ADDERS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], list[str]]] = {
    "controller": (add_controller_arguments, []),
    "agent": (add_agent_arguments, []),
    "replica": (add_replica_arguments, ["--app", "a", "--deployment", "d", "--import-path", "m:X"]),
    "recorder": (add_record_arguments, ["--out", "rec"]),
    "auth": (add_auth_arguments, []),
}


@pytest.mark.parametrize("service", sorted(ADDERS))
def test_metrics_port_flag_then_environment_read_when_the_config_is_built(
    service: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    add, required = ADDERS[service]
    monkeypatch.setenv(ENV_METRICS_PORT, "9464")
    args = _parse(add, required)
    assert args.metrics_port is None  # the parser reads no environment
    assert metrics_port(args, {}) == 0
    assert metrics_port(args, {ENV_METRICS_PORT: "9464"}) == 9464
    assert (
        metrics_port(_parse(add, [*required, "--metrics-port", "0"]), {ENV_METRICS_PORT: "1"}) == 0
    )
    with pytest.raises(ConfigError) as bad:
        metrics_port(args, {ENV_METRICS_PORT: "many"})
    assert bad.value.field == ENV_METRICS_PORT
    with pytest.raises(ConfigError):
        metrics_port(_parse(add, [*required, "--metrics-port", "70000"]), {})


def test_gateway_metrics_port_from_flag_then_environment() -> None:
    def cfg(argv: list[str], env: dict[str, str]) -> GatewayConfig:
        args = _parse(add_gateway_arguments, argv)
        args.nats = "nats://h:1"
        return GatewayConfig.from_args(args, env)

    assert cfg([], {}).metrics_port == 0
    assert cfg([], {ENV_METRICS_PORT: "9464"}).metrics_port == 9464
    assert cfg(["--metrics-port", "9000"], {ENV_METRICS_PORT: "9464"}).metrics_port == 9000


def test_replicas_do_not_inherit_the_agents_metrics_port() -> None:
    env = child_env({ENV_METRICS_PORT: "9464", "PATH": "/bin"}, ())
    assert ENV_METRICS_PORT not in env and env["PATH"] == "/bin"


def test_the_cli_parser_registers_no_service_metrics() -> None:
    """Every service process builds the whole `fleetpulse` parser; when that imported the
    services, each process exported every service's families (on a real compose stack agents,
    the proxy and the recorder showed up as controller members owning 0 partitions)."""
    probe = (
        "import sys\n"
        "from prometheus_client import REGISTRY, generate_latest\n"
        "from services.cli import build_parser\n"
        "build_parser()\n"
        "mods = sorted(m for m in sys.modules if m.startswith('services') and m.endswith('metrics'))\n"
        "fams = sorted(set(re.findall(r'^# TYPE (fleetpulse_\\S+)', generate_latest(REGISTRY).decode(), re.M)))\n"
        "print(mods, fams)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", "import re\n" + probe],
        capture_output=True, text=True, check=True, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert out.stdout.strip() == "[] []", out.stdout + out.stderr

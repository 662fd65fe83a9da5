"""The settings table (shared/settings.py) and what derives from it: docs, flags, --help, YAML keys.

The docs cannot drift from the tables: the generated tables must be current, and the key tables
written by hand are checked key by key (and default by default for replica settings).
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from shared import replicaspec, rollout, settings
from shared.appconfig import AutoscalingConfig
from shared.appkeys import APP_KEYS, AUTOSCALING_KEYS, DEPLOYMENT_KEYS
from shared.errors import ConfigError
from shared.serveconfig import ServeChecker

ROOT = Path(__file__).resolve().parents[2]


def _gen() -> ModuleType:
    name = "gen_settings_docs"
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("doc", ["deploy.md", "operations.md"])
def test_generated_settings_tables_are_current(doc: str) -> None:
    gen = _gen()
    path = ROOT / "docs" / doc
    assert path.read_text() == gen.render(path), "run: python -m scripts.gen_settings_docs"


def test_every_settings_table_is_in_the_docs() -> None:
    gen = _gen()
    assert gen.generated_tables() == set(gen.TABLES)


def _doc_table(doc: str, heading: str) -> dict[str, list[str]]:
    """key -> the other cells, of the first table after `heading` in docs/`doc`."""
    text = (ROOT / "docs" / doc).read_text()
    after = text[text.index(heading) :]
    rows: dict[str, list[str]] = {}
    started = False
    for line in after.splitlines()[1:]:
        if line.startswith("|"):
            started = True
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            m = re.fullmatch(r"`(\w+)`", cells[0])
            if m:
                rows[m.group(1)] = cells[1:]
        elif started:
            break
    return rows


def test_the_deployments_table_lists_every_deployment_key_and_no_other() -> None:
    assert set(_doc_table("deploy.md", "### `deployments[]`")) == set(DEPLOYMENT_KEYS)


def test_the_deployments_table_shows_each_replica_settings_default_and_bound() -> None:
    rows = _doc_table("deploy.md", "### `deployments[]`")
    for p in replicaspec.PARAMS:
        if p.name not in rows or p.kind not in ("int", "float", "bool"):
            continue
        kind, default, _ = rows[p.name]
        shown = {True: "true", False: "false"}.get(p.default, f"{p.default:g}")
        assert default == f"`{shown}`", p.name
        if p.kind != "bool":
            assert f"{'>' if p.strict else '>='} {p.low:g}" in kind, p.name


def test_the_applications_table_names_only_known_keys() -> None:
    known = set(APP_KEYS) | set(ServeChecker.app_keys)
    assert set(_doc_table("deploy.md", "### `applications[]`")) <= known


def test_the_rollout_table_lists_the_rollout_settings() -> None:
    rows = _doc_table("deploy.md", "### `rollout`")
    assert set(rows) == {p.name for p in rollout.PARAMS}


def test_the_autoscaling_config_derives_from_the_table() -> None:
    assert list(AUTOSCALING_KEYS) == [s.name for s in settings.AUTOSCALING]
    defaults = AutoscalingConfig()
    for s in settings.AUTOSCALING:
        assert getattr(defaults, s.name) == s.default, s.name


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from services.cli import build_parser

    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(subs.choices)


_OWNERS = {
    "host": {"proxy"},
    "port": {"proxy"},
    "queue_group": {"router"},
    "deadline_s": {"router"},
    "issuer_seed": {"auth"},
    "max_replicas": {"agent"},
    "role_passwords_dir": {"auth"},
}
"""Settings of one command whose flag name another command uses for something else."""


@pytest.mark.parametrize(
    "setting",
    [
        s
        for s in settings.SERVICE
        + settings.OBSERVABILITY
        + settings.ROUTER
        + settings.CONTROLLER
        + settings.AGENT
        + settings.INGRESS
        + settings.RECORDER
        if s.flag is not None and s is not settings.LOG_LEVEL
    ],
    ids=lambda s: s.name,
)
def test_a_service_flag_has_one_help_and_one_behaviour(setting: settings.Setting) -> None:
    """Every command with the flag shows the row's help, and reads no environment when its
    parser is built (its default is None; the config's builder resolves it)."""
    found = []
    for name, parser in _parsers().items():
        if name not in _OWNERS.get(setting.name, {name}):
            continue  # `fleetpulse up --port` is the embedded nats-server's, say
        for action in parser._actions:
            if setting.flag in action.option_strings:
                found.append(name)
                assert action.default is None, name
                assert action.help is not None and action.help.startswith(setting.help), name
                if setting.env is not None:
                    assert f"${setting.env}" in action.help, name
    assert found, f"no command takes {setting.flag}"


def test_namespace_flag_then_environment_then_default() -> None:
    ns = settings.NAMESPACE
    assert ns.resolve("given", {"FLEETPULSE_NAMESPACE": "env"}) == "given"
    assert ns.resolve(None, {"FLEETPULSE_NAMESPACE": "env"}) == "env"
    assert ns.resolve(None, {"FLEETPULSE_NAMESPACE": ""}) == "fp"
    assert ns.resolve(None, {}) == "fp"


def test_a_bad_environment_value_names_the_variable() -> None:
    with pytest.raises(ConfigError) as bad:
        settings.ROUTER_METRICS_INTERVAL.resolve(None, {"FLEETPULSE_METRICS_INTERVAL_S": "x"})
    assert bad.value.field == "FLEETPULSE_METRICS_INTERVAL_S"
    with pytest.raises(ConfigError) as negative:
        settings.ROUTER_METRICS_INTERVAL.resolve(None, {"FLEETPULSE_METRICS_INTERVAL_S": "-1"})
    assert "must be a positive number" in str(negative.value)
    assert negative.value.source == "environment"


def test_the_controller_reads_its_environment_when_it_builds_its_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from services.controller.__main__ import config_from_args

    args = _parsers()["controller"].parse_args(["--decode-threads", "1"])
    monkeypatch.setenv("FLEETPULSE_MEMBER_ID", "c-env")
    monkeypatch.setenv("FLEETPULSE_OWNER_EPOCH", "7")
    monkeypatch.setenv("FLEETPULSE_DECODE_THREADS", "0")
    monkeypatch.setenv("FLEETPULSE_NAMESPACE", "ns2")
    args.nats = "nats://127.0.0.1:4222"
    config = config_from_args(args)
    assert (config.core.member_id, config.core.owner_epoch) == ("c-env", 7)
    assert config.core.namespace == "ns2"
    assert config.decode_threads == 1  # the flag wins


def test_log_level_flag_then_environment_then_the_commands_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from services.cli import build_parser
    from shared.cliargs import log_level

    monkeypatch.setenv("FLEETPULSE_LOG_LEVEL", "DEBUG")
    args = build_parser().parse_args(["status"])
    assert args.log_level is None  # read when the command starts, not when the parser is built
    assert log_level(args) == "DEBUG"
    monkeypatch.delenv("FLEETPULSE_LOG_LEVEL")
    assert log_level(args, "WARNING") == "WARNING"
    assert log_level(build_parser().parse_args(["--log-level", "ERROR", "status"])) == "ERROR"


def test_the_columnar_gate_reads_its_row() -> None:
    from services.router.config import RouterConfig

    row = settings.COLUMNAR_MIN_REPLICAS
    assert RouterConfig().columnar_min_replicas == row.default
    assert RouterConfig.from_env({str(row.env): "4"}).columnar_min_replicas == 4
    with pytest.raises(ConfigError) as bad:
        RouterConfig.from_env({str(row.env): "0"})
    assert bad.value.field == row.env


def test_auth_credentials_reads_the_published_url_when_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from services.auth.keys import run_credentials

    (tmp_path / "operator").write_text("pw\n")
    monkeypatch.setenv("FP_PUBLISHED_NATS_URL", "nats://env:1")
    args = _parsers()["auth-credentials"].parse_args(
        ["operator", "--role-passwords-dir", str(tmp_path)]
    )
    assert args.nats_url is None  # not read when the parser is built
    assert run_credentials(args, {"FP_PUBLISHED_NATS_URL": "nats://env:2"}) == 0
    assert "export FLEETPULSE_NATS_URL=nats://env:2" in capsys.readouterr().out.splitlines()

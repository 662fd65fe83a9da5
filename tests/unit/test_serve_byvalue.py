"""Deployments shipped by value (fleetpulse/serve/byvalue.py): what needs it, the round trip
through a file and the errors a replica reports when it cannot load one."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

from fleetpulse.serve import byvalue
from tests.unit.serve_apps import graphs


def make_local() -> type:
    class Counter:
        def __init__(self, start: int) -> None:
            self.n = start

        def __call__(self) -> int:
            self.n += 1
            return self.n

    return Counter


def test_what_a_replica_cannot_import_by_name_goes_by_value() -> None:
    assert byvalue.needs_by_value(make_local())
    main_class: Any = type("FromScript", (), {"__module__": "__main__"})
    assert byvalue.needs_by_value(main_class)
    leaf: Any = graphs.Leaf
    assert not byvalue.needs_by_value(leaf.func_or_class)


def test_a_shipped_class_loads_through_the_module_attribute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = make_local()
    name = byvalue.ship(counter, tmp_path)
    assert name.startswith("Counter_")
    assert byvalue.ship(counter, tmp_path) == name  # content-addressed: same class, same name
    assert len(list(tmp_path.iterdir())) == 1
    monkeypatch.setenv(byvalue.ENV_DIR, str(tmp_path))
    module = importlib.import_module("fleetpulse.serve.byvalue")
    try:
        cls = getattr(module, name)
        assert cls(41)() == 42
    finally:
        vars(module).pop(name, None)


def test_a_fastapi_app_with_state_round_trips(tmp_path: Path) -> None:
    from fastapi import FastAPI

    api = FastAPI()
    api.state.answer = 42

    def make() -> Any:
        class Holder:
            app = api

        return Holder

    name = byvalue.ship(make(), tmp_path)
    holder = byvalue.load(name, str(tmp_path))
    assert holder.app.state.answer == 42


def test_load_errors_say_what_is_wrong(tmp_path: Path) -> None:
    name = byvalue.ship(make_local(), tmp_path)
    with pytest.raises(byvalue.ByValueError, match=r"\$FLEETPULSE_SERVE_BYVALUE_DIR is not set"):
        byvalue.load(name, None)
    with pytest.raises(byvalue.ByValueError, match="the machine that ran the script"):
        byvalue.load(name, str(tmp_path / "elsewhere"))
    (tmp_path / f"{name}{byvalue.SUFFIX}").write_bytes(b"tampered")
    with pytest.raises(byvalue.ByValueError, match=r"does not hold what serve\.run wrote"):
        byvalue.load(name, str(tmp_path))
    with pytest.raises(byvalue.ByValueError, match="not the name of a deployment"):
        byvalue.load("Counter", str(tmp_path))
    with pytest.raises(AttributeError):
        byvalue.__getattr__("__path__")


def test_serve_run_checks_the_app_before_starting_anything(tmp_path: Path) -> None:
    """What the app file's checker says, in code's words; a bad name is a ValueError."""
    from fleetpulse import serve
    from fleetpulse.serve import scriptapps

    counter = serve.deployment(make_local())
    config, ingress = scriptapps.app_config(counter.bind(1), "default", "/", None, tmp_path)
    (dep,) = config.deployments
    assert ingress == "Counter" and dep.import_path.startswith("fleetpulse.serve.byvalue:Counter_")
    assert dep.env == {byvalue.ENV_DIR: str(tmp_path)}
    with pytest.raises(ValueError, match="invalid application name 'x y'"):
        scriptapps.app_config(counter.bind(1), "x y", "/", None, tmp_path)
    with pytest.raises(ValueError, match=r"argument 0 is a object: constructor arguments"):
        scriptapps.app_config(counter.bind(object()), "default", "/", None, tmp_path)
    bad = counter.options(max_ongoing_requests=0)
    with pytest.raises(ValueError, match=r"deployment 'Counter': max_ongoing_requests: must be"):
        scriptapps.app_config(bad.bind(1), "default", "/", None, tmp_path)

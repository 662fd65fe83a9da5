"""Committed generated files match their generators (edit the script, rerun it, commit both)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["gen_nats_accounts", "gen_grafana_dashboard", "gen_wire_docs"])
def test_generated_file_is_current(name: str) -> None:
    script = _script(name)
    assert script.OUT.read_text() == script.render(), f"run: python -m scripts.{name}"

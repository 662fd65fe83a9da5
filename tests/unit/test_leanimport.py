"""shared/leanimport.py: a package's submodules imported with its `__init__` deferred to the
first use of another name of it."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.leanimport import defer_module, import_deferred


@pytest.fixture
def package(tmp_path: Path) -> Iterator[str]:
    """`fp_lean_pkg`: an `__init__` that counts its runs and imports `fp_lean_heavy` (which
    imports the hidden-when-asked `fp_lean_hidden` if it can), and a submodule `parts` that
    does `from . import helper` as prometheus_client.metrics does."""
    root = tmp_path / "fp_lean_pkg"
    root.mkdir()
    (root / "__init__.py").write_text(
        textwrap.dedent("""
        import fp_lean_heavy
        from .parts import Part
        RUNS = fp_lean_heavy.count()
        HEAVY = True
    """)
    )
    (root / "parts.py").write_text("from . import helper\n\nclass Part:\n    pass\n")
    (root / "helper.py").write_text("VALUE = 1\n")
    (tmp_path / "fp_lean_heavy.py").write_text(
        textwrap.dedent("""
        try:
            import fp_lean_hidden
        except ImportError:
            fp_lean_hidden = None
        _runs = []
        def count():
            _runs.append(1)
            return len(_runs)
    """)
    )
    (tmp_path / "fp_lean_hidden.py").write_text("")
    names = ("fp_lean_pkg", "fp_lean_heavy", "fp_lean_hidden")
    sys.path.insert(0, str(tmp_path))
    try:
        yield names[0]
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.split(".")[0] in names]:
            del sys.modules[name]


def test_the_submodules_load_without_the_init(package: str) -> None:
    assert import_deferred(package, [f"{package}.parts"], names={"Part": f"{package}.parts"})
    pkg = sys.modules[package]
    assert "fp_lean_heavy" not in sys.modules
    assert pkg.parts.helper.VALUE == 1
    assert pkg.Part is pkg.parts.Part  # a name from `names`: still no __init__
    assert "fp_lean_heavy" not in sys.modules


def test_any_other_name_runs_the_init_once_with_hidden_modules_hidden(package: str) -> None:
    assert import_deferred(package, [f"{package}.parts"], hide=["fp_lean_hidden"])
    pkg = sys.modules[package]
    assert pkg.HEAVY is True
    assert (pkg.RUNS, pkg.RUNS) == (1, 1)
    from fp_lean_pkg import Part

    assert Part is pkg.parts.Part
    assert sys.modules["fp_lean_heavy"].fp_lean_hidden is None
    assert "fp_lean_hidden" not in sys.modules  # hidden for that import only
    assert "__getattr__" not in vars(pkg)
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        pkg.missing  # noqa: B018


def test_nothing_is_done_for_a_package_imported_already(package: str) -> None:
    __import__(package)
    assert not import_deferred(package, [f"{package}.parts"])
    assert not import_deferred("fp_lean_no_such_package", [])


def test_a_deferred_module_is_imported_at_the_first_use_of_an_attribute(tmp_path: Path) -> None:
    (tmp_path / "fp_lean_mod.py").write_text("import fp_lean_heavy\nVALUE = 2\n")
    (tmp_path / "fp_lean_heavy.py").write_text("")
    sys.path.insert(0, str(tmp_path))
    try:
        assert defer_module("fp_lean_mod")
        import fp_lean_mod

        assert "fp_lean_heavy" not in sys.modules
        assert getattr(fp_lean_mod, "__file__", None) is None  # dunders load nothing
        assert fp_lean_mod.VALUE == 2  # through the stand-in
        assert "fp_lean_heavy" in sys.modules
        real = sys.modules["fp_lean_mod"]
        assert real is not fp_lean_mod and real.VALUE == 2
        assert not defer_module("fp_lean_mod")
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("fp_lean_mod", "fp_lean_heavy"):
            sys.modules.pop(name, None)


def test_a_deferred_submodule_is_set_on_its_package_then_replaced() -> None:
    import json

    sys.modules.pop("json.tool", None)
    had = json.__dict__.pop("tool", None)
    try:
        assert defer_module("json.tool")
        stand_in = json.tool  # type: ignore[attr-defined]
        assert callable(stand_in.main)
        assert json.tool is sys.modules["json.tool"] is not stand_in  # type: ignore[attr-defined]
    finally:
        sys.modules.pop("json.tool", None)
        json.__dict__.pop("tool", None)
        if had is not None:
            json.tool = had  # type: ignore[attr-defined]

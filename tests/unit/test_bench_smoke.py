"""The benchmark smoke run: every benchmark takes `--smoke`, and the runner finds every benchmark.

No sockets and nothing run: the modules are imported and each `main` is stopped at its first
parse, where its parser is read.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

from scripts.bench import smoke

HELPERS = ("common", "fleet_apps", "fleet_report", "fleet_sim", "fleet_stats")
"""Library modules of scripts/bench: no `main`, so not benchmarks."""


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__("parsed")
        self.parser = parser


def _parser_of(name: str, monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """The parser `scripts.bench.NAME.main` parses its arguments with (main stops there)."""
    module = importlib.import_module(f"{smoke.PACKAGE}.{name}")

    def stop(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Parsed(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", stop)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", "--smoke"])
    with pytest.raises(_Parsed) as got:
        module.main()
    return got.value.parser


@pytest.mark.parametrize("name", smoke.benches())
def test_every_benchmark_takes_smoke(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    usage = " ".join(_parser_of(name, monkeypatch).format_usage().split())
    assert "[--smoke]" in usage, f"scripts/bench/{name}.py: no --smoke flag in {usage!r}"


def test_the_runner_finds_every_module_with_a_main_and_no_helper() -> None:
    found = smoke.benches()
    for path in sorted(smoke.BENCH_DIR.glob("*.py")):
        if path.stem in ("__init__", smoke.RUNNER):
            continue
        module = importlib.import_module(f"{smoke.PACKAGE}.{path.stem}")
        assert (path.stem in found) == callable(getattr(module, "main", None)), path.stem
    assert {"fleet", "request", "rollout_live"} <= set(found)
    assert not set(HELPERS) & set(found)


def test_ray_benchmarks_are_found_from_their_imports(tmp_path: Path) -> None:
    (tmp_path / "uses_ray.py").write_text("def main():\n    import ray.serve\n")
    (tmp_path / "baseline.py").write_text("def run():\n    from ray import serve\n")
    (tmp_path / "with_baseline.py").write_text(
        "def main():\n    from scripts.bench.baseline import run\n"
    )
    (tmp_path / "borrows.py").write_text(
        "from scripts.bench.with_baseline import x\ndef main(): 0\n"
    )
    (tmp_path / "plain.py").write_text("import numpy\nfrom .common import ROOT\ndef main(): 0\n")
    assert smoke.benches(tmp_path) == ["borrows", "plain", "uses_ray", "with_baseline"]
    got = {n: smoke.needs_ray(n, tmp_path) for n in smoke.benches(tmp_path)}
    assert got == {"borrows": False, "plain": False, "uses_ray": True, "with_baseline": True}
    assert smoke.needs_ray("ray_policy")


def test_a_pass_needs_a_result_line() -> None:
    text = "warming up\nRESULT bench=x a=1\nnot a RESULT bench=y line\nRESULT other=1\n"
    assert smoke.result_lines(text) == ["RESULT bench=x a=1"]
    assert smoke.result_lines("done\n") == []


def test_writes_into_real_results_are_seen(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.png"
    a.write_text("1")
    before = smoke.snapshot([tmp_path])
    b.write_bytes(b"png")
    after = smoke.snapshot([tmp_path])
    assert set(after) - set(before) == {b}
    assert after[a] == before[a]


def test_skipped_benchmarks_are_loud_in_the_summary() -> None:
    text = smoke.summary(
        [
            smoke.Outcome("fleet", "ok", 12.0, ["RESULT bench=fleet n=1"]),
            smoke.Outcome("ray_policy", "SKIPPED", notes=["needs ray; --skip-ray"]),
            smoke.Outcome("proxy", "FAILED", 3.0, notes=["exit status 1"]),
        ],
        15.0,
    )
    assert "SKIPPED 1 benchmark(s) (--skip-ray): ray_policy" in text
    assert "1 passed, 1 failed, 1 skipped" in text
    assert "failed: proxy" in text


def test_an_unknown_name_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert smoke.main(["--only", "no_such_bench"]) == 2
    assert "unknown benchmark(s): no_such_bench" in capsys.readouterr().err

"""`fleetpulse deploy` does not zip an unchanged working_dir again (services/ops/pkgindex.py):
its files' stat is the key; any change to a file, a racy write, or a store without the package
means a zip as before."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from services.ops import packaging, pkgindex
from services.ops.pkgindex import PackageIndex
from shared import packages
from shared.packagestore import MemoryPackageStore


def tree(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "app.py").write_text("VERSION = 1\n")
    (root / "pkg" / "data.bin").write_bytes(b"x" * 5000)
    (root / "skip.log").write_text("excluded\n")
    return root


async def package(store: Any, index: PackageIndex, root: Path) -> tuple[dict[str, Any], Any]:
    work = root.parent / "work"
    work.mkdir(exist_ok=True)
    p = packaging.Packager(store, index=index, workdir=work)
    ref = await p.ref("app", {"path": str(root), "excludes": ["*.log"]}, "")
    return ref, p.stats


@pytest.fixture
def not_racy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pkgindex, "RACY_S", 0.0)  # files written by the test just now


@pytest.mark.usefixtures("not_racy")
async def test_an_unchanged_directory_is_not_zipped_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, store = tree(tmp_path / "wd"), MemoryPackageStore()
    index = PackageIndex(tmp_path / "index.json")
    first, stats = await package(store, index, root)
    assert (stats.uploaded, stats.unzipped) == (1, 0)

    def no_zip(*a: Any, **k: Any) -> Any:
        raise AssertionError("zipped again")

    with monkeypatch.context() as m:
        m.setattr(packages, "build_zip", no_zip)
        again, stats = await package(store, PackageIndex(tmp_path / "index.json"), root)
        assert again == first and (stats.reused, stats.unzipped, stats.uploaded) == (1, 1, 0)
        assert "1 known unchanged: not zipped" in packaging.describe(stats)
        (root / "skip.log").write_text("an excluded file changed: still the same package\n")
        assert (await package(store, index, root))[0] == first

    # same size, same mtime, new bytes: the ctime moved, so it is zipped again
    st = (root / "app.py").stat()
    (root / "app.py").write_text("VERSION = 2\n")
    os.utime(root / "app.py", ns=(st.st_atime_ns, st.st_mtime_ns))
    changed, stats = await package(store, index, root)
    assert changed["sha256"] != first["sha256"] and stats.uploaded == 1

    # a store that lost the package (garbage collected): zipped and uploaded again
    lost, stats = await package(MemoryPackageStore(), index, root)
    assert lost == changed and (stats.uploaded, stats.unzipped) == (1, 0)


async def test_a_racy_tree_is_not_remembered_and_a_damaged_index_is_empty(tmp_path: Path) -> None:
    root, store = tree(tmp_path / "wd"), MemoryPackageStore()
    index = PackageIndex(tmp_path / "index.json")
    await package(store, index, root)  # written within RACY_S: the stat may not tell yet
    _, stats = await package(store, index, root)
    assert stats.unzipped == 0 and stats.reused == 1
    (tmp_path / "bad.json").write_text("{not json")
    assert PackageIndex(tmp_path / "bad.json").get("x") is None
    (tmp_path / "odd.json").write_text('{"format": 1, "entries": {"fp": ["short", 1]}}')
    assert PackageIndex(tmp_path / "odd.json").get("fp") is None

"""The command line shared by the scripts that write a committed, generated file."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def write_or_check(doc: str, out: Path, render: Callable[[], str]) -> int:
    """`python -m scripts.X` rewrites `out`; with `--check` it exits 1 when `out` differs from
    `render()`."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the file is out of date")
    args = ap.parse_args()
    text = render()
    if args.check:
        if not out.exists() or out.read_text() != text:
            script = Path(sys.argv[0]).stem
            print(f"{out} is out of date: run python -m scripts.{script}", file=sys.stderr)
            return 1
        return 0
    out.write_text(text)
    print(f"wrote {out}")
    return 0

"""Run public Ray Serve scripts under fleetpulse with only their import lines changed.

    .venv/bin/python -m scripts.ray_corpus DIR [--timeout 120] [--json out.json]

DIR holds Ray Serve scripts as their authors wrote them (for instance files from Ray's
doc/source/serve/doc_code, fetched by you: this repository ships none of them). Each runs as a
script in a scratch copy of DIR with these lines rewritten and nothing else:

    from ray import serve                 -> from fleetpulse import serve
    from ray.serve.X import Y             -> from fleetpulse.serve import Y
    import ray                            -> (dropped; a script that calls ray.* fails, as counted)

A script passes when it exits 0 (their own asserts and `requests` calls are the check); its
serve.run starts a local fleetpulse on 127.0.0.1:8000, Ray's default, and it must be free. The
table says which passed and the last line of each failure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REWRITES = (
    (re.compile(r"^(\s*)from ray import serve\b(.*)$"), r"\1from fleetpulse import serve\2"),
    (re.compile(r"^(\s*)from ray\.serve(?:\.[\w.]+)? import (.*)$"), r"\1from fleetpulse.serve import \2"),
    (re.compile(r"^(\s*)import ray(\s*(#.*)?)$"), r"\1pass  # import ray (dropped)"),
)  # fmt: skip


def rewrite(source: str) -> tuple[str, int]:
    """The source with its Ray import lines pointed at fleetpulse, and how many changed."""
    out, changed = [], 0
    for line in source.splitlines():
        for pattern, repl in REWRITES:
            new = pattern.sub(repl, line)
            if new != line:
                line, changed = new, changed + 1
                break
        out.append(line)
    return "\n".join(out) + "\n", changed


_RAISED = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b(?::.*)?$")


def failure_line(output: str) -> str:
    """What a failed script raised (the last `SomeError: ...` line), else its last line: the
    shutdown messages printed after a traceback would otherwise hide it."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    raised = [line for line in lines if _RAISED.match(line)]
    return raised[-1] if raised else (lines[-1] if lines else "")


def run_one(script: Path, timeout_s: float) -> dict[str, object]:
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, script.name],
            cwd=script.parent,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
        code = proc.returncode
        last = failure_line(proc.stderr) or failure_line(proc.stdout)
    except subprocess.TimeoutExpired:
        code, last = -1, f"timed out after {timeout_s:.0f} s"
    return {
        "script": script.name,
        "passed": code == 0,
        "exit_code": code,
        "last_line": "" if code == 0 else last[:200],
        "seconds": round(time.monotonic() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("dir", type=Path, help="a folder of Ray Serve scripts (*.py)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per script (120)")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument(
        "--ray",
        action="store_true",
        help="run the scripts unchanged under Ray itself (the baseline: what passes there)",
    )
    args = p.parse_args(argv)
    scripts = sorted(args.dir.glob("*.py"))
    if not scripts:
        p.error(f"no *.py files in {args.dir}")
    results = []
    with tempfile.TemporaryDirectory(prefix="ray-corpus-") as tmp:
        work = Path(tmp)
        shutil.copytree(args.dir, work, dirs_exist_ok=True)
        for i, src in enumerate(scripts, 1):
            target = work / src.name
            text, changed = (src.read_text(), 0) if args.ray else rewrite(src.read_text())
            target.write_text(text)
            print(f"[{i}/{len(scripts)}] {src.name} ({changed} import lines)", flush=True)
            result = run_one(target, args.timeout)
            result["import_lines"] = changed
            results.append(result)
            print(f"    {'pass' if result['passed'] else 'FAIL'} {result['last_line']}", flush=True)
    passed = sum(1 for r in results if r["passed"])
    print(f"\n{passed} of {len(results)} scripts passed")
    for r in results:
        print(f"  {'pass' if r['passed'] else 'FAIL'}  {r['script']:<45} {r['last_line']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())

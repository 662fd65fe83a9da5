"""Smoke run of every benchmark: `python -m scripts.bench.NAME --smoke`, each in its own process.

How it works: the benchmarks are the modules of scripts/bench that define a top-level `main`
(helpers such as common.py or fleet_sim.py have none), found by reading their source, so a new
benchmark is in the run without being listed anywhere. They run one after the other (a smoke run
is seconds to a minute each, through the real code path: real nats-server, real service
processes). A benchmark passes when it exits 0 within `--timeout` and printed at least one
`RESULT bench=` line. Each runs with FLEETPULSE_BENCH_OUT set to a scratch directory, so its JSON
and plots go there (scripts/bench/common.py `results_dir`, `plot_path`); one that still writes
into bench-results/ or docs/img/ fails.

Ray Serve benchmarks (those that import `ray`, or a module of scripts/bench that does)
need the ray extra (`.venv/bin/pip install -e '.[ray]'`). Without it they FAIL, saying how to
install it; `--skip-ray` skips them instead, and the summary says SKIPPED loudly. Benchmarks run
with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 and RAY_USAGE_STATS_ENABLED=0.

Processes: on Linux the runner is a child subreaper, so whatever a benchmark leaves running after
it exits is reparented here; that fails the benchmark, and the runner stops those processes (by
pid). A benchmark past its timeout gets SIGINT (its cleanup runs), then SIGKILL 20 s later.

    .venv/bin/python -m scripts.bench.smoke [--only NAME ...] [--timeout 300] [--skip-ray]
        [--list] [--out DIR] [--verbose]

Exit status: 0 when every benchmark run passed (skipped ones do not count), 1 otherwise.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from scripts.bench.common import OUT_ENV, PLOTS_DIR, RESULTS_DIR, ROOT

BENCH_DIR = Path(__file__).resolve().parent
PACKAGE = "scripts.bench"
RUNNER = "smoke"
RESULT_RE = re.compile(r"^RESULT bench=\S+.*$", re.MULTILINE)
DEFAULT_TIMEOUT_S = 300.0
INTERRUPT_GRACE_S = 20.0
"""After SIGINT, how long a timed-out benchmark has to stop its servers before SIGKILL."""
ORPHAN_GRACE_S = 10.0
"""How long processes a benchmark left behind get to exit on their own before they count."""
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
RAY_INSTALL = (
    "install the ray extra: .venv/bin/pip install -e '.[ray]' "
    "(or FLEETPULSE_EXTRAS=test,dev,bench,ray ./scripts/test), or pass --skip-ray to skip it"
)
GUARDED = (RESULTS_DIR, PLOTS_DIR)
"""Where real results live: a smoke run must leave them as they are."""
TAIL_LINES = 60


# -- which benchmarks ----------------------------------------------------------------------------


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def has_main(path: Path) -> bool:
    """A top-level `def main` (or `async def main`): the module is a benchmark, not a helper."""
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "main"
        for node in _tree(path).body
    )


def benches(bench_dir: Path = BENCH_DIR) -> list[str]:
    """Every benchmark module's name, sorted; this runner itself excluded."""
    return sorted(
        p.stem for p in bench_dir.glob("*.py") if p.stem not in ("__init__", RUNNER) and has_main(p)
    )


def imports(path: Path) -> set[str]:
    """The modules `path` imports anywhere in it (a function-level import counts too)."""
    out: set[str] = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: inside scripts.bench
                base = f"{PACKAGE}.{base}" if base else PACKAGE
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def imports_ray(path: Path) -> bool:
    return any(m == "ray" or m.startswith("ray.") for m in imports(path))


def needs_ray(name: str, bench_dir: Path = BENCH_DIR) -> bool:
    """Whether the module imports `ray`, or imports a module of scripts/bench that does (as
    step_response does step_response_ray). One level only: whatif_validate borrows
    step_response's stack, not its Ray baseline."""
    path = bench_dir / f"{name}.py"
    if imports_ray(path):
        return True
    for mod in imports(path):
        if mod.startswith(f"{PACKAGE}."):
            other = bench_dir / f"{mod[len(PACKAGE) + 1 :].split('.')[0]}.py"
            if other != path and other.exists() and imports_ray(other):
                return True
    return False


def result_lines(text: str) -> list[str]:
    return RESULT_RE.findall(text)


def ray_problem(python: str = sys.executable) -> str | None:
    """None when `ray.serve` imports in the benchmarks' interpreter, else what went wrong."""
    try:
        res = subprocess.run(
            [python, "-c", "import ray, ray.serve"], cwd=ROOT, capture_output=True, text=True,
            timeout=180, env=dict(os.environ, **RAY_ENV),
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return "importing ray.serve took over 180 s"
    if res.returncode == 0:
        return None
    lines = (res.stderr or res.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit {res.returncode}"


# -- processes -----------------------------------------------------------------------------------


def become_subreaper() -> bool:
    """Orphans of our descendants are reparented to this process (Linux prctl), so a benchmark
    cannot leave a server running unseen."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(36, 1, 0, 0, 0) == 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state) of a process, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = text.rsplit(")", 1)[1].split()
    return int(rest[1]), rest[0]


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:160]


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def live_children(parent: int) -> list[int]:
    """The parent's child processes still running (exited ones, zombies, are reaped)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        st = _stat(pid)
        if st is None or st[0] != parent:
            continue
        if st[1] == "Z":
            _reap(pid)
        else:
            out.append(pid)
    return out


def sweep_orphans(grace_s: float) -> list[str]:
    """Wait up to `grace_s` for reparented leftovers to exit; stop the rest. Their commands."""
    me = os.getpid()
    deadline = time.monotonic() + grace_s
    while (left := live_children(me)) and time.monotonic() < deadline:
        time.sleep(0.2)
    stopped: list[str] = []
    for _ in range(10):  # killing one can reparent its own children here: go again
        left = live_children(me)
        if not left:
            break
        stopped += [f"{pid} {_cmdline(pid)}" for pid in left]
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        end = time.monotonic() + 5.0
        while (still := live_children(me)) and time.monotonic() < end:
            time.sleep(0.1)
        for pid in still:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in still:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, 0)
    return stopped


def interrupt(proc: subprocess.Popen[bytes], grace_s: float = INTERRUPT_GRACE_S) -> None:
    """SIGINT (the benchmark's finally blocks stop its servers), SIGKILL if it does not exit."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: only what it started
        proc.wait()


# -- one benchmark -------------------------------------------------------------------------------


@dataclass
class Outcome:
    name: str
    status: str  # "ok", "FAILED" or "SKIPPED"
    seconds: float = 0.0
    results: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    log: Path | None = None


def snapshot(dirs: Iterable[Path]) -> dict[Path, tuple[int, int]]:
    out = {}
    for d in dirs:
        if d.is_dir():
            for p in d.rglob("*"):
                with contextlib.suppress(OSError):
                    if p.is_file():
                        st = p.stat()
                        out[p] = (st.st_mtime_ns, st.st_size)
    return out


def changed(before: dict[Path, tuple[int, int]], after: dict[Path, tuple[int, int]]) -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p, v in after.items() if before.get(p) != v)


def _pump(src: IO[bytes], log: IO[bytes], echo: str | None) -> None:
    for line in iter(src.readline, b""):
        log.write(line)
        log.flush()
        if echo is not None:
            sys.stdout.write(f"{echo}{line.decode(errors='replace')}")
            sys.stdout.flush()


def run_one(
    name: str, out_dir: Path, timeout_s: float, *, verbose: bool = False, reaper: bool = True
) -> Outcome:
    bench_out = out_dir / name
    bench_out.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / f"{name}.log"
    env = dict(os.environ, **RAY_ENV)
    env.update({OUT_ENV: str(bench_out), "PYTHONUNBUFFERED": "1"})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    outcome = Outcome(name, "ok", log=log_path)
    before = snapshot(GUARDED)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", f"{PACKAGE}.{name}", "--smoke"], cwd=ROOT, env=env,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    with open(log_path, "wb") as log:
        pump = threading.Thread(
            target=_pump, args=(proc.stdout, log, f"  [{name}] " if verbose else None), daemon=True
        )
        pump.start()
        try:
            try:
                rc = proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                interrupt(proc)
                rc = proc.returncode
                outcome.notes.append(f"timed out after {timeout_s:g} s")
            outcome.seconds = time.monotonic() - t0
        except BaseException:  # Ctrl-C on the runner: stop this benchmark too, then go
            interrupt(proc)
            if reaper:
                sweep_orphans(0.0)
            raise
        if reaper:
            left = sweep_orphans(ORPHAN_GRACE_S)
            if left:
                outcome.notes.append(
                    f"left {len(left)} process(es) running (stopped): " + "; ".join(left)
                )
        pump.join(30)
    text = log_path.read_text(errors="replace")
    outcome.results = result_lines(text)
    if rc != 0 and not any(n.startswith("timed out") for n in outcome.notes):
        outcome.notes.append(f"exit status {rc}")
    if not outcome.results:
        outcome.notes.append("no 'RESULT bench=' line")
    wrote = changed(before, snapshot(GUARDED))
    if wrote:
        outcome.notes.append(
            f"wrote {', '.join(wrote)}: smoke output belongs under ${OUT_ENV} "
            "(scripts/bench/common.py results_dir / plot_path)"
        )
    if rc != 0 or outcome.notes:
        outcome.status = "FAILED"
    return outcome


# -- the run -------------------------------------------------------------------------------------


def summary(outcomes: Sequence[Outcome], total_s: float) -> str:
    rows = [("bench", "status", "seconds", "results", "note")]
    for o in outcomes:
        secs = f"{o.seconds:.1f}" if o.log is not None else "-"  # None: never started
        rows.append((o.name, o.status, secs, str(len(o.results)), "; ".join(o.notes)[:300]))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["", "smoke summary"]
    for r in rows:
        cells = [
            c.rjust(w) if i == 2 else c.ljust(w)
            for i, (c, w) in enumerate(zip(r[:4], widths, strict=True))
        ]
        lines.append("  ".join([*cells, r[4]]).rstrip())
    passed = sum(o.status == "ok" for o in outcomes)
    failed = [o.name for o in outcomes if o.status == "FAILED"]
    skipped = [o.name for o in outcomes if o.status == "SKIPPED"]
    if skipped:
        lines += [
            "",
            "!" * 78,
            f"!! SKIPPED {len(skipped)} benchmark(s) (--skip-ray): {', '.join(skipped)}",
            "!! they did NOT run: this smoke run says nothing about them",
            "!" * 78,
        ]
    lines.append(
        f"\nsmoke: {passed} passed, {len(failed)} failed, {len(skipped)} skipped "
        f"in {total_s:.1f} s" + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m scripts.bench.smoke",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run only these benchmarks")
    ap.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
        help=f"seconds each benchmark may take (default {DEFAULT_TIMEOUT_S:g})",
    )  # fmt: skip
    ap.add_argument(
        "--skip-ray", action="store_true",
        help="skip the Ray Serve benchmarks (reported as SKIPPED) instead of running them",
    )  # fmt: skip
    ap.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    ap.add_argument(
        "--out", type=Path, metavar="DIR",
        help="keep each benchmark's log, JSON and plots here (default: a temporary directory, "
        "removed unless something failed)",
    )  # fmt: skip
    ap.add_argument("--verbose", action="store_true", help="show each benchmark's output live")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    found = benches()
    ray = {name: needs_ray(name) for name in found}
    if args.list:
        for name in found:
            print(name + ("  (ray)" if ray[name] else ""))
        return 0
    if args.only:
        unknown = sorted(set(args.only) - set(found))
        if unknown:
            print(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(found)}",
                  file=sys.stderr)  # fmt: skip
            return 2
        found = [n for n in found if n in args.only]
    out_dir = args.out or Path(tempfile.mkdtemp(prefix="fleetpulse-smoke-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    reaper = become_subreaper()
    problem = None
    if any(ray[n] for n in found) and not args.skip_ray:
        problem = ray_problem()
    print(f"smoke: {len(found)} benchmark(s), timeout {args.timeout:g} s each, output in {out_dir}"
          + ("" if reaper else " (no leak check: not Linux)"), flush=True)  # fmt: skip
    outcomes: list[Outcome] = []
    t0 = time.monotonic()
    try:
        for i, name in enumerate(found, start=1):
            head = f"[{i}/{len(found)}] {name}"
            if ray[name] and args.skip_ray:
                outcomes.append(Outcome(name, "SKIPPED", notes=["needs ray; --skip-ray"]))
                print(f"--- {head}: SKIPPED (needs ray; --skip-ray)", flush=True)
                continue
            if ray[name] and problem is not None:
                outcomes.append(
                    Outcome(
                        name, "FAILED", notes=[f"ray is not importable ({problem}): {RAY_INSTALL}"]
                    )
                )
                print(f"--- {head}: FAILED, ray is not importable ({problem})\n    {RAY_INSTALL}",
                      flush=True)  # fmt: skip
                continue
            print(f">>> {head}: started", flush=True)
            o = run_one(name, out_dir, args.timeout, verbose=args.verbose, reaper=reaper)
            outcomes.append(o)
            print(f"<<< {head}: {o.status} in {o.seconds:.1f} s", flush=True)
            for line in o.results:
                print(f"    {line}")
            for note in o.notes:
                print(f"    {note}")
            if o.status == "FAILED" and o.log is not None and not args.verbose:
                tail = o.log.read_text(errors="replace").splitlines()[-TAIL_LINES:]
                print(f"    last {len(tail)} lines of {o.log}:")
                print("\n".join(f"    | {x}" for x in tail), flush=True)
    except KeyboardInterrupt:
        print("\nsmoke: interrupted", file=sys.stderr)
        print(summary(outcomes, time.monotonic() - t0))
        return 130
    print(summary(outcomes, time.monotonic() - t0), flush=True)
    failed = any(o.status == "FAILED" for o in outcomes)
    if args.out is None:
        if failed:
            print(f"logs kept in {out_dir}")
        else:
            shutil.rmtree(out_dir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

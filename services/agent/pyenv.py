"""Python environments for `pip` / `uv` requirements: one per distinct spec on each agent.

How it works: `ensure(pip)` returns the interpreter of the environment built for a spec
(requirements, installer, pip_version), keyed by a hash of the spec and the agent's interpreter
(shared/runtimeenv.py `pip_key`), so the same spec is built once per agent and reused by every
replica of every app that asks for it. The environment is a venv without pip of its own whose
site-packages is followed by the agent's own (a `.pth` file): what it installs comes first, and
everything the agent has (fleetpulse itself included) is already there, so the installer
never reinstalls it (pip leaves packages outside the venv alone). It is built in a `.partial-`
directory and renamed into place once the installer succeeded, so an environment that exists is
complete; a build killed mid-way leaves only a partial directory, removed at the next start.

Concurrency: one build per spec however many replicas start at once (they await the same task),
and at most `max_builds` builds at a time on an agent. A failure is remembered for `retry_after_s`
(the controller tries a few replicas before it marks the deployment DEPLOY_FAILED: they get the
same error at once, not a reinstall each), with the installer's own error line; an agent that
cannot reach the package index says so. `building()` lists the builds in progress with their
start time (the agent's registration carries them for `fleetpulse status`).

Removal: every environment has a last-used time (local monotonic: built, handed to a replica, or
in use by a live replica at a `sweep`; the ones found on disk at start count as used then).
`sweep(in_use)` removes those unused for `grace_s` (`stale`, a pure function): renamed to a
partial directory first, so no half-removed environment is ever taken for a complete one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import site
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared import packages, runtimeenv

log = logging.getLogger(__name__)

INSTALL_TIMEOUT_S = 900.0
NETWORK_HINTS = (
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "Connection refused",
    "ConnectTimeoutError",
    "Could not fetch URL",
    "failed to fetch",
    "dns error",
)


class EnvBuildError(Exception):
    """The environment could not be built: the installer's error line (or why not)."""


@dataclass(frozen=True, slots=True)
class Building:
    key: str
    packages: tuple[str, ...]
    since: float
    """Unix seconds."""


class PyEnvs:
    def __init__(
        self,
        root: Path,
        python: str,
        *,
        max_builds: int = 2,
        retry_after_s: float = 60.0,
        env: Mapping[str, str] | None = None,
        grace_s: float = 86400.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root
        self.grace_s = grace_s
        self._clock = clock
        self.python = python
        self._sem = asyncio.Semaphore(max_builds)
        self.retry_after_s = retry_after_s
        self._env = dict(os.environ if env is None else env)
        self._inflight: dict[str, asyncio.Task[str]] = {}
        self._failed: dict[str, tuple[float, str]] = {}
        self._building: dict[str, Building] = {}
        self.builds = 0
        packages.clean_partial(root)  # made at the first build
        self._id = f"{python} {sys.version.split()[0]}"
        now = clock()
        self._last_used: dict[str, float] = {
            p.name: now for p in _entries(root) if (p / ".ready").exists()
        }
        self.removed = 0

    def key(self, pip: Mapping[str, Any]) -> str:
        return runtimeenv.pip_key(pip, self._id)

    def building(self) -> list[Building]:
        return list(self._building.values())

    def interpreter(self, key: str) -> Path:
        return self.root / key / "bin" / "python"

    async def ensure(self, pip: Mapping[str, Any]) -> str:
        key = self.key(pip)
        if (self.root / key / ".ready").exists():
            self._last_used[key] = self._clock()
            return str(self.interpreter(key))
        failed = self._failed.get(key)
        if failed is not None and time.monotonic() < failed[0]:
            raise EnvBuildError(failed[1])
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.create_task(self._build(key, pip), name=f"pyenv-{key}")
            self._inflight[key] = task
            task.add_done_callback(lambda _: self._inflight.pop(key, None))
        return await asyncio.shield(task)

    async def sweep(self, in_use: Iterable[str]) -> list[str]:
        """Remove the environments unused for `grace_s`; `in_use`: the keys live replicas
        run in (used now). Returns the keys removed."""
        now = self._clock()
        for key in in_use:
            if key in self._last_used:
                self._last_used[key] = now
        gone = stale(self._last_used, set(self._inflight), now, self.grace_s)
        for key in gone:
            del self._last_used[key]
            doomed = self.root / f"{packages.PARTIAL_PREFIX}{key}-removed"
            try:
                os.rename(self.root / key, doomed)
            except FileNotFoundError:
                continue
            await asyncio.to_thread(shutil.rmtree, doomed, True)
            self.removed += 1
            log.info("python environment %s removed: unused for %g s", key, self.grace_s)
        return gone

    async def close(self) -> None:
        """Cancel the builds in progress: their installers are killed, their partial
        environments removed (the agent is stopping)."""
        tasks = list(self._inflight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _build(self, key: str, pip: Mapping[str, Any]) -> str:
        async with self._sem:
            reqs = tuple(str(p) for p in pip.get("packages", ()))
            self._building[key] = Building(key, reqs, time.time())
            await asyncio.to_thread(self.root.mkdir, parents=True, exist_ok=True)
            log.info("building python environment %s: %s", key, " ".join(reqs))
            tmp = Path(tempfile.mkdtemp(prefix=f"{packages.PARTIAL_PREFIX}{key}-", dir=self.root))
            try:
                await self._install(tmp, pip, reqs)
                await asyncio.to_thread((tmp / ".ready").write_text, " ".join(reqs) + "\n")
                os.rename(tmp, self.root / key)
            except EnvBuildError as exc:
                shutil.rmtree(tmp, ignore_errors=True)
                self._failed[key] = (time.monotonic() + self.retry_after_s, str(exc))
                raise
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            finally:
                self._building.pop(key, None)
        self.builds += 1
        self._last_used[key] = self._clock()
        log.info("python environment %s built: %s", key, " ".join(reqs))
        return str(self.interpreter(key))

    async def _install(self, venv: Path, pip: Mapping[str, Any], reqs: tuple[str, ...]) -> None:
        await self._run([self.python, "-m", "venv", "--without-pip", str(venv)], "venv")
        py = venv / "bin" / "python"
        purelib = await self._output([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])  # fmt: skip
        base = list(dict.fromkeys(p for p in [*site.getsitepackages(), *_own_paths()] if p))
        # an `import` line runs at startup: addsitedir also reads the agent's own .pth files
        # (an editable fleetpulse); the directories come after this venv's site-packages
        line = f"import site; list(map(site.addsitedir, {base!r}))\n"
        await asyncio.to_thread(Path(purelib, "_fleetpulse_agent_env.pth").write_text, line)
        if not reqs:
            return
        if pip.get("installer") == "uv":
            # on PATH, or next to the agent's own interpreter (a venv's bin, not activated)
            uv = shutil.which("uv", path=self._env.get("PATH")) or shutil.which(
                "uv", path=str(Path(sys.executable).parent)
            )
            if uv is None:
                raise EnvBuildError("uv is not installed on this agent: install it, or use pip")
            cmd = [uv, "pip", "install", "--python", str(py), *reqs]
        else:
            cmd = [str(py), "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
            version = str(pip.get("pip_version") or "")
            if version:
                await self._run([*cmd, f"pip{version}"], "pip")
            cmd += list(reqs)
        await self._run(cmd, str(pip.get("installer", "pip")))

    async def _output(self, argv: list[str]) -> str:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=self._env
        )
        out, err = await proc.communicate()
        if proc.returncode != 0:
            raise EnvBuildError(f"{argv[0]} failed: {_error_line(err.decode(errors='replace'))}")
        return out.decode().strip()

    async def _run(self, argv: list[str], what: str) -> None:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=self._env,
        )
        try:
            async with asyncio.timeout(INSTALL_TIMEOUT_S):
                out, _ = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise EnvBuildError(f"{what} did not finish in {INSTALL_TIMEOUT_S:g} s") from None
        except BaseException:  # cancelled (the agent stops): the installer must not outlive it
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            raise
        if proc.returncode != 0:
            text = out.decode(errors="replace")
            line = _error_line(text)
            if any(h in text for h in NETWORK_HINTS):
                line = (
                    f"the agent could not reach the package index ({line}); give it access, or "
                    "point it at a reachable index (PIP_INDEX_URL, PIP_FIND_LINKS)"
                )
            raise EnvBuildError(f"{what} install failed: {line}")


def stale(last_used: Mapping[str, float], busy: set[str], now: float, grace_s: float) -> list[str]:
    """The environments to remove: unused for `grace_s` and not being built (sorted)."""
    return sorted(k for k, t in last_used.items() if now - t >= grace_s and k not in busy)


def _entries(root: Path) -> list[Path]:
    try:
        return [p for p in root.iterdir() if not p.name.startswith(packages.PARTIAL_PREFIX)]
    except FileNotFoundError:
        return []


def _error_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith(("ERROR:", "error:", "\u00d7"))]
    # uv gives the reason on a line of its own ("cause: Because fpwheel was not found ...")
    cause = [ln.removeprefix("cause:").strip() for ln in lines if ln.startswith("cause:")]
    if errors and cause:
        return f"{errors[0]}: {cause[0]}"[:500]
    return (errors or lines or ["(no output)"])[0 if errors else -1][:500]


def _own_paths() -> list[str]:
    """The agent's own import roots (its venv's site-packages; an editable fleetpulse)."""
    return [p for p in sys.path if p and os.path.isdir(p) and "site-packages" in p]

"""What a replica's runtime_env needs before its process can start, prepared in the background.

How it works: the agent asks `state(runtime_env)` for each wanted replica it has not started.
An empty runtime_env is ready at once. Otherwise the first ask starts one preparation task for
that runtime_env (every replica with the same one shares it): fetch and unpack each package
(services/agent/packages.py), build the pip/uv environment (services/agent/pyenv.py); the
answer is None (preparing: the replica waits, holding no slot), a `Prepared` (start it: its
working directory, the import roots to put first, the interpreter), or a `Failed` with the
reason (the agent reports the replica as a failed start, so the controller's start-failure
count, not a loop here, ends in DEPLOY_FAILED). A failure is kept for `retry_after_s`, so the
replicas the controller tries next fail at once with the same reason instead of fetching or
installing again. When a task ends, `wake` is called so the agent plans again at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from shared import packages, runtimeenv
from shared.errors import FleetpulseError

from .packages import PackageCache
from .pyenv import EnvBuildError, PyEnvs

log = logging.getLogger(__name__)

EXIT_RUNTIME_ENV_FAILED = 126
"""Reported as the exit code of a replica whose runtime_env could not be prepared."""


@dataclass(frozen=True, slots=True)
class Prepared:
    cwd: str | None
    """The unpacked working_dir (None: the agent's --workdir)."""
    pythonpath: tuple[str, ...]
    """Import roots ahead of everything else: working_dir, then each py_modules package."""
    python: str | None
    """The interpreter of the pip/uv environment (None: the agent's)."""
    packages: tuple[str, ...]
    """The sha256 of each package it uses (kept in the cache while it runs)."""


@dataclass(frozen=True, slots=True)
class Failed:
    reason: str


def env_key(runtime_env: Mapping[str, Any]) -> str:
    return json.dumps(runtime_env, sort_keys=True)


class RuntimeEnvs:
    def __init__(
        self,
        cache: PackageCache,
        pyenvs: PyEnvs,
        *,
        wake: Callable[[], None],
        retry_after_s: float = 60.0,
    ) -> None:
        self.cache = cache
        self.pyenvs = pyenvs
        self._wake = wake
        self.retry_after_s = retry_after_s
        self._ready: dict[str, Prepared] = {}
        self._failed: dict[str, tuple[float, Failed]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._started: dict[str, float] = {}
        self._phase: dict[str, str] = {}
        self.in_use: Callable[[], set[str]] = set

    def state(self, runtime_env: Mapping[str, Any]) -> Prepared | Failed | None:
        if not runtime_env:
            return Prepared(None, (), None, ())
        key = env_key(runtime_env)
        ready = self._ready.get(key)
        if ready is not None:
            if all(os.path.exists(p) for p in (*ready.pythonpath, ready.python or "/")):
                return ready
            # its environment was removed unused (pyenv.sweep), or a package of it left the
            # bounded cache while no replica ran it: prepare it again (a start, not a failure)
            del self._ready[key]
        failed = self._failed.get(key)
        if failed is not None:
            if time.monotonic() < failed[0]:
                return failed[1]
            del self._failed[key]
        if key not in self._tasks:
            self._started[key] = time.time()
            task = asyncio.create_task(self._prepare(key, dict(runtime_env)), name="runtime-env")
            self._tasks[key] = task
        return None

    def preparing(self) -> dict[str, float]:
        """Preparations in progress: runtime_env key -> since (unix seconds)."""
        return {k: self._started[k] for k in self._tasks}

    def progress(self, runtime_env: Mapping[str, Any]) -> tuple[float, str]:
        """(since, what it is doing) of the preparation of `runtime_env` in progress."""
        key = env_key(runtime_env)
        return self._started.get(key, time.time()), self._phase.get(key, "preparing")

    async def _prepare(self, key: str, rt: dict[str, Any]) -> None:
        try:
            roots: list[str] = []
            shas: list[str] = []
            cwd = None
            for i, ref in enumerate(runtimeenv.refs(rt)):
                self._phase[key] = (
                    f"fetching package {str(ref['sha256'])[:12]} ({ref['size']} bytes)"
                )
                path = await self.cache.ensure(ref, self.in_use())
                shas.append(str(ref["sha256"]))
                root = str(packages.strip_single_top(path)) if ref.get("url") else str(path)
                if i == 0 and "working_dir" in rt:
                    cwd = root
                roots.append(root)
            python = None
            if rt.get("pip"):
                reqs = " ".join(rt["pip"].get("packages", ()))
                self._phase[key] = f"building its Python environment ({reqs})"
                python = await self.pyenvs.ensure(rt["pip"])
            self._ready[key] = Prepared(cwd, tuple(roots), python, tuple(shas))
        except (packages.PackageError, EnvBuildError, FleetpulseError, OSError) as exc:
            reason = f"runtime_env: {exc}"
            log.error("%s", reason)
            self._failed[key] = (time.monotonic() + self.retry_after_s, Failed(reason))
        except Exception as exc:  # a bug must fail this start, not the agent
            log.exception("runtime_env preparation failed")
            self._failed[key] = (
                time.monotonic() + self.retry_after_s,
                Failed(f"runtime_env: {exc}"),
            )
        finally:
            self._tasks.pop(key, None)
            self._started.pop(key, None)
            self._phase.pop(key, None)
            self._wake()

    async def close(self) -> None:
        """Stop every preparation: fetches and builds cancelled, nothing left half-done."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.cache.close()
        await self.pyenvs.close()

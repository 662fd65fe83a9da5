"""Helpers of tests/e2e/test_compose_engine.py: the compose CLI, polling, HTTP load, a report.

Everything here drives the real `docker` and `docker compose` commands the way a user would;
nothing talks to the engine's API directly. Load goes only to the stack's published ports on
127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_DIR = ROOT / "compose"
T = TypeVar("T")


def sh(*argv: str, env: dict[str, str] | None = None, timeout: float = 600, check: bool = True,
       cwd: Path = COMPOSE_DIR) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """Run a command; on failure the assertion shows its output."""
    proc = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"`{' '.join(argv)}` exited {proc.returncode}\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        )
    return proc


def wait_for(check: Callable[[], T], within_s: float, what: str, every_s: float = 0.5) -> T:
    """Poll `check()` until it returns something truthy; its last value goes into the failure."""
    deadline = time.monotonic() + within_s
    last: Any = None
    while True:
        try:
            last = check()
        except (AssertionError, OSError, ValueError, KeyError, subprocess.TimeoutExpired) as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within_s:g} s: {what} (last: {last!r})"[:4000])
        time.sleep(every_s)


@dataclass
class Compose:
    """`docker compose` in compose/, with this run's project name and environment."""

    project: str
    env: dict[str, str]

    def __call__(self, *args: str, timeout: float = 600, check: bool = True) -> str:
        env = {**os.environ, **self.env, "COMPOSE_PROJECT_NAME": self.project}
        return sh("docker", "compose", *args, env=env, timeout=timeout, check=check).stdout

    def containers(self, service: str | None = None) -> list[dict[str, Any]]:
        """Every container of the project (stopped ones too), as `docker compose ps` says."""
        out = self("ps", "-a", "--format", "json", *([service] if service else []))
        rows = [json.loads(line) for line in out.splitlines() if line.strip()]
        return sorted(rows, key=lambda r: r["Name"])

    def running(self, service: str) -> list[dict[str, Any]]:
        return [c for c in self.containers(service) if c["State"] == "running"]

    def logs(self) -> str:
        return self("logs", "--no-color", "--timestamps")


def docker(*args: str, timeout: float = 120, check: bool = True) -> str:
    return sh("docker", *args, timeout=timeout, check=check).stdout


def container_metric(container: str, name: str, port: int = 9100) -> float:
    """Sum of a metric's samples on a container's own /metrics (its port is not published)."""
    code = (
        "import urllib.request as u;"
        f"print(u.urlopen('http://127.0.0.1:{port}/metrics', timeout=3).read().decode())"
    )
    text = docker("exec", container, "python", "-c", code, timeout=30)
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{")
    ]
    if not values:
        raise ValueError(f"{container} has no {name}")
    return sum(values)


def http_json(url: str, timeout: float = 10) -> Any:
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


# -- load ------------------------------------------------------------------------------------


@dataclass
class Result:
    start: float
    end: float
    ok: bool
    outcome: str
    """ok | retryable (Fp-Retryable: true, or 503 with Retry-After) | refused (no proxy took the
    connection) | failed: ... (the last attempt's outcome)"""
    host: str = ""
    retries: int = 0


RETRYABLE_CONNECT = (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError,
                     aiohttp.ClientOSError)  # fmt: skip


@dataclass
class Load:
    """`callers` concurrent GET loops against `url`, on an event loop in a thread.

    `retry=True` is a careful client: a connection refused or closed before any response, and a
    503 carrying Retry-After, are tried again (a GET is idempotent) for up to `give_up_s`; the
    request fails only if it never gets a 200. `retry=False` records each attempt as it ends."""

    url: str
    callers: int = 8
    retry: bool = True
    give_up_s: float = 60.0
    results: list[Result] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Load:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._thread.start()
        wait_for(lambda: any(r.ok for r in self.results), 60, f"a first answer from {self.url}")
        return self

    def stop(self) -> list[Result]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.give_up_s + 30)
        return self.results

    def since(self, t: float) -> list[Result]:
        """Requests that ended at `t` or later (one that straddles two phases counts in both)."""
        return [r for r in list(self.results) if r.end >= t]

    def hosts_since(self, t: float) -> set[str]:
        return {r.host for r in list(self.results) if r.ok and r.start >= t}

    async def _main(self) -> None:
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            await asyncio.gather(*(self._caller(session, i) for i in range(self.callers)))

    async def _caller(self, session: aiohttp.ClientSession, i: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            result = await self._one(session, f"{self.url}load-{i}-{n}")
            self.results.append(result)
            if not result.ok:  # without retries, do not spin on a port that refuses
                await asyncio.sleep(0.1)

    async def _one(self, session: aiohttp.ClientSession, url: str) -> Result:
        start, retries = time.monotonic(), 0
        while True:
            outcome, host, retry_in = await self._attempt(session, url)
            now = time.monotonic()
            if outcome == "ok" or not self.retry or retry_in is None:
                return Result(start, now, outcome == "ok", outcome, host, retries)
            if now - start > self.give_up_s:
                return Result(start, now, False, f"failed: gave up after {outcome}", host, retries)
            retries += 1
            await asyncio.sleep(retry_in)

    @staticmethod
    async def _attempt(session: aiohttp.ClientSession, url: str) -> tuple[str, str, float | None]:
        """(outcome, serving host, seconds to wait before a retry or None: do not retry)."""
        try:
            async with session.get(url) as resp:
                body = await resp.read()
                if resp.status == 200:
                    return "ok", json.loads(body).get("host", ""), None
                if resp.headers.get("Fp-Retryable") == "true" or (
                    resp.status == 503 and "Retry-After" in resp.headers
                ):
                    error = resp.headers.get("Fp-Error", str(resp.status))
                    wait = min(float(resp.headers.get("Retry-After", 0.1)), 1.0)
                    return f"retryable ({error})", "", wait
                return f"failed: HTTP {resp.status} {body[:200]!r}", "", None
        except aiohttp.ClientConnectorError:
            return "refused", "", 0.1
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            # closed before any byte of a response: the proxy was not there to take it
            return f"refused ({type(exc).__name__})", "", 0.1
        except (TimeoutError, aiohttp.ClientError) as exc:
            return f"failed: {type(exc).__name__}: {exc}", "", None


def summary(results: list[Result]) -> dict[str, Any]:
    failed = [r for r in results if not r.ok]
    slowest = max((r.end - r.start for r in results), default=0.0)
    return {
        "requests": len(results),
        "failed": len(failed),
        "retried": sum(1 for r in results if r.retries),
        "slowest_s": round(slowest, 2),
        "failures": sorted({r.outcome for r in failed})[:5],
    }


# -- report ------------------------------------------------------------------------------------


@dataclass
class Report:
    """Each check with its timing, printed as it ends and all together at the end."""

    path: Path
    t0: float = field(default_factory=time.monotonic)
    lines: list[str] = field(default_factory=list)

    def add(self, text: str) -> None:
        line = f"[{time.monotonic() - self.t0:6.1f} s] {text}"
        self.lines.append(line)
        print(line, flush=True)
        self.path.write_text("\n".join(self.lines) + "\n")

    @contextmanager
    def check(self, name: str) -> Iterator[dict[str, Any]]:
        """Times the block; what it puts in the yielded dict is printed with the result."""
        start, details = time.monotonic(), {}
        try:
            yield details
        except BaseException as exc:
            self.add(f"FAIL {name} ({time.monotonic() - start:.1f} s): {str(exc)[:300]}")
            raise
        extra = "; ".join(f"{k} {v}" for k, v in details.items())
        self.add(f"ok   {name} ({time.monotonic() - start:.1f} s){': ' + extra if extra else ''}")

"""The deployment's custom autoscaling metrics: `record_autoscaling_stats()` called in isolation.

How it works. A deployment class may define `record_autoscaling_stats(self) -> dict[str, float]`
(Ray Serve's name and contract; sync or async). Before each of its own reports the replica calls
it through `CustomStats.collect()`, which returns the metrics to carry, or `{}`:

- the call gets at most `timeout_s`; a sync method runs in a worker thread, and since a thread
  cannot be cancelled, no new call starts while one is still running (`busy`);
- the answer must be a mapping of at most MAX_CUSTOM_METRICS names, each 1-128 UTF-8 bytes (the
  wire rule of `custom.<name>` columns), to finite real numbers (`validate`). One bad entry drops
  the whole answer: a partial set could mislead a policy that combines metrics;
- anything that goes wrong is counted by reason and logged rate-limited, and the report goes out
  without custom metrics. Nothing user code does here stops reports or the replica.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any, Final

from shared.badinput import BadInput
from shared.wire.limits import MAX_CUSTOM_METRICS, MAX_CUSTOM_NAME_LEN

METHOD: Final = "record_autoscaling_stats"
TIMEOUT_S: Final = 10.0
"""Ray Serve's default limit (RAY_SERVE_RECORD_AUTOSCALING_STATS_TIMEOUT_S); a replica allows at
most half its metrics interval, so a slow method delays a report by half a period at worst."""

RAISED: Final = "raised"
TIMEOUT: Final = "timeout"
BUSY: Final = "busy"
WRONG_TYPE: Final = "wrong_type"
TOO_MANY: Final = "too_many"
BAD_NAME: Final = "bad_name"
NOT_FINITE: Final = "not_finite"


class BadStats(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


def validate(value: Any) -> dict[str, float]:
    """The custom metrics in `value`, or BadStats naming the first thing wrong."""
    if not isinstance(value, Mapping):
        raise BadStats(WRONG_TYPE, f"expected a dict of name -> number, got {type(value).__name__}")
    if len(value) > MAX_CUSTOM_METRICS:
        raise BadStats(TOO_MANY, f"{len(value)} names, at most {MAX_CUSTOM_METRICS}")
    out: dict[str, float] = {}
    for name, v in value.items():
        if not isinstance(name, str):
            raise BadStats(BAD_NAME, f"name {name!r:.60} is not a string")
        if not 0 < len(name.encode("utf-8", "replace")) <= MAX_CUSTOM_NAME_LEN:
            raise BadStats(BAD_NAME, f"name {name!r:.60} is not 1-{MAX_CUSTOM_NAME_LEN} bytes")
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise BadStats(WRONG_TYPE, f"{name}: {type(v).__name__} is not a number")
        f = float(v)
        if not math.isfinite(f):
            raise BadStats(NOT_FINITE, f"{name}: {f}")
        out[name] = f
    return out


def stats_method(instance: Any) -> Callable[[], Any] | None:
    """The deployment's `record_autoscaling_stats`, or None (a function deployment has none)."""
    fn = getattr(instance, METHOD, None)
    return fn if callable(fn) else None


class CustomStats:
    """Calls one deployment's stats method with a time limit; counts what went wrong."""

    def __init__(
        self,
        fn: Callable[[], Any] | None,
        timeout_s: float,
        bad: BadInput,
        on_outcome: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.fn = fn
        self.timeout_s = timeout_s
        self.bad = bad
        self._on_outcome = on_outcome
        self._running: asyncio.Future[Any] | None = None
        """The thread still running a sync call that timed out."""

    async def collect(self) -> dict[str, float]:
        if self.fn is None:
            return {}
        if self._running is not None and not self._running.done():
            return self._fail(BUSY, "the previous call is still running")
        try:
            async with asyncio.timeout(self.timeout_s):
                value = await self._call(self.fn)
            out = validate(value)
        except TimeoutError:
            return self._fail(TIMEOUT, f"no answer within {self.timeout_s:g} s")
        except BadStats as exc:
            return self._fail(exc.reason, exc.detail)
        except Exception as exc:  # user code: whatever it raises
            return self._fail(RAISED, f"{type(exc).__name__}: {exc}")
        self._on_outcome("ok")
        return out

    async def _call(self, fn: Callable[[], Any]) -> Any:
        if inspect.iscoroutinefunction(fn):
            return await fn()
        self._running = running = asyncio.ensure_future(asyncio.to_thread(fn))
        running.add_done_callback(_retrieve)  # an abandoned call's error is counted, not warned
        # shielded: a timeout abandons the thread's future instead of cancelling it, so `busy`
        # can see that the thread is still at work
        result = await asyncio.shield(self._running)
        if inspect.isawaitable(result):  # a sync wrapper around a coroutine
            result = await result
        return result

    def _fail(self, reason: str, detail: str) -> dict[str, float]:
        self._on_outcome(reason)
        self.bad.drop(reason, f"{METHOD}(): {detail}; report sent without custom metrics")
        return {}


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()

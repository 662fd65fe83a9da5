"""Running custom policies: one call of a user's function, and the in-process runner.

How it works. `invoke` is what every runner does with one call: put the state in the context,
call the function, check the answer (`count_of`), and say what became of it; nothing the function
raises escapes. `Loaded` keeps the imported functions of one process and the imports that failed,
each tried again RELOAD_AFTER_S after it failed (on the runner's clock: a package may be
installed while the controller runs).

`InlineRunner` calls each function in this process, in order, with no deadline: a policy that
never returns never returns from `run` either. The unit tests and tools that drive the core on
a simulated clock use it; the controller service runs policies in a worker process under a
deadline instead (policy_host.py, whose worker, policy_worker.py, uses `invoke` and `Loaded`).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from .custom_policy import (
    BAD_VALUE,
    EMPTY_STATE,
    NOT_LOADED,
    OK,
    RAISED,
    RELOAD_AFTER_S,
    Answer,
    AutoscalingContext,
    BadAnswer,
    Policy,
    PolicyCall,
    PolicyLoadError,
    count_of,
    load_policy,
)

Invoked = tuple[str, int, Mapping[str, Any] | None, str]
"""(outcome, count, new policy state or None, detail)."""


def invoke(fn: Policy, ctx: AutoscalingContext) -> Invoked:
    """Call `fn(ctx)` and check its answer."""
    try:
        count, state = count_of(fn(ctx))
    except BadAnswer as exc:
        return BAD_VALUE, 0, None, str(exc)
    except (Exception, SystemExit) as exc:  # user code: nothing it raises may stop the caller
        return RAISED, 0, None, f"{type(exc).__name__}: {exc}"
    return OK, count, state, ""


class Loaded:
    """The policy functions of one process, imported at their first call."""

    def __init__(
        self,
        loader: Callable[[str], Policy] = load_policy,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._loader, self._clock = loader, clock
        self._fns: dict[str, Policy] = {}
        self._failed: dict[str, tuple[str, float]] = {}
        """path -> (why, when) of its last failed import."""

    def get(self, path: str, *, retry: bool = False) -> Policy | str:
        """The function, or why it did not import: a failed import is tried again
        RELOAD_AFTER_S after it failed, or now with `retry`."""
        fn = self._fns.get(path)
        if fn is not None:
            return fn
        failed = self._failed.get(path)
        if failed is not None:
            if not retry and self._clock() < failed[1] + RELOAD_AFTER_S:
                return failed[0]
            importlib.invalidate_caches()  # else a package installed meanwhile stays unseen
        try:
            fn = self._fns[path] = self._loader(path)
        except PolicyLoadError as exc:
            self._failed[path] = (str(exc), self._clock())
            return str(exc)
        self._failed.pop(path, None)
        return fn


class InlineRunner:
    """Calls the policies in this process, one after the other (no deadline)."""

    def __init__(
        self,
        *,
        loader: Callable[[str], Policy] = load_policy,
        timer: Callable[[], float] = time.perf_counter,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.loaded = Loaded(loader, clock)
        self._timer = timer

    def run(self, calls: Sequence[PolicyCall]) -> list[Answer]:
        return [self._one(c) for c in calls]

    def _one(self, call: PolicyCall) -> Answer:
        fn = self.loaded.get(call.path)
        if isinstance(fn, str):
            return Answer(NOT_LOADED, detail=fn)
        state = call.state if isinstance(call.state, Mapping) else EMPTY_STATE
        ctx = replace(call.ctx, policy_state=state)
        started = self._timer()
        outcome, count, new_state, detail = invoke(fn, ctx)
        took = self._timer() - started
        kept = None if new_state is None else MappingProxyType(dict(new_state))
        return Answer(outcome, count, kept, detail, took)

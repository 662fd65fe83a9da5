"""Lifecycle state machines as one table each, and what a refused transition leaves behind.

How it works (h11's `_state.py`): a `Machine` is its states, its events and one table
`{(state, event): next state}`. `step(state, event)` looks the pair up. Found, the machine moves
to the next state; a pair mapping to its own state is a legal no-op (the same news twice, or a
known race the machine absorbs), listed so that the table says it is expected. Missing, the event
is illegal in that state: the state stays as it was and a `Refused` comes back. Nothing raises:
a peer's late or out-of-order message must not crash a service, and the caller (a pure core)
returns the `Refused` to its shell, which counts it (a Prometheus counter labelled machine, state,
event) and logs it at most once per interval per kind (`RefusalLog`).

A machine checks its table when built (every key and value one of its declared states and
events), so a typo in a table fails at import, not at the first odd message.
"""

from __future__ import annotations

import enum
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from shared.clock import SYSTEM_CLOCK, Clock

S = TypeVar("S", bound=enum.Enum)
E = TypeVar("E", bound=enum.Enum)

DEFAULT_LOG_INTERVAL_S = 10.0


@dataclass(frozen=True, slots=True)
class Refused:
    """An event a machine refused in a state (its state stayed). Plain strings: the labels of the
    counter the shell increments, bounded by the machine's declared states and events."""

    machine: str
    state: str
    event: str

    def __str__(self) -> str:
        return f"{self.machine}: {self.event} refused in state {self.state}"


@dataclass(frozen=True, slots=True)
class Machine(Generic[S, E]):
    """A state machine: `table` maps (state, event) to the next state; a pair not in it is
    refused. `initial` is where a new instance starts."""

    name: str
    states: tuple[S, ...]
    events: tuple[E, ...]
    initial: S
    table: Mapping[tuple[S, E], S]

    def __post_init__(self) -> None:
        states, events = set(self.states), set(self.events)
        if self.initial not in states:
            raise ValueError(f"{self.name}: initial state {self.initial} not declared")
        for (state, event), nxt in self.table.items():
            if state not in states or nxt not in states or event not in events:
                raise ValueError(f"{self.name}: ({state}, {event}) -> {nxt} not declared")

    def step(self, state: S, event: E) -> tuple[S, Refused | None]:
        """The state after `event`, and None; or `state` unchanged and why it was refused."""
        nxt = self.table.get((state, event))
        if nxt is None:
            return state, self.refused(state, event)
        return nxt, None

    def refused(self, state: S, event: E | str) -> Refused:
        label = str(event.value) if isinstance(event, enum.Enum) else event
        return Refused(self.name, str(state.value), label)

    def allows(self, state: S, event: E) -> bool:
        return (state, event) in self.table


class RefusalLog:
    """The shell's half: count each refusal (`count`, e.g. a Prometheus counter's inc; None when
    the shell counts elsewhere) and log it, at most one line per (machine, state, event) per
    interval, with how many were left out."""

    __slots__ = ("_clock", "_count", "_interval", "_last", "_logger", "_suppressed", "where")

    def __init__(
        self,
        where: str,
        logger: logging.Logger,
        count: Callable[[Refused], None] | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
        interval_s: float = DEFAULT_LOG_INTERVAL_S,
    ) -> None:
        self.where = where
        self._logger = logger
        self._count = count
        self._clock = clock
        self._interval = interval_s
        self._last: dict[Refused, float] = {}
        self._suppressed: Counter[Refused] = Counter()

    def refused(self, r: Refused, detail: str = "") -> None:
        if self._count is not None:
            self._count(r)
        now = self._clock.monotonic()
        last = self._last.get(r)
        if last is not None and now - last < self._interval:
            self._suppressed[r] += 1
            return
        self._last[r] = now
        more = self._suppressed.pop(r, 0)
        suffix = f" ({more} more since last report)" if more else ""
        self._logger.warning("%s: %s %s%s", self.where, r, detail, suffix)

"""Replica choice: power of two choices over locally known queue lengths, with reject backoff.

How it works: for each member replica the chooser knows
- `in_flight`: requests this router has sent there and not yet finished (exact, local), and
- `external`: the rest of the replica's load, learnt from the `num_ongoing` on its last admission
  (minus our own in-flight at that moment). We never see other routers' requests finish, so this
  estimate decays (halving every `EXTERNAL_HALF_LIFE_S`) and is replaced by each new admission.
Queue length = in_flight + decayed external. `choose` samples two distinct available replicas at
random and returns the shorter queue (power of two choices: near-best balance at O(1) cost).

A replica whose `max_ongoing_requests` is known (its member value carries it) is full while its
queue length is at that limit: `choose` skips it, so a router does not send what the replica
would refuse, and the request waits in the router's own queue (oldest first) for a finish.

Multiplexed models: a replica that multiplexes lists the models it holds (or is loading) on each
admission (`models`); the chooser keeps that list per replica and an index from model to the
replicas holding it. A request for a model (`model_id`) goes to a holder that has room (not full,
not backing off, not excluded): the shorter queue of two holders drawn at random. When no holder
has room, the model loads elsewhere: as in Ray, among the replicas with room that hold the fewest
models (where it evicts nothing, or the least), the shorter queue of two. Dispatching a model's request
counts the replica as holding it at once, so a burst for a new model lands on one replica instead
of loading it everywhere; the replica's next admission corrects the list (it may have evicted),
except for models of requests sent after the one it answers, which it had not seen yet.

A replica that rejected a request (full or draining) or never answered one is unavailable for a
backoff that starts at `backoff_initial_s` and doubles per consecutive failure up to
`backoff_max_s`; an accepted admission resets it. When every member is backing off, `choose`
returns None and `next_available_at` says when to look again.

Pure: randomness is an injected `random.Random`, time is passed in as `now`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

BACKOFF_INITIAL_S: Final = 0.010
BACKOFF_MAX_S: Final = 0.500
EXTERNAL_HALF_LIFE_S: Final = 1.0
"""How fast the load other routers put on a replica is forgotten without a fresh admission."""
SAMPLE_TRIES: Final = 8
"""Random draws before `choose` falls back to scanning every member (many are backing off)."""


@dataclass(slots=True)
class ReplicaLoad:
    in_flight: int = 0
    external: float = 0.0
    external_at: float = 0.0
    backoff_s: float = 0.0
    backoff_until: float = -math.inf
    limit: int = 0
    """The replica's `max_ongoing_requests` (0: not known, never counted full)."""
    models: frozenset[str] = frozenset()
    """The multiplexed models it holds, as its last admission said (plus ones sent since)."""
    sent: dict[str, int] = field(default_factory=dict)
    """Models of requests sent here, by the dispatch number of the last one: an admission
    answering an earlier request may not list them yet (see `on_admission`)."""


class ReplicaChooser:
    __slots__ = (
        "_backoff_initial", "_backoff_max", "_dispatches", "_holders", "_loads", "_member_set",
        "_members", "_rng",
    )  # fmt: skip

    def __init__(
        self,
        rng: random.Random | None = None,
        *,
        backoff_initial_s: float = BACKOFF_INITIAL_S,
        backoff_max_s: float = BACKOFF_MAX_S,
    ) -> None:
        self._rng = rng if rng is not None else random.Random()
        self._backoff_initial = backoff_initial_s
        self._backoff_max = backoff_max_s
        self._members: list[str] = []
        self._member_set: set[str] = set()
        self._dispatches = 0
        """Requests dispatched so far (their numbers order them against admissions)."""
        """The members again, for lookups: only members' models are indexed."""
        self._loads: dict[str, ReplicaLoad] = {}
        self._holders: dict[str, set[str]] = {}
        """model id -> member replicas holding it (as far as this router knows)."""

    # -- membership -------------------------------------------------------------------------
    def set_members(
        self, replica_ids: Iterable[str], limits: Mapping[str, int | None] | None = None
    ) -> None:
        """Replace the member set (`limits`: their `max_ongoing_requests` where known). Survivors
        keep their state; a departed replica keeps its entry only while requests are still in
        flight there (they finish and are counted down)."""
        self._members = list(dict.fromkeys(replica_ids))
        members = self._member_set = set(self._members)
        for rid, gone in self._loads.items():
            if rid not in members:  # departed: it holds nothing for us
                if gone.models:
                    self._set_models(rid, gone, frozenset())
                gone.sent.clear()
        idle_gone = [r for r, ld in self._loads.items() if r not in members and not ld.in_flight]
        for rid in idle_gone:
            del self._loads[rid]
        limits = limits or {}
        for rid in self._members:
            load = self._loads.get(rid)
            if load is None:
                load = self._loads[rid] = ReplicaLoad()
            load.limit = limits.get(rid) or 0

    @property
    def members(self) -> tuple[str, ...]:
        return tuple(self._members)

    # -- choice -----------------------------------------------------------------------------
    def available(self, replica_id: str, now: float) -> bool:
        load = self._loads.get(replica_id)
        return load is not None and _open(load, now)

    def queue_length(self, replica_id: str, now: float) -> float:
        load = self._loads.get(replica_id)
        if load is None:
            return 0.0
        return load.in_flight + _decayed(load, now)

    def choose(
        self, now: float, exclude: Collection[str] = (), model_id: str | None = None
    ) -> str | None:
        """Pick a replica for one request, or None if every member is excluded or backing off.
        `model_id`: the request's multiplexed model (a holder with room first)."""
        if model_id is not None:
            return self._choose_for_model(now, exclude, model_id)
        members = self._members
        n = len(members)
        if n == 0:
            return None
        if n == 1:
            only = members[0]
            return only if only not in exclude and _open(self._loads[only], now) else None
        first: str | None = None
        second: str | None = None
        randrange = self._rng.randrange
        for _ in range(SAMPLE_TRIES):
            rid = members[randrange(n)]
            if rid == first or rid in exclude or not _open(self._loads[rid], now):
                continue
            if first is None:
                first = rid
            else:
                second = rid
                break
        if second is None:
            candidates = [r for r in members if r not in exclude and _open(self._loads[r], now)]
            if not candidates:
                return None
            if len(candidates) == 1:
                return candidates[0]
            first, second = self._rng.sample(candidates, 2)
        assert first is not None
        if self.queue_length(second, now) < self.queue_length(first, now):
            return second
        return first

    def _choose_for_model(self, now: float, exclude: Collection[str], model_id: str) -> str | None:
        holders = self._holders.get(model_id)
        if holders:
            loads = self._loads
            room = [r for r in holders if r not in exclude and _open(loads[r], now)]
            if len(room) == 1:
                return room[0]
            if room:
                first, second = self._rng.sample(room, 2)
                if self.queue_length(second, now) < self.queue_length(first, now):
                    return second
                return first
        # no holder with room: the model loads somewhere. As Ray, among the replicas holding the
        # fewest models (where it evicts nothing, or the least), by the usual two choices. A
        # scan, but only on a miss, which costs a model load anyway.
        loads = self._loads
        fewest: list[str] = []
        least = -1
        for r in self._members:
            if r in exclude or not _open(loads[r], now):
                continue
            held = len(loads[r].models)
            if least < 0 or held < least:
                fewest, least = [r], held
            elif held == least:
                fewest.append(r)
        if len(fewest) <= 1:
            return fewest[0] if fewest else None
        first, second = self._rng.sample(fewest, 2)
        return second if self.queue_length(second, now) < self.queue_length(first, now) else first

    @property
    def dispatches(self) -> int:
        """The number `on_dispatch` gave the latest request."""
        return self._dispatches

    def models_of(self, replica_id: str) -> frozenset[str]:
        load = self._loads.get(replica_id)
        return load.models if load is not None else frozenset()

    def holders(self, model_id: str) -> frozenset[str]:
        return frozenset(self._holders.get(model_id, ()))

    def next_available_at(self, now: float) -> float | None:
        """When the earliest unavailable member may be tried again (None: no members, or only
        ones full with our own requests, which a finish frees)."""
        at = min((_opens_at(self._loads[r], now) for r in self._members), default=math.inf)
        return None if math.isinf(at) else max(now, at)

    # -- events -----------------------------------------------------------------------------
    def on_dispatch(self, replica_id: str, model_id: str | None = None) -> int:
        """A request was sent there; returns its dispatch number (for `on_admission`)."""
        load = self._loads.get(replica_id)
        if load is None:
            load = self._loads[replica_id] = ReplicaLoad()
        load.in_flight += 1
        self._dispatches += 1
        if model_id is not None and replica_id in self._member_set:
            load.sent[model_id] = self._dispatches
            if model_id not in load.models:
                self._set_models(replica_id, load, load.models | {model_id})
        return self._dispatches

    def on_finish(self, replica_id: str) -> None:
        load = self._loads.get(replica_id)
        if load is None:
            return
        load.in_flight = max(0, load.in_flight - 1)
        if not load.in_flight and replica_id not in self._members:
            del self._loads[replica_id]

    def on_admission(
        self,
        replica_id: str,
        accepted: bool,
        num_ongoing: int,
        now: float,
        models: Collection[str] | None = None,
        model_id: str | None = None,
        dispatch: int | None = None,
    ) -> None:
        """Fold an admission in: its `num_ongoing` replaces the external-load estimate; a
        rejection starts (or doubles) the backoff, an acceptance clears it. `models` (when the
        replica multiplexes) replaces what it holds, plus `model_id`, the admitted request's
        model, which loads there now, plus the models of requests sent there after this one
        (`dispatch`: its number from `on_dispatch`; None: none are kept). The replica answered
        before those arrived (NATS keeps one sender's order), so its list cannot show them."""
        load = self._loads.get(replica_id)
        if load is None:
            return
        if models is not None and replica_id in self._member_set:
            held = frozenset(models)
            if load.sent:
                after = self._dispatches if dispatch is None else dispatch
                load.sent = {m: n for m, n in load.sent.items() if n > after}
                held |= load.sent.keys()
            if accepted and model_id is not None:
                held |= {model_id}
            if held != load.models:
                self._set_models(replica_id, load, held)
        load.external = float(max(0, num_ongoing - load.in_flight))
        load.external_at = now
        if accepted:
            load.backoff_s = 0.0
            load.backoff_until = -math.inf
        else:
            self._back_off(load, now)

    def on_unreachable(self, replica_id: str, now: float) -> None:
        """No admission in time, or no responders: back off like a rejection."""
        load = self._loads.get(replica_id)
        if load is not None:
            self._back_off(load, now)

    def on_capacity_freed(self, replica_id: str) -> None:
        """One of our requests there finished: it may accept again before its backoff ends.
        The backoff length is kept, so a further rejection still backs off longer."""
        load = self._loads.get(replica_id)
        if load is not None:
            load.backoff_until = -math.inf

    def backoff_s(self, replica_id: str) -> float:
        load = self._loads.get(replica_id)
        return load.backoff_s if load is not None else 0.0

    def in_flight(self, replica_id: str) -> int:
        load = self._loads.get(replica_id)
        return load.in_flight if load is not None else 0

    def in_flight_total(self) -> int:
        return sum(load.in_flight for load in self._loads.values())

    def _set_models(self, replica_id: str, load: ReplicaLoad, models: frozenset[str]) -> None:
        holders = self._holders
        for m in load.models - models:
            ids = holders.get(m)
            if ids is not None:
                ids.discard(replica_id)
                if not ids:
                    del holders[m]
        for m in models - load.models:
            holders.setdefault(m, set()).add(replica_id)
        load.models = models

    def _back_off(self, load: ReplicaLoad, now: float) -> None:
        step = self._backoff_initial if load.backoff_s <= 0 else load.backoff_s * 2
        load.backoff_s = min(step, self._backoff_max)
        load.backoff_until = now + load.backoff_s


def _open(load: ReplicaLoad, now: float) -> bool:
    """Not backing off, and not full (as far as this router knows)."""
    if load.backoff_until > now:
        return False
    if not load.limit or load.in_flight + load.external < load.limit:
        return True  # fast path: even undecayed, the external estimate leaves room
    return load.in_flight + _decayed(load, now) < load.limit


def _opens_at(load: ReplicaLoad, now: float) -> float:
    """When `_open` turns true with no event in between (inf: only a finish of ours frees it)."""
    at = load.backoff_until
    if not load.limit or load.in_flight + _decayed(load, now) < load.limit:
        return at
    room = load.limit - load.in_flight
    if room <= 0:
        return math.inf
    # the external estimate halves every half-life: it leaves room once below `room`
    age = EXTERNAL_HALF_LIFE_S * math.log2(load.external / room)
    return max(at, load.external_at + age + 1e-9)


def _decayed(load: ReplicaLoad, now: float) -> float:
    if load.external <= 0.0:
        return 0.0
    age = max(0.0, now - load.external_at)
    return load.external * math.exp2(-age / EXTERNAL_HALF_LIFE_S)

"""The router's decisions, pure: which replica, wait or refuse, when to report and what it says.

How it works: one `RouterCore` per deployment holds the router's state and is driven by its shell
(router.py), which feeds it events with the monotonic `now` (and, for a report, the wall time and
the local health statuses) and carries out the actions it gets back. Nothing here awaits, touches
the bus or reads a clock, so a sequence of events gives the same decisions every time.

- Choosing (`choose`, the hot path): while nobody waits, a request takes a replica from the
  chooser (choice.py: power of two choices; a replica backing off after a rejection, or full at
  its `max_ongoing_requests`, is never chosen; a request for a multiplexed model goes to a replica
  holding it when one has room). Once someone waits, a newcomer queues behind them;
  a refused request (`retry`) is older than the waiters and may take a replica at once.
- Queueing (`queue_step`, `leave_queue`): a request that found no replica calls `queue_step`
  each time it looks; the answer is `Take` (a replica), `Expired` (its deadline passed), `Refuse`
  (back-pressure: the line is at its bound, the deployment's `max_queued_requests` when its
  members carry it, else the router's) or `Wait` (join the line, or stay in it, for at most
  `wait_s`). Only the head of the line may take a replica; the head waits at most
  `queue_poll_max_s`, or until the earliest backoff ends, those behind it until their deadline
  (the head hands its turn on when it leaves: `WakeHead`). The line holds the shell's tokens (its
  events), which the core stores and hands back but never uses.
- Carried health and membership: statuses from admissions, frames and probes go to the
  carried-health map (carried_health.py). KV changes are applied to a `MembershipView`
  (`member_changed`): while a watch reads its initial values into a fresh view, nothing is
  refreshed; `install_view` swaps a complete view in at once. Later changes to the installed view
  are coalesced (`RefreshSoon`, once until `refresh` runs). `refresh` hands the member set to the
  chooser and prunes the health map and the windows of departed replicas; it returns
  `MembersChanged` (the shell prunes liveness and wakes the head) only when the set, a subject
  or a limit changed. The epoch is the largest member epoch ever applied: it never goes back.
- Reports: one is due `report_interval_s` after the last (the members' `metrics_interval_s`, else
  the router's), at once after a cold start (a request queued while there are no replicas, at most
  once per `cold_start_report_min_interval_s`) or a rise that held (rise.py: `dispatched` or a
  join may start one, answered with `CheckRise`; `rise_check` then says whether it held). Whenever
  the due time moves earlier, the answer includes `WakeReporter`. `take_report` closes the
  windows and builds the `HandleReport` (data: the shell encodes and publishes it).

Per request, `choose`, `dispatched`, `admitted`, `finished` and `unreachable` are O(1) and
allocate nothing of their own: the no-action answer is the shared empty tuple, the common
actions are shared constants.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from services.router.carried_health import CarriedHealthMap
from services.router.choice import ReplicaChooser
from services.router.config import RouterConfig
from services.router.reports import RequestCounters, build_handle_report
from services.router.rise import RISE_SETTLE_S, RiseDetector
from services.router.window import TimeWeightedCounts, TimeWeightedGauge
from shared.kv.membership import Member, MembershipView
from shared.subjects import Subjects
from shared.wire.messages import Admission, HandleReport, HealthStatus

MIN_WAIT_S: Final = 0.001
"""Shorter waits are not worth a timer: a report this close to due goes now."""

T = TypeVar("T")

# -- actions (the shell carries them out) ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WakeHead:
    """Capacity may have freed: the oldest waiter looks again (and hands on its turn)."""


@dataclass(frozen=True, slots=True)
class WakeReporter:
    """The next report is due earlier than the reporter is waiting for: it looks again."""


@dataclass(frozen=True, slots=True)
class RefreshSoon:
    """The installed view changed: call `refresh` once the current burst of changes is in."""


@dataclass(frozen=True, slots=True)
class CheckRise:
    """A rise in load started: call `rise_check` at `at` (monotonic)."""

    at: float


@dataclass(frozen=True, slots=True)
class MembersChanged:
    """The member set (or a member's subject or limit) changed; the shell prunes per-replica
    state it keeps (liveness) to `members` and logs the new set once."""

    epoch: int
    members: Mapping[str, Member]
    probe_subjects: Mapping[str, str]


Action = WakeHead | WakeReporter | RefreshSoon | CheckRise | MembersChanged
Actions = tuple[Action, ...]

NO_ACTIONS: Final[Actions] = ()
WAKE_HEAD: Final[Actions] = (WakeHead(),)
WAKE_REPORTER: Final[Actions] = (WakeReporter(),)
REFRESH_SOON: Final[Actions] = (RefreshSoon(),)

# -- answers to a queued request's look ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Take:
    """Send to this replica now (and leave the line, if in it)."""

    replica_id: str


@dataclass(frozen=True, slots=True)
class Expired:
    """The request's deadline passed while no replica took it."""

    replicas: int


@dataclass(frozen=True, slots=True)
class Refuse:
    """Back-pressure: the line is full (`queued` waiting, bound `limit`, set by `setting`)."""

    queued: int
    limit: int
    setting: str


@dataclass(frozen=True, slots=True)
class Wait:
    """Wait in the line (joined now when `joined`) for at most `wait_s` (inf: the deadline is
    unbounded), or until woken; then look again. Carry out `actions` first."""

    wait_s: float
    joined: bool
    actions: Actions = NO_ACTIONS


Look = Take | Expired | Refuse | Wait


class WaitLine(Generic[T]):
    """Oldest first; only the head may take a replica. Tokens are the shell's (compared by
    identity, never used here)."""

    __slots__ = ("_line",)

    def __init__(self) -> None:
        self._line: deque[T] = deque()

    def __len__(self) -> int:
        return len(self._line)

    def __iter__(self) -> Iterator[T]:
        return iter(self._line)

    def join(self, token: T, *, front: bool = False) -> None:
        if front:
            self._line.appendleft(token)
        else:
            self._line.append(token)

    def head(self) -> T | None:
        return self._line[0] if self._line else None

    def is_head(self, token: T) -> bool:
        return bool(self._line) and self._line[0] is token

    def leave(self, token: T) -> bool:
        """Out of the line; True when it was the head and another waiter is next."""
        if self.is_head(token):
            self._line.popleft()
            return bool(self._line)
        # only a deadline or a cancel leaves from behind the head: O(n) there is rare
        self._line.remove(token)
        return False


class RouterCore(Generic[T]):
    """State and decisions of one deployment's router (see the module docstring). `T`: the
    shell's waiter token."""

    __slots__ = (
        "_cold_pending", "_early_pending", "_last_cold", "_last_report", "_refresh_pending",
        "app", "chooser", "config", "counters", "deployment", "epoch", "handle_id", "health",
        "in_flight_now", "line", "members", "probe_subjects", "queued", "queued_now", "rise",
        "running", "seq", "subjects", "view",
    )  # fmt: skip

    def __init__(
        self,
        app: str,
        deployment: str,
        *,
        handle_id: str,
        config: RouterConfig,
        subjects: Subjects,
        now: float,
        rng: random.Random | None = None,
    ) -> None:
        self.app, self.deployment, self.handle_id = app, deployment, handle_id
        self.config, self.subjects = config, subjects
        self.chooser = ReplicaChooser(
            rng, backoff_initial_s=config.backoff_initial_s, backoff_max_s=config.backoff_max_s
        )
        self.health = CarriedHealthMap()
        self.running = TimeWeightedCounts(now)
        self.queued = TimeWeightedGauge(now)
        self.counters = RequestCounters()
        self.rise = RiseDetector(config.cold_start_report_min_interval_s)
        self.line: WaitLine[T] = WaitLine()
        self.members: dict[str, Member] = {}
        self.probe_subjects: dict[str, str] = {}
        self.view = MembershipView(app, deployment)
        self.epoch = -1
        self.seq = 0
        self.queued_now = 0
        self.in_flight_now = 0
        self._refresh_pending = False
        self._cold_pending = False
        self._early_pending = False
        self._last_cold = -math.inf
        self._last_report = now

    # -- settings the members carry ---------------------------------------------------------------
    @property
    def queue_bound(self) -> tuple[int, str]:
        """How many requests may wait here, and which setting says so: the deployment's
        `max_queued_requests` (its members carry it), else this router's own bound."""
        carried = self.view.max_queued_requests
        if carried is not None:
            return carried, "the deployment's max_queued_requests"
        return self.config.max_queued_requests, "the router's --max-queued"

    @property
    def report_interval_s(self) -> float:
        """The deployment's report cadence (see the module docstring)."""
        carried = self.view.report_interval_s
        return self.config.metrics_interval_s if carried is None else carried

    # -- membership ---------------------------------------------------------------------------
    def member_changed(self, view: MembershipView, key: str, doc: Member | None) -> Actions:
        """A KV put (`doc`) or delete under `key`, applied to `view`: the installed one, or a
        fresh one a watch is reading its initial values into (no action until installed).
        Raises WireError for a member that does not belong under `key`."""
        interval = view.report_interval_s
        changed = view.put(key, doc) if doc is not None else view.delete(key)
        if view is not self.view:
            return NO_ACTIONS
        interval_moved = view.report_interval_s != interval
        refresh = changed and not self._refresh_pending
        if refresh:
            self._refresh_pending = True
        if refresh and interval_moved:
            return (RefreshSoon(), WakeReporter())
        if refresh:
            return REFRESH_SOON
        return WAKE_REPORTER if interval_moved else NO_ACTIONS

    def install_view(self, view: MembershipView) -> Actions:
        """A complete view replaces the old one at once (a watch read its initial values, or a
        tool set the members); the reporter looks again (the interval may be new)."""
        self.view = view
        changed = self.refresh()
        return WAKE_REPORTER if changed is None else (changed, WakeReporter())

    def refresh(self) -> MembersChanged | None:
        """Hand the installed view to the chooser and prune per-replica state (see the module
        docstring); None when the member set, subjects and limits are unchanged."""
        self._refresh_pending = False
        self.epoch = max(self.epoch, self.view.epoch)
        members = {m.replica_id: m for m in self.view.members()}
        old = self.members
        self.members = members
        if members.keys() == old.keys() and all(
            (m.rpc_subject, m.max_ongoing_requests)
            == (old[r].rpc_subject, old[r].max_ongoing_requests)
            for r, m in members.items()
        ):
            return None
        self.probe_subjects = {rid: self.subjects.probe(rid) for rid in members}
        self.chooser.set_members(
            members, {rid: m.max_ongoing_requests for rid, m in members.items()}
        )
        self.health.prune_to(members)
        return MembersChanged(self.epoch, members, self.probe_subjects)

    # -- per request (the hot path) ---------------------------------------------------------------
    def choose(
        self,
        now: float,
        exclude: Collection[str],
        *,
        retry: bool = False,
        model_id: str | None = None,
    ) -> str | None:
        """A replica for a request that has not queued yet; None: it queues (`queue_step`).
        `model_id`: the request's multiplexed model (choice.py: a holder with room first)."""
        if self.line and not retry:
            return None  # a newcomer never overtakes a waiter
        return self.chooser.choose(now, exclude, model_id)

    def dispatched(self, replica_id: str, now: float, model_id: str | None = None) -> Actions:
        self.chooser.on_dispatch(replica_id, model_id)
        self.running.add(replica_id, 1.0, now)
        self.in_flight_now += 1
        return self._load_rose(now)

    def admitted(
        self,
        replica_id: str,
        admission: Admission,
        now: float,
        model_id: str | None = None,
        dispatch: int | None = None,
    ) -> None:
        """`dispatch`: the request's number (`chooser.dispatches` right after `dispatched`),
        which orders the replica's list of models against requests sent since (choice.py)."""
        self.health.observe(admission.health, now)
        self.chooser.on_admission(
            replica_id,
            admission.accepted,
            admission.num_ongoing,
            now,
            admission.models,
            model_id,
            dispatch,
        )

    def unreachable(self, replica_id: str, now: float) -> None:
        self.chooser.on_unreachable(replica_id, now)

    def finished(self, replica_id: str, now: float) -> Actions:
        self.chooser.on_finish(replica_id)
        self.running.add(replica_id, -1.0, now)
        self.in_flight_now -= 1
        if not self.queued_now:
            return NO_ACTIONS
        # a slot freed there: let a waiter try that replica before its backoff runs out
        self.chooser.on_capacity_freed(replica_id)
        return WAKE_HEAD

    def fold_health(self, status: HealthStatus, now: float) -> None:
        self.health.observe(status, now)

    # -- the queue --------------------------------------------------------------------------------
    def queue_step(
        self,
        token: T,
        joined: bool,
        now: float,
        deadline: float,
        exclude: set[str],
        *,
        front: bool = False,
        model_id: str | None = None,
    ) -> Look:
        """One look of a request that found no replica (`joined`: `token` is in the line).
        `front`: a refused request, older than every waiter. When every replica but the excluded
        ones is unavailable and the excluded ones are not, `exclude` is cleared (everyone failed
        this request once: all may be tried again)."""
        line = self.line
        if line.is_head(token) if joined else front or not line:
            rid = self.chooser.choose(now, exclude, model_id)
            if rid is None and exclude:
                exclude.clear()
                rid = self.chooser.choose(now, (), model_id)
            if rid is not None:
                return Take(rid)
        if now >= deadline:
            return Expired(len(self.members))
        actions = NO_ACTIONS
        if not joined:
            limit, setting = self.queue_bound
            if self.queued_now >= limit:
                return Refuse(self.queued_now, limit, setting)
            line.join(token, front=front)
            self.queued_now += 1
            self.queued.add(1.0, now)
            actions = self._cold_start(now) if not self.members else self._load_rose(now)
        wait = deadline - now  # behind the head: it hands on its turn, no polling
        if line.is_head(token):
            wait = min(wait, self.config.queue_poll_max_s)
            next_at = self.chooser.next_available_at(now)
            if next_at is not None and next_at > now:
                wait = min(wait, next_at - now)
        return Wait(wait, not joined, actions)

    def leave_queue(self, token: T, now: float) -> Actions:
        """`token` leaves the line (with a replica, at its deadline, or cancelled)."""
        self.queued_now -= 1
        self.queued.add(-1.0, now)
        return WAKE_HEAD if self.line.leave(token) else NO_ACTIONS

    def _cold_start(self, now: float) -> Actions:
        if now - self._last_cold < self.config.cold_start_report_min_interval_s:
            return NO_ACTIONS
        self._last_cold = now
        self._cold_pending = True
        return WAKE_REPORTER

    def _load_rose(self, now: float) -> Actions:
        """A rise starting here restarts the averages (rise.py)."""
        if not self.rise.begin(self.in_flight_now + self.queued_now, now):
            return NO_ACTIONS
        self.running.roll(now)
        self.queued.roll(now)
        return (CheckRise(now + RISE_SETTLE_S),)

    def rise_check(self, now: float) -> Actions:
        """The settle time of a rise passed: report at once if it held."""
        if not self.rise.settled(self.in_flight_now + self.queued_now, now):
            return NO_ACTIONS
        self._early_pending = True
        return WAKE_REPORTER

    # -- reports ----------------------------------------------------------------------------------
    def start_reports(self, now: float) -> None:
        """The reporter starts: the first regular report is due one interval from `now`."""
        self._last_report = now

    def report_due_at(self) -> float:
        """When the next report is due (-inf: at once)."""
        if self._cold_pending or self._early_pending:
            return -math.inf
        return self._last_report + self.report_interval_s

    def report_wait(self, now: float) -> float:
        """How long the reporter waits before `take_report` (0: now)."""
        wait = self.report_due_at() - now
        return wait if wait > MIN_WAIT_S else 0.0

    def take_report(
        self, now: float, wall: float, local_health: Iterable[HealthStatus] = ()
    ) -> HandleReport:
        """The due report (cold-start aware); the next is due one interval from `now`."""
        cold = self._cold_pending
        self._cold_pending = self._early_pending = False
        self._last_report = now
        return self.make_report(now, wall, local_health, cold_start=cold)

    def make_report(
        self,
        now: float,
        wall: float,
        local_health: Iterable[HealthStatus] = (),
        *,
        cold_start: bool = False,
    ) -> HandleReport:
        """Close the windows and build the next report (seq advances by one)."""
        self.health.expire(now)
        running = self.running.roll(now)
        self.running.forget_idle(self.members)
        for rid in self.members:
            running.setdefault(rid, 0.0)
        queued = self.queued.roll(now)
        if cold_start:
            # the window may be nearly empty; the controller must see the waiting request
            queued = max(queued, float(self.queued_now))
        self.seq += 1
        self.rise.reported(math.fsum(running.values()) + queued)
        return build_handle_report(
            handle_id=self.handle_id,
            app=self.app,
            deployment=self.deployment,
            seq=self.seq,
            sent_at=wall,
            queued_requests=queued,
            running=running,
            carried_health=self.health.snapshot(now),
            local_health=local_health,
            membership_epoch=max(self.epoch, 0),
            stats=self.counters.snapshot(),
        )


def view_of(app: str, deployment: str, epoch: int, members: Iterable[Member]) -> MembershipView:
    """A complete view holding `members` (tests and tools set the whole set at once)."""
    view = MembershipView(app, deployment)
    for m in members:
        view.put(m.key, m)
    view.epoch = max(view.epoch, epoch)
    return view

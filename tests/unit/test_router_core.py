"""The router's pure core (services/router/core.py): events and `now` in, decisions and actions
out; no sockets, no event loop, time is a number the test advances."""

from __future__ import annotations

import math
import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from services.router.config import RouterConfig
from services.router.core import (
    NO_ACTIONS,
    REFRESH_SOON,
    WAKE_HEAD,
    WAKE_REPORTER,
    CheckRise,
    Expired,
    MembersChanged,
    RefreshSoon,
    Refuse,
    RouterCore,
    Take,
    Wait,
    WakeReporter,
    view_of,
)
from services.router.rise import RISE_SETTLE_S
from services.router.testing import Seat, members_of
from shared.kv.membership import Member, MembershipView
from shared.subjects import DEFAULT_SUBJECTS
from shared.wire.messages import Admission, HealthStatus

APP, DEP = "shop", "cart"
INF = math.inf


class Token:
    """A waiter as the shell would hold one (compared by identity)."""


def core(now: float = 0.0, seed: int = 1, **config: object) -> RouterCore[Token]:
    cfg = RouterConfig(**config)  # type: ignore[arg-type]
    return RouterCore(
        APP, DEP, handle_id="h1", config=cfg, subjects=DEFAULT_SUBJECTS, now=now,
        rng=random.Random(seed),
    )  # fmt: skip


def seat(rid: str, limit: int | None = None) -> Seat:
    return Seat(rid, f"fp.v1.rpc.{APP}.{DEP}.{rid}", limit)


def install(c: RouterCore[Token], epoch: int, *seats: Seat, max_queued: int | None = None) -> None:
    c.install_view(view_of(APP, DEP, epoch, members_of(APP, DEP, epoch, seats, max_queued)))


def accepted(rid: str, num_ongoing: int, at: float) -> Admission:
    return Admission(True, num_ongoing, HealthStatus(rid, True, at, 0), False)


# -- choosing and queueing -----------------------------------------------------------------------


def test_a_free_replica_is_taken_at_once_and_a_newcomer_never_overtakes_a_waiter() -> None:
    c = core()
    install(c, 1, seat("a", 1))
    assert c.choose(0.0, set()) == "a"
    assert c.dispatched("a", 0.0) is NO_ACTIONS
    assert c.choose(0.0, set()) is None  # full at its limit
    first = Token()
    look = c.queue_step(first, False, 0.0, 10.0, set())
    assert isinstance(look, Wait) and look.joined and c.queued_now == 1
    assert look.wait_s == c.config.queue_poll_max_s  # the head polls
    second = Token()
    behind = c.queue_step(second, False, 0.0, 10.0, set())
    assert isinstance(behind, Wait) and behind.wait_s == 10.0  # behind the head: no polling
    # a finish frees the slot: the head is woken, a newcomer still may not take it
    assert c.finished("a", 1.0) is WAKE_HEAD
    assert c.choose(1.0, set()) is None
    assert c.queue_step(second, True, 1.0, 10.0, set()) == Wait(9.0, False)
    assert c.queue_step(first, True, 1.0, 10.0, set()) == Take("a")
    assert c.leave_queue(first, 1.0) is WAKE_HEAD  # the head hands its turn on
    assert c.leave_queue(second, 1.0) is NO_ACTIONS
    assert c.queued_now == 0 and len(c.line) == 0
    assert c.finished("a", 1.0) is NO_ACTIONS  # nobody waits: nothing to wake


def test_a_refused_request_goes_first_and_a_full_line_refuses() -> None:
    c = core(max_queued_requests=2)
    install(c, 1, seat("a", 1))
    c.dispatched("a", 0.0)
    waiters = [Token(), Token()]
    for w in waiters:
        assert isinstance(c.queue_step(w, False, 0.0, 5.0, set()), Wait)
    assert c.queue_step(Token(), False, 0.0, 5.0, set()) == Refuse(
        2, 2, "the router's --max-queued"
    )
    retried = Token()  # refused by a replica: older than the waiters, but the line is full
    assert isinstance(c.queue_step(retried, False, 0.0, 5.0, set(), front=True), Refuse)
    c.leave_queue(waiters[1], 0.0)
    look = c.queue_step(retried, False, 0.0, 5.0, set(), front=True)
    assert isinstance(look, Wait) and c.line.head() is retried
    # a newcomer may retry at once without queueing
    c.finished("a", 0.5)
    assert c.choose(0.5, set(), retry=True) == "a"


def test_the_deployments_bound_governs_when_its_members_carry_one() -> None:
    c = core(max_queued_requests=1000)
    install(c, 1, seat("a"), max_queued=1)
    assert c.queue_bound == (1, "the deployment's max_queued_requests")
    c.unreachable("a", 0.0)  # backing off: nobody available
    assert isinstance(c.queue_step(Token(), False, 0.0, 5.0, set()), Wait)
    assert c.queue_step(Token(), False, 0.0, 5.0, set()) == Refuse(
        1, 1, "the deployment's max_queued_requests"
    )


def test_the_deadline_expires_and_the_head_wakes_when_a_backoff_ends() -> None:
    c = core(backoff_initial_s=0.05, backoff_max_s=0.05)
    install(c, 1, seat("a"))
    c.dispatched("a", 0.0)
    c.admitted("a", Admission(False, 1, HealthStatus("a", True, 0.0, 0), False), 0.0)
    c.finished("a", 0.0)
    t = Token()
    look = c.queue_step(t, False, 0.0, 0.5, set())
    assert isinstance(look, Wait) and look.wait_s == 0.05
    assert c.queue_step(t, True, 0.06, 0.5, set()) == Take("a")
    c.leave_queue(t, 0.06)
    c.unreachable("a", 0.06)
    assert c.queue_step(t, False, 0.07, 0.07, set()) == Expired(1)


def test_everyone_excluded_means_all_may_be_tried_again() -> None:
    c = core()
    install(c, 1, seat("a"), seat("b"))
    exclude = {"a", "b"}
    assert c.choose(0.0, exclude) is None
    look = c.queue_step(Token(), False, 0.0, 5.0, exclude)
    assert isinstance(look, Take) and look.replica_id in {"a", "b"} and not exclude


# -- cold start and reports ----------------------------------------------------------------------


def test_a_request_queued_with_no_replicas_makes_a_report_due_at_once() -> None:
    c = core(metrics_interval_s=10.0, cold_start_report_min_interval_s=1.0)
    c.start_reports(0.0)
    assert c.report_wait(0.0) == 10.0
    look = c.queue_step(Token(), False, 0.5, 30.0, set())
    assert isinstance(look, Wait) and look.actions is WAKE_REPORTER
    assert c.report_due_at() == -INF and c.report_wait(0.5) == 0.0
    report = c.take_report(0.5, 1000.5)
    assert report.queued_requests == 1.0 and report.seq == 1 and report.sent_at == 1000.5
    assert report.membership_epoch == 0  # no membership yet
    assert c.report_wait(0.5) == 10.0  # the regular cadence continues from there
    # a second cold start within the minimum interval waits for the regular report
    look = c.queue_step(Token(), False, 1.0, 30.0, set())
    assert isinstance(look, Wait) and look.actions is NO_ACTIONS
    look = c.queue_step(Token(), False, 1.6, 30.0, set())
    assert isinstance(look, Wait) and look.actions is WAKE_REPORTER


def test_the_members_interval_governs_and_a_change_wakes_the_reporter() -> None:
    c = core(metrics_interval_s=30.0)
    c.start_reports(0.0)
    view = MembershipView(APP, DEP)
    m = replace(members_of(APP, DEP, 1, [seat("a")])[0], report_interval_s=2.0)
    assert c.member_changed(view, m.key, m) is NO_ACTIONS  # a fresh view: not installed yet
    assert c.report_interval_s == 30.0
    actions = c.install_view(view)
    assert isinstance(actions[0], MembersChanged) and isinstance(actions[-1], WakeReporter)
    assert c.report_interval_s == 2.0 and c.report_wait(0.5) == 1.5
    m2 = replace(m, epoch=2, report_interval_s=5.0)
    assert c.member_changed(c.view, m2.key, m2) is WAKE_REPORTER  # same member: no refresh
    assert c.report_wait(0.5) == 4.5


def test_a_rise_that_holds_is_reported_early() -> None:
    c = core(metrics_interval_s=30.0)
    install(c, 1, *(seat(f"r{i}") for i in range(4)))
    c.start_reports(0.0)
    actions = NO_ACTIONS
    for i in range(4):
        actions = c.dispatched(f"r{i}", 1.0) or actions
    assert actions == (CheckRise(1.0 + RISE_SETTLE_S),)
    assert c.rise_check(1.0 + RISE_SETTLE_S) is WAKE_REPORTER
    assert c.report_wait(1.2) == 0.0
    report = c.take_report(1.2, 5.0)
    assert sum(report.running.values()) == 4.0  # the rise alone: the window restarted at 1.0
    assert c.rise_check(2.0) is NO_ACTIONS  # nothing armed, and the load was reported


def test_reports_carry_every_member_and_fresh_health_only() -> None:
    c = core()
    install(c, 3, seat("a"), seat("b"))
    c.dispatched("a", 0.0)
    c.admitted("a", accepted("a", 1, 100.0), 0.0)
    c.fold_health(HealthStatus("b", False, 100.0, 2), 0.0)
    report = c.make_report(10.0, 110.0, [HealthStatus("host", True, 109.0, 0)])
    assert report.running == {"a": 1.0, "b": 0.0} and report.membership_epoch == 3
    assert {h.replica_id for h in report.health} == {"a", "b", "host"}
    report = c.make_report(41.0, 141.0)
    assert report.health == () and report.seq == 2  # entries older than 30 s are not re-sent


# -- membership ---------------------------------------------------------------------------------


def test_changes_to_the_installed_view_are_coalesced_into_one_refresh() -> None:
    c = core()
    install(c, 1, seat("a"))
    view = c.view
    ms = members_of(APP, DEP, 2, [seat("a"), seat("b"), seat("c")])
    assert c.member_changed(view, ms[1].key, ms[1]) is REFRESH_SOON
    assert c.member_changed(view, ms[2].key, ms[2]) is NO_ACTIONS  # already pending
    assert set(c.members) == {"a"}  # not until the refresh runs
    changed = c.refresh()
    assert changed is not None and set(changed.members) == {"a", "b", "c"}
    assert changed.probe_subjects["b"] == "fp.v1.probe.b" and c.epoch == 2
    assert c.refresh() is None  # nothing new
    assert c.member_changed(view, ms[2].key, None) is REFRESH_SOON  # a delete
    assert isinstance(c.member_changed(view, ms[1].key, None), tuple)
    assert set(c.refresh().members) == {"a"}  # type: ignore[union-attr]


def test_departed_replicas_lose_their_health_and_the_epoch_never_goes_back() -> None:
    c = core()
    install(c, 5, seat("a"), seat("b"))
    for rid in ("a", "b"):
        c.admitted(rid, accepted(rid, 0, 1.0), 0.0)
    install(c, 6, seat("b"), seat("c"))
    assert set(c.health) == {"b"} and c.epoch == 6
    install(c, 4, seat("a"))
    assert c.epoch == 6 and c.choose(0.0, set()) == "a"
    actions = c.install_view(view_of(APP, DEP, 4, members_of(APP, DEP, 4, [seat("a")])))
    assert actions is WAKE_REPORTER  # the same set: no MembersChanged


def test_a_changed_limit_or_subject_is_a_change() -> None:
    c = core()
    install(c, 1, seat("a"))
    assert isinstance(
        c.install_view(view_of(APP, DEP, 1, members_of(APP, DEP, 1, [seat("a", 2)])))[0],
        MembersChanged,
    )
    moved = Seat("a", "other.subject", 2)
    changed = c.install_view(view_of(APP, DEP, 1, members_of(APP, DEP, 1, [moved])))[0]
    assert isinstance(changed, MembersChanged)
    assert changed.members["a"].rpc_subject == "other.subject"


def test_the_hot_path_answers_with_shared_constants() -> None:
    """No action objects are made per request: the answers are the module's constants."""
    c = core()
    install(c, 1, seat("a"), seat("b"))
    c.take_report(0.0, 0.0)
    c.rise.reported(1e9)  # no rise can start
    adm = accepted("a", 1, 1.0)
    for i in range(100):
        now = i * 0.01
        rid = c.choose(now, ())
        assert rid is not None
        assert c.dispatched(rid, now) is NO_ACTIONS
        c.admitted(rid, adm, now)
        assert c.finished(rid, now) is NO_ACTIONS
    assert c.in_flight_now == 0 and c.chooser.in_flight_total() == 0


# -- invariants ----------------------------------------------------------------------------------

OPS = st.lists(
    st.tuples(
        st.sampled_from(["request", "look", "leave", "finish", "reject", "members", "tick"]),
        st.integers(0, 7),
    ),
    max_size=80,
)


class Model:
    """Drives a core the way the shell does, checking its invariants after every step."""

    def __init__(self, bound: int, limits: dict[str, int], seed: int) -> None:
        self.c = core(seed=seed, max_queued_requests=bound)
        self.bound = bound
        self.limits = limits
        self.now = 0.0
        self.waiting: list[Token] = []
        self.sent: list[str] = []
        self.set_members(sorted(limits))

    def set_members(self, rids: list[str]) -> bool:
        seats = [seat(r, self.limits[r]) for r in rids]
        actions = self.c.install_view(view_of(APP, DEP, 1, members_of(APP, DEP, 1, seats)))
        self.members = set(rids)
        return isinstance(actions[0], MembersChanged)

    def chose(self, rid: str) -> None:
        c = self.c
        assert rid in self.members, "a replica outside the membership was chosen"
        assert c.chooser.queue_length(rid, self.now) < self.limits[rid], "chose a full replica"
        c.dispatched(rid, self.now)
        self.sent.append(rid)

    def step(self, op: str, n: int) -> None:
        c = self.c
        if op == "request":
            rid = c.choose(self.now, set())
            if rid is not None:
                self.chose(rid)
                return
            token = Token()
            look = c.queue_step(token, False, self.now, self.now + 5.0, set())
            if isinstance(look, Take):
                self.chose(look.replica_id)
            elif isinstance(look, Wait):
                self.waiting.append(token)
            else:
                assert isinstance(look, Refuse) and look.queued == look.limit == self.bound
        elif op == "look" and self.waiting:
            token = self.waiting[n % len(self.waiting)]
            look = c.queue_step(token, True, self.now, INF, set())
            if isinstance(look, Take):
                assert c.line.head() is token, "only the head takes a replica"
                self.chose(look.replica_id)
                c.leave_queue(token, self.now)
                self.waiting.remove(token)
        elif op == "leave" and self.waiting:
            c.leave_queue(self.waiting.pop(n % len(self.waiting)), self.now)
        elif op == "finish" and self.sent:
            c.finished(self.sent.pop(n % len(self.sent)), self.now)
        elif op == "reject" and self.sent:
            rid = self.sent[n % len(self.sent)]
            c.admitted(rid, Admission(False, n, HealthStatus(rid, True, 0.0, 0), False), self.now)
        elif op == "members":
            pool = sorted(self.limits)
            if self.set_members([r for i, r in enumerate(pool) if (n >> i) & 1]):
                # (a late admission from a departed replica is kept until the next change)
                assert set(c.health) <= self.members, "a departed replica's health was kept"
        elif op == "tick":
            self.now += 0.01 * (n + 1)
        assert 0 <= c.queued_now <= self.bound, "the queue bound was exceeded"
        assert len(c.line) == c.queued_now == len(self.waiting)
        assert c.in_flight_now == len(self.sent)


@settings(max_examples=150, deadline=None)
@given(OPS, st.integers(1, 4), st.integers(0, 2**16))
def test_property_bound_limits_and_membership_hold_under_any_sequence(
    ops: list[tuple[str, int]], bound: int, seed: int
) -> None:
    m = Model(bound, {"a": 1, "b": 2, "c": 3}, seed)
    for op, n in ops:
        m.step(op, n)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 9)), max_size=30))
def test_property_pruned_replicas_are_never_chosen_and_the_epoch_never_falls(
    changes: list[tuple[int, int]],
) -> None:
    c = core()
    view = MembershipView(APP, DEP)
    c.install_view(view)
    last_epoch = c.epoch
    for slot, epoch in changes:
        if epoch == 0:
            c.member_changed(view, f"{APP}.{DEP}.{slot}", None)
        else:
            m = Member(APP, DEP, slot, f"r{slot}-{epoch}", f"rpc.{slot}.{epoch}", slot, epoch)
            c.member_changed(view, m.key, m)
        c.refresh()
        live = {m.replica_id for m in view.members()}
        assert set(c.members) == live
        assert c.epoch >= last_epoch
        last_epoch = c.epoch
        for _ in range(4):
            rid = c.choose(0.0, ())
            assert (rid is None) == (not live) and (rid is None or rid in live)


def test_actions_are_plain_data() -> None:
    assert RefreshSoon() == RefreshSoon() and CheckRise(1.0) == CheckRise(1.0)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 6), st.lists(st.integers(0, 5), min_size=1, max_size=40))
def test_property_waiters_are_served_oldest_first(waiting: int, lookers: list[int]) -> None:
    """Slots free one at a time while waiters look in any order: only the head ever takes one,
    so requests leave the line in the order they joined."""
    c = core(seed=waiting)
    install(c, 1, seat("a", 1))
    c.dispatched("a", 0.0)
    line = [Token() for _ in range(waiting)]
    joined = list(line)
    for t in line:
        assert isinstance(c.queue_step(t, False, 0.0, INF, set()), Wait)
    served: list[Token] = []
    now = 0.0
    for i in lookers:
        if not line:
            break
        before = len(served)
        now += 0.01
        c.finished("a", now)  # the slot frees
        for t in [line[i % len(line)], *line]:  # an arbitrary waiter looks first, then all
            look = c.queue_step(t, True, now, INF, set())
            if isinstance(look, Take):
                c.dispatched(look.replica_id, now)
                c.leave_queue(t, now)
                line.remove(t)
                served.append(t)
                break
        assert len(served) == before + 1, "a freed slot went unused"
    assert c.queued_now == len(line)
    assert served == joined[: len(served)], "a waiter overtook an older one"

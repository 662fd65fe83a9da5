"""Visiting only the deployments that are due decides exactly what visiting all of them does.

Two cores get the same inputs (reports, heartbeats, lifecycle events, probe answers, config
changes, holds, gaps between ticks); one visits every deployment at every tick, the other only
the dirty, busy and timer-due ones. Every tick's actions (KV writes, probes, statuses, decision
events with their reasons) must be equal, in the same order, and so must each deployment's
policy state and demand means at the end.
"""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.controller.actions import Event
from services.controller.core import ControllerConfig, ControllerCore
from services.controller.deployment_state import STARTUP_TIMEOUT_S
from services.controller.health_registry import ProbeOutcome
from services.controller.kv_delta import PutDoc
from services.controller.machinery.schedule import Schedule, TickLog
from shared.appconfig import AppConfig, AutoscalingConfig, DeploymentConfig
from shared.kv.targets import ReplicaTarget
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.subjects import KV_TARGETS
from shared.wire import encode
from shared.wire.messages import HandleReport, HealthStatus, Heartbeat, Lifecycle, ReplicaReport

TICK = 0.1
WALL0 = 1_700_000_000.0

AUTO = AutoscalingConfig(
    min_replicas=0,
    max_replicas=4,
    target_ongoing_requests=2,
    upscale_delay_s=0.5,
    downscale_delay_s=1.0,
    downscale_to_zero_delay_s=1.5,
    look_back_period_s=1.0,
    metrics_interval_s=0.5,
)
PANIC = replace(AUTO, min_replicas=1, panic_mode=True, panic_window_s=0.6)
FIXED = AutoscalingConfig(min_replicas=2, max_replicas=2, initial_replicas=2, metrics_interval_s=1)


def _app(name: str, policy: AutoscalingConfig, version: str = "v1") -> AppConfig:
    dep = DeploymentConfig(
        name="D",
        import_path="m:D",
        health_check_period_s=0.5,
        health_check_timeout_s=0.5,
        autoscaling=policy,
    )
    return AppConfig(name, (dep,), version=version)


APPS = {"auto": AUTO, "panic": PANIC, "fixed": FIXED}


class Twin:
    """Two cores fed alike; `tick` compares what they do."""

    def __init__(self) -> None:
        self.all = ControllerCore(visit_all=True)
        self.due = ControllerCore()
        self.t = 100.0
        self.seq = 0
        self.targets: dict[str, dict[str, ReplicaTarget]] = {a: {} for a in APPS}
        self.ticks = 0
        self.set_apps({a: _app(a, p) for a, p in APPS.items()})

    def both(self) -> tuple[ControllerCore, ControllerCore]:
        return self.all, self.due

    def set_apps(self, apps: dict[str, AppConfig]) -> None:
        for c in self.both():
            c.set_apps(apps, self.t)

    def wall(self) -> float:
        return WALL0 + self.t

    def ingest(self, kind: str, app: str, data: bytes) -> None:
        for c in self.both():
            c.ingest(S.report(kind, app, "D"), data, self.t)

    def tick(self, gap: int = 1) -> None:
        self.t = round(self.t + gap * TICK, 6)
        a = self.all.tick(self.t, self.wall())
        b = self.due.tick(self.t, self.wall())
        assert a == b, f"tick {self.ticks} at {self.t}: actions differ"
        self.ticks += 1
        for act in a:
            if isinstance(act, PutDoc) and isinstance(act.doc, ReplicaTarget):
                self.targets[act.doc.app][act.doc.replica_id] = act.doc

    def replica(self, app: str, i: int) -> str | None:
        ids = sorted(self.targets[app])
        return ids[i % len(ids)] if ids else None

    def lifecycle(self, app: str, i: int, state: str) -> None:
        rid = self.replica(app, i)
        if rid is not None:
            ev = Lifecycle(rid, "", state, self.wall(), S.rpc(app, "D", rid), "v1", None, app, "D")
            self.ingest("lifecycle", app, encode(ev))

    def handle(self, app: str, queued: float, running: float, failures: int) -> None:
        self.seq += 1
        ids = sorted(self.targets[app])
        health = tuple(HealthStatus(r, failures == 0, self.wall(), failures) for r in ids)
        r = HandleReport(
            "h1",
            app,
            "D",
            self.wall(),
            self.seq,
            queued,
            dict.fromkeys(ids, running),
            health,
            1,
            {},
        )
        self.ingest("handle", app, encode(r))

    def own_report(self, app: str, i: int, running: float) -> None:
        rid = self.replica(app, i)
        if rid is not None:
            self.seq += 1
            h = HealthStatus(rid, True, self.wall(), 0)
            self.ingest(
                "replica", app, encode(ReplicaReport(rid, self.wall(), self.seq, running, {}, h))
            )

    def heartbeat(self, app: str, i: int, failures: int) -> None:
        rid = self.replica(app, i)
        if rid is not None:
            h = HealthStatus(rid, failures == 0, self.wall(), failures)
            self.ingest("heartbeat", app, encode(Heartbeat(h, self.wall())))

    def probe(self, app: str, i: int, outcome: ProbeOutcome) -> None:
        rid = self.replica(app, i)
        if rid is not None:
            h = (
                HealthStatus(rid, True, self.wall(), 0)
                if outcome is ProbeOutcome.ANSWERED
                else None
            )
            for c in self.both():
                c.on_probe(app, "D", rid, outcome, h, self.t)

    def hold(self, app: str, on: bool) -> None:
        for c in self.both():
            if on:
                c.held.add(app)
            else:
                c.held.discard(app)

    def compare_state(self) -> None:
        for key, m in self.all.deployments.items():
            if key[0] in self.all.held:
                continue  # not sampled while held, either way
            n = self.due.deployments[key]
            n.catch_up(self.due._ticks)
            assert m.policy == n.policy and m.decision == n.decision
            keep = m.window_keep_s()
            assert m.window.mean_and_full(self.t, keep) == n.window.mean_and_full(self.t, keep)


app_names = st.sampled_from(sorted(APPS))
ops = st.one_of(
    st.tuples(st.just("tick"), st.sampled_from([1, 1, 1, 2, 5, 13, 40])),
    st.tuples(st.just("start"), app_names, st.integers(0, 5)),
    st.tuples(st.just("spawn"), app_names, st.integers(0, 5)),  # starting, never ready
    st.tuples(st.just("wait"), st.sampled_from([700, 1250])),  # past a start timeout
    st.tuples(st.just("exit"), app_names, st.integers(0, 5)),
    st.tuples(
        st.just("handle"),
        app_names,
        st.sampled_from([0.0, 0.0, 1.0, 3.0]),
        st.sampled_from([0.0, 1.0, 2.0, 2.5, 4.0]),
        st.sampled_from([0, 0, 0, 3]),
    ),
    st.tuples(st.just("own"), app_names, st.integers(0, 5), st.sampled_from([0.0, 1.0, 3.0])),
    st.tuples(st.just("heartbeat"), app_names, st.integers(0, 5), st.sampled_from([0, 1, 3])),
    st.tuples(st.just("probe"), app_names, st.integers(0, 5), st.sampled_from(list(ProbeOutcome))),
    st.tuples(st.just("hold"), app_names, st.booleans()),
    st.tuples(st.just("version"), app_names, st.sampled_from(["v1", "v2"])),
    st.tuples(st.just("drop"), app_names),
)


def run(program: list[tuple[object, ...]]) -> Twin:
    tw = Twin()
    for op in program:
        kind = op[0]
        if kind == "tick":
            for _ in range(int(op[1])):  # type: ignore[call-overload]
                tw.tick()
        elif kind == "start":
            tw.lifecycle(op[1], op[2], "starting")  # type: ignore[arg-type]
            tw.lifecycle(op[1], op[2], "ready")  # type: ignore[arg-type]
        elif kind == "spawn":
            tw.lifecycle(op[1], op[2], "starting")  # type: ignore[arg-type]
        elif kind == "wait":
            tw.tick(int(op[1]))  # type: ignore[call-overload]
        elif kind == "exit":
            tw.lifecycle(op[1], op[2], "exited")  # type: ignore[arg-type]
        elif kind == "handle":
            tw.handle(*op[1:])  # type: ignore[arg-type]
        elif kind == "own":
            tw.own_report(*op[1:])  # type: ignore[arg-type]
        elif kind == "heartbeat":
            tw.heartbeat(*op[1:])  # type: ignore[arg-type]
        elif kind == "probe":
            tw.probe(*op[1:])  # type: ignore[arg-type]
        elif kind == "hold":
            tw.hold(*op[1:])  # type: ignore[arg-type]
        elif kind == "version":
            apps = {a: _app(a, p, op[2] if a == op[1] else "v1") for a, p in APPS.items()}  # type: ignore[misc]
            tw.set_apps(apps)
        elif kind == "drop":
            tw.set_apps({a: _app(a, p) for a, p in APPS.items() if a != op[1]})
    for _ in range(30):
        tw.tick()
    tw.compare_state()
    return tw


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, max_size=60))
def test_visiting_the_due_decides_what_visiting_all_decides(
    program: list[tuple[object, ...]],
) -> None:
    run(program)


def test_a_steady_fleet_is_mostly_skipped() -> None:
    """The schedule earns its keep: steady fixed-size deployments are not visited at every tick
    (the equivalence test alone would pass with a schedule that visits everyone)."""
    tw = Twin()
    for _ in range(5):
        tw.tick()
    for i in range(2):
        tw.lifecycle("fixed", i, "starting")
        tw.lifecycle("fixed", i, "ready")
    visited = 0
    for step in range(100):
        if step % 10 == 0:
            tw.handle("fixed", 0.0, 1.0 + step % 3, 0)
        before = tw.due.schedule.due(tw.t + TICK) & {("fixed", "D")}
        tw.due.schedule.touch_all(before)  # put back what the peek took
        visited += bool(before)
        tw.tick()
    assert visited <= 30, visited


def test_starting_replicas_are_not_visited_at_every_tick_and_still_time_out() -> None:
    """A deployment whose replicas start is visited on their lifecycle and when a start could
    time out, not at every tick (thousands of apps starting together saturated the loop). Its
    health grace outlasts the start timeout here, so only the start timer can end the wait."""
    slow = replace(_app("slow", FIXED).deployments[0], health_check_timeout_s=300.0)
    apps = {"slow": AppConfig("slow", (slow,), version="v1")}
    cores = ControllerCore(visit_all=True), ControllerCore()
    t = 100.0
    for c in cores:
        c.set_apps(apps, t)
    ids: list[str] = []
    visited = 0
    timeouts: list[float] = []
    for step in range(int((STARTUP_TIMEOUT_S + 10) / TICK)):
        t = round(t + TICK, 6)
        peek = cores[1].schedule.due(t) & {("slow", "D")}
        cores[1].schedule.touch_all(peek)  # put back what the peek took
        visited += bool(peek)
        every, due = (c.tick(t, WALL0 + t) for c in cores)
        assert every == due, f"step {step}: actions differ"
        ids += [a.doc.replica_id for a in due if isinstance(a, PutDoc) and a.bucket == KV_TARGETS]
        timeouts += [t for a in due if isinstance(a, Event) and a.kind == "start_timeout"]
        if step == 1:
            for rid in ids:  # spawned, never ready
                ev = Lifecycle(rid, "", "starting", WALL0 + t, S.rpc("slow", "D", rid), "v1",
                               None, "slow", "D")  # fmt: skip
                for c in cores:
                    c.ingest(S.report("lifecycle", "slow", "D"), encode(ev), t)
    assert len(ids) == 4  # two, then their replacements
    assert visited <= 10, visited
    assert len(timeouts) == 2 and all(abs(x - 100.2 - STARTUP_TIMEOUT_S) < 0.5 for x in timeouts)


def test_schedule_heap_orders_dirty_busy_and_timers() -> None:
    s: Schedule[str] = Schedule()
    s.place("a", 5.0)
    s.place("b", 2.0)
    s.place("c", float("-inf"))
    s.touch("d")
    assert s.due(1.0) == {"c", "d"}
    s.place("d", float("inf"))
    assert s.due(2.0) == {"b", "c"}
    s.place("a", 9.0)  # moved later: the old entry at 5 is stale
    assert s.due(6.0) == {"c"}
    s.replace("a", 3.0)
    assert s.due(6.0) == {"a", "c"} and s.next_due() == float("inf")
    s.place("a", 7.0)
    s.replace("a", 8.0)  # an input moved it later
    s.replace("c", 1.0)  # busy: keeps visiting at every tick
    assert s.due(7.5) == {"c"} and s.due(8.0) == {"a", "c"}


def test_tick_log_keeps_what_a_window_still_sees() -> None:
    log = TickLog(horizon_s=1.0)
    for i in range(50):
        log.add(i * 0.1)
    # the newest tick at or before 4.9 - 0.5 still holds into the window; older ones do not
    assert [round(x, 1) for x in log.since(4.0, keep_s=0.5)] == [4.4, 4.5, 4.6, 4.7, 4.8, 4.9]
    assert [round(x, 1) for x in log.since(4.65, keep_s=0.5)] == [4.7, 4.8, 4.9]
    assert log.since(4.9, keep_s=0.5).size == 0


def test_tick_log_finds_a_gap_between_ticks_and_forgets_it_once_it_left() -> None:
    log = TickLog(horizon_s=1.0)
    t = 0.0
    for _ in range(20):
        t = round(t + 0.1, 6)
        log.add(t)
    assert not log.gap_over(log.since(0.0, 1.0), 0.5)  # ticks every 0.1 s
    t += 0.8  # the loop stalled
    log.add(t)
    for _ in range(3):
        t = round(t + 0.1, 6)
        log.add(t)
    assert log.gap_over(log.since(0.0, 1.0), 0.5)
    assert not log.gap_over(log.since(t - 0.25, 1.0), 0.5)  # the stall is before this slice
    for _ in range(20):  # the stall leaves the log
        t = round(t + 0.1, 6)
        log.add(t)
    assert not log.gap_over(log.since(0.0, 1.0), 0.5)
    assert log._widest < 0.5  # narrowed: no look at the ticks any more


def _status_writes(
    core: ControllerCore, t: float, ticks: int
) -> tuple[float, list[tuple[float, str]]]:
    writes: list[tuple[float, str]] = []
    for _ in range(ticks):
        t = round(t + TICK, 6)
        writes.extend(
            (t, a.key) for a in core.tick(t, WALL0 + t) if type(a).__name__ == "PutStatus"
        )
    return t, writes


def _demand(core: ControllerCore, app: str, t: float, ongoing: float) -> None:
    r = HandleReport("h1", app, "D", WALL0 + t, 1, ongoing, {}, (), 1, {})
    core.ingest(S.report("handle", app, "D"), encode(r), t)


def test_an_unchanged_status_is_never_rewritten_and_a_changed_one_is_at_its_look() -> None:
    """Whether the owner is alive is read from its lease (fleetpulse status), so an unchanged
    status costs no write: at 10,000 apps the rewrites for liveness were 500 KV writes a
    second and a tenth of the member's CPU."""
    core = ControllerCore()
    t = 100.0
    core.set_apps({"fixed": _app("fixed", FIXED)}, t)
    t, writes = _status_writes(core, t, 10)
    assert len(writes) == 1  # the first status, at once
    t, writes = _status_writes(core, t, int(60 / TICK))  # before any start timeout
    assert writes == []  # looked at every 2 s, nothing to say
    _demand(core, "fixed", t, 3.0)
    t, writes = _status_writes(core, t, int(core.cfg.status_refresh_s / TICK) + 1)
    assert len(writes) == 1  # the demand figure changed: rewritten at the app's next look


def test_apps_created_together_are_looked_at_spread_over_the_period() -> None:
    """300 apps created in one tick, then a new demand for each: their statuses are rewritten
    at looks on phases of their own over the look period (10 s here), not in one tick."""
    cfg = ControllerConfig(status_looks_per_s=30.0)
    core = ControllerCore(cfg)
    apps = {f"a{i:04d}": _app(f"a{i:04d}", FIXED) for i in range(300)}
    assert core.statuses.look_s(len(apps)) == 10.0
    assert ControllerCore(replace(cfg, status_looks_per_s=600.0)).statuses.look_s(300) == 2.0
    t = 100.0
    core.set_apps(apps, t)
    t, writes = _status_writes(core, t, 5)
    assert len(writes) == 300
    for app in apps:
        _demand(core, app, t, 3.0)
    t, writes = _status_writes(core, t, int(10 / TICK) + 1)
    # each at its look (a few twice: looked at again after the report expired at 10 s)
    assert {a for _, a in writes} == set(apps) and len(writes) < 330
    per_tick: dict[float, int] = {}
    for w, _ in writes:
        per_tick[w] = per_tick.get(w, 0) + 1
    # 300 looks over 100 ticks: 3 a tick on average; all at once would be 300 in one tick
    assert max(per_tick.values()) <= 12, max(per_tick.values())


def test_a_silent_handle_expires_alike() -> None:
    """The expiry timer (a silent router's demand leaves after max(2 x interval, 10 s)) fires
    on a sleeping fixed-size deployment exactly when visiting all would drop it."""
    tw = Twin()
    tw.tick()
    for app, i in (("fixed", 0), ("fixed", 1), ("panic", 0)):
        tw.lifecycle(app, i, "starting")
        tw.lifecycle(app, i, "ready")
    tw.tick()
    for _ in range(3):
        tw.handle("fixed", 1.0, 2.0, 0)
        tw.handle("panic", 1.0, 0.0, 0)
        for _ in range(20):
            tw.tick()
    for _ in range(150):
        tw.tick()
    tw.compare_state()
    m = tw.due.deployments[("fixed", "D")]
    assert m.metrics.handle_ids() == [] and m.metrics.total_demand() == 0.0


def test_inputs_that_keep_a_deployment_fresh_move_its_timer_later() -> None:
    """Replicas whose health keeps arriving never go stale, and routers that keep reporting
    never expire: the deployment's timer follows them, so it does not fire at the freshness
    bound its last visit saw (once per freshness window for every deployment, in bursts when
    their replicas started together)."""
    tw = Twin()
    for _ in range(5):
        tw.tick()
    for i in range(2):
        tw.lifecycle("fixed", i, "starting")
        tw.lifecycle("fixed", i, "ready")
    for _ in range(20):
        tw.tick()
    looked = 0
    for step in range(600):
        if step % 5 == 0:
            tw.handle("fixed", 0.0, 1.0, 0)  # fresh health for both replicas every 0.5 s
        before = tw.due.schedule.due(tw.t + TICK) & {("fixed", "D")}
        tw.due.schedule.touch_all(before)  # put back what the peek took
        looked += bool(before)
        tw.tick()
    tw.compare_state()
    assert looked <= 2, looked


def test_an_app_put_looks_only_at_the_apps_that_changed() -> None:
    """Each fp_apps put hands the core the whole owned set: the apps equal to what it had are
    not rebuilt or visited again, only the new and the changed one."""
    core = ControllerCore()
    apps = {f"a{i:03d}": _app(f"a{i:03d}", FIXED) for i in range(200)}
    core.set_apps(apps, 100.0)
    core.tick(100.1, WALL0 + 100.1)
    touched: list[tuple[str, str]] = []

    class Spy(Schedule[tuple[str, str]]):
        def touch(self, key: tuple[str, str]) -> None:
            touched.append(key)
            super().touch(key)

    core.schedule = Spy()
    changed = {**apps, "a007": _app("a007", FIXED, version="v2"), "new": _app("new", FIXED)}
    core.set_apps(changed, 100.2)
    assert sorted(touched) == [("a007", "D"), ("new", "D")]
    assert core.deployments[("a007", "D")].state.version == "v2"


def test_one_app_put_at_a_time_does_what_handing_the_whole_set_does() -> None:
    """The service hands the core each fp_apps put alone (`update_app`); the result must be
    what handing over the whole set after it (`set_apps`) does: same actions at every tick."""
    rng = random.Random(7)
    whole, one = ControllerCore(), ControllerCore()
    apps: dict[str, AppConfig] = {}
    t = 100.0
    for step in range(300):
        if step % 3 == 0:
            name = f"a{rng.randrange(12)}"
            roll = rng.random()
            if roll < 0.2 and name in apps:
                del apps[name]
                change: AppConfig | None = None
            else:
                policy = rng.choice([AUTO, FIXED, PANIC])
                deps = ("D",) if roll < 0.7 else ("D", "E")
                change = AppConfig(
                    name,
                    tuple(replace(_app(name, policy).deployments[0], name=d) for d in deps),
                    version=rng.choice(["v1", "v2"]),
                )
                apps[name] = change
            whole.set_apps(dict(apps), t)
            one.update_app(name, change, t)
        t = round(t + TICK, 6)
        assert whole.tick(t, WALL0 + t) == one.tick(t, WALL0 + t), f"step {step}"
    assert whole.apps == one.apps
    assert list(whole.deployments) == list(one.deployments)

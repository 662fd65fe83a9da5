"""The controller core: inputs in, actions out, no I/O and no clock.

How it works: the shell feeds the core what arrives (report payloads with their local receipt
time, probe outcomes, the desired apps from KV) and calls `tick(now, wall)` every control
interval; `tick` returns the actions to carry out (KV writes, probes) and events to log. Every
input carries its time, so a recorded run fed back in the same order makes the same decisions
(the what-if replay and the restart rebuild both rely on it).

`rebuild(...)`-style use: while the shell replays the retained stream after a start or a
takeover, it calls `ingest` with the messages' times and `sample(t)` instead of `tick`, which
fills the demand windows without deciding anything; then live ticks begin.

A tick visits only the deployments that need it (schedule.py): those that got input since their
last visit, those with work moving at every tick, and those whose timer fired; the rest cost
nothing. `ControllerCore(visit_all=True)` visits every deployment at every tick instead, the
reference the schedule is tested against (same actions, same order).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from shared import settings
from shared.appconfig import AppConfig
from shared.errors import UsageError, WireError
from shared.kv import buckets
from shared.kv.agents import AgentInfo
from shared.kv.membership import Member
from shared.kv.status import AppStatusView
from shared.kv.targets import ReplicaTarget
from shared.replicahttp import with_serving_env
from shared.subjects import Subjects
from shared.wire.columnar import ColumnarHandleReport
from shared.wire.messages import HealthStatus

from .actions import Action, CoreStats, DeleteKey, Event, Probe, PutStatus
from .custom_policy import PolicyCall, PolicyRunner
from .deployment_state import StateEvent, app_status
from .health_registry import Int64Array, ProbeOutcome
from .landing import land
from .machinery.layout import DepKey, Layout
from .machinery.schedule import Schedule, TickLog
from .managed import ManagedDeployment, StepResult
from .placement import Placed, Placement
from .policy import PolicyState
from .policy_runner import InlineRunner
from .replica_index import NO_SLOT
from .stall_guard import ProbeLimiter, ProbeLimits, StallGuard, StallState
from .status_book import Figures, StatusBook

__all__ = [
    "Action", "ControllerConfig", "ControllerCore", "CoreStats", "DeleteKey", "Event", "Probe",
    "PutStatus",
]  # fmt: skip

REPROBE_AFTER_S = 1.0


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    namespace: str = settings.NAMESPACE.default
    member_id: str = "controller"
    owner_epoch: int = settings.CONTROLLER_OWNER_EPOCH.default
    control_interval_s: float = settings.CONTROLLER_CONTROL_INTERVAL.default
    status_refresh_s: float = 2.0
    """How often an app's status is looked at for changed figures (demand, counts) that no
    event marked; an unchanged status is not rewritten (status_book.py)..."""
    prepare_timeout_s: float = settings.CONTROLLER_PREPARE_TIMEOUT.default
    """A deployment whose runtime_env an agent still prepares this long is DEPLOY_FAILED."""
    status_looks_per_s: float = 1000.0
    """...unless that is more looks a second than this: then an app is looked at every
    apps / status_looks_per_s seconds (10 s at 10,000 apps: a look is ~50 µs of Python, and
    5,000 a second were a quarter of a core and most of a tick's time there)."""


class ControllerCore:
    def __init__(
        self,
        cfg: ControllerConfig | None = None,
        *,
        visit_all: bool = False,
        policies: PolicyRunner | None = None,
    ) -> None:
        self.cfg = cfg or ControllerConfig()
        self.policies: PolicyRunner = policies or InlineRunner()
        """Runs the custom policies (the service's runs them in a worker process under a
        deadline, policy_host.py; in this process by default, for tests and tools)."""
        self.subjects = Subjects(self.cfg.namespace)
        self.apps: dict[str, AppConfig] = {}
        self.deployments: dict[DepKey, ManagedDeployment] = {}
        self._env_notes: dict[str, dict[DepKey, str]] = {}
        """Agent id -> deployment -> what it says of that deployment's runtime_env."""
        self.deleting: dict[DepKey, ManagedDeployment] = {}
        self.stall = StallGuard()
        self.stall_state: StallState | None = None
        # a replica is a candidate only while stale, and an answer makes it fresh again, so the
        # re-probe gap only needs to cover a probe's own timeout
        self.probes: ProbeLimiter[tuple[str, str, str]] = ProbeLimiter(
            ProbeLimits(reprobe_after_s=REPROBE_AFTER_S)
        )
        self.stats = CoreStats()
        self.statuses = StatusBook(self.cfg.status_refresh_s, self.cfg.status_looks_per_s)
        self._pending_events: list[Action] = []
        self.placement = Placement()
        self.held: set[str] = set()
        """Apps whose history is still being replayed (a partition just taken over)."""
        self.visit_all = visit_all
        self.schedule: Schedule[DepKey] = Schedule()
        self._ticks = TickLog()
        self._min_gap_s = math.inf
        """The shortest gap between samples any deployment's demand window bridges."""
        self._held_seen: set[str] = set()
        self._counted: dict[DepKey, tuple[int, int]] = {}
        """(stale, candidates) of each deployment's last visit, summed for the stall guard."""
        self._stale_total = 0
        self._known_total = 0
        self._layout: Layout | None = None
        """Visit order and deployments by app, rebuilt when deployments come or go."""
        self.tick_now = False
        """An input that a tick should act on at once, not at the next interval (the shell
        reads and clears it, `take_tick_now`): a request queued at a deployment at zero (the
        wake from zero waits for this decision) or a lifecycle message (a replica became
        ready: its member value is what held requests wait for)."""

    # -- inputs ------------------------------------------------------------------------------

    def set_apps(self, apps: Mapping[str, AppConfig], now: float) -> None:
        """The desired applications (KV fp_apps). New ones start, changed ones roll, gone ones
        scale to zero and are deleted once their replicas have stopped. An app equal to the one
        it replaces is not looked at again: at 10,000 apps rebuilding and visiting every
        deployment for one put cost a second of CPU."""
        for name in [n for n in self.apps if n not in apps]:
            del self.apps[name]
        self._change_apps(apps, now, retire=False)
        wanted = {(a.name, d.name) for a in apps.values() for d in a.deployments}
        for key in [k for k in self.deployments if k not in wanted]:
            self._retire(key)  # in the order a visit takes them, as ever
        every = [m for t in (self.deployments, self.deleting) for m in t.values()]
        self._ticks.horizon_s = max((m.window_keep_s() for m in every), default=0.0)
        self._min_gap_s = min((m.window.max_gap_s for m in every), default=math.inf)

    def update_app(self, name: str, app: AppConfig | None, now: float) -> None:
        """One app put (or deleted: None) in fp_apps, at the cost of that app, not of all of
        them (10,000 apps arriving 200 a second, each put handing over the whole set, saturated
        the loop). The tick log's horizon only grows here; `set_apps` sets it exactly."""
        for m in self._change_apps({name: app}, now, retire=True):
            self._ticks.horizon_s = max(self._ticks.horizon_s, m.window_keep_s())
            self._min_gap_s = min(self._min_gap_s, m.window.max_gap_s)

    def _change_apps(
        self, changes: Mapping[str, AppConfig | None], now: float, *, retire: bool
    ) -> list[ManagedDeployment]:
        """Apply apps added, changed or gone (None), retiring the deployments they no longer
        have if `retire`; returns the deployments created or reconfigured."""
        touched: list[ManagedDeployment] = []
        for name, app in changes.items():
            prev = self.apps.pop(name, None)
            deps = app.deployments if app is not None else ()
            if app is not None:
                self.apps[name] = app
            same = prev is app or prev == app
            for d in (with_serving_env(app, x) for x in deps) if app is not None else ():
                key = (name, d.name)
                if same and key in self.deployments:
                    continue
                assert app is not None
                version = app.version_of(d)
                m = self.deployments.get(key) or self.deleting.pop(key, None)
                if m is None:
                    m = ManagedDeployment(
                        name, d, version, now, id_prefix=_id_prefix(*key), subjects=self.subjects
                    )
                    m.state.on_remove = self.placement.release
                    m.state.prepare_timeout_s = self.cfg.prepare_timeout_s
                    m.state.placing = self.placement.ever_seen
                elif m.cfg != d or m.state.version != version:
                    m.reconfigure(d, version, now)
                if key not in self.deployments:
                    self._layout = None
                self.deployments[key] = m
                self.statuses.changed(name)
                self.schedule.touch(key)
                touched.append(m)
            wanted = {d.name for d in deps}
            for d in prev.deployments if prev is not None and retire else ():
                if d.name not in wanted and (name, d.name) in self.deployments:
                    self._retire((name, d.name))
        return touched

    def _retire(self, key: DepKey) -> None:
        """A deployment no longer wanted: to zero, deleted once its replicas have stopped."""
        m = self.deployments.pop(key)
        m.state.target = 0
        self.deleting[key] = m
        self.statuses.changed(key[0])
        self.schedule.touch(key)
        self._layout = None

    def restore(
        self, targets: Iterable[ReplicaTarget], members: Iterable[Member], now: float
    ) -> None:
        """After a restart or takeover: the replicas, slots and epochs the previous owner left
        in fp_targets and fp_membership."""
        by_dep: dict[DepKey, tuple[list[ReplicaTarget], list[Member]]] = {}
        for t in targets:
            by_dep.setdefault((t.app, t.deployment), ([], []))[0].append(t)
        for mem in members:
            by_dep.setdefault((mem.app, mem.deployment), ([], []))[1].append(mem)
        for key, (ts, ms) in sorted(by_dep.items()):
            m = self.deployments.get(key)
            if m is None:
                continue
            m.restore(ts, ms, now)
            for t in ts:
                if t.agent_id and t.replica_id in m.state.replicas:
                    where = Placed(t.agent_id, t.devices)
                    self.placement.restore(t.replica_id, key, t.spec.resources, where)
            m.state.target = max(m.state.target, len(m.state.live()))
            m.policy = PolicyState(target=m.state.target, watch_start=now)
            self.schedule.touch(key)

    def ingest(
        self,
        subject: str,
        data: bytes,
        recv: float,
        decoded: ColumnarHandleReport | WireError | None = None,
    ) -> None:
        """One message from `fp.v1.report.>` received at local monotonic `recv`. `decoded`: a
        columnar part already decoded elsewhere (decode_pipeline.py), or why it is bad."""
        try:
            where = self.subjects.parse_report(subject)
        except UsageError:
            self.stats.dropped["bad_subject"] += 1
            return
        key = (where.app, where.deployment)
        m = self.deployments.get(key) or self.deleting.get(key)
        if m is None:
            self.stats.dropped["unknown_deployment"] += 1
            return
        self.statuses.touched(where.app)
        # what the ticks it was skipped at would have done comes first, then the new input
        self._catch_up(m)
        if where.kind != "lifecycle":
            # lifecycle events only mark the records changed; whatever reads the index,
            # registry or running gate catches up first (free when nothing changed), so a
            # burst of N lifecycle events costs O(N), not N passes over the replicas
            m.follow_records(recv)
        landed = land(m, where, data, recv, decoded, self.subjects, self.stats)
        if landed.foreign:
            self._fold_hosts(m, landed.foreign, recv)
        if landed.events:
            self._pending_events.extend(_events(m, landed.events))
        due = None if where.kind == "lifecycle" else m.input_due(recv)
        if due is None:
            self.schedule.touch(key)
        else:
            self.schedule.replace(key, due)
        if where.kind == "lifecycle" or (
            where.kind == "handle" and m.state.target == 0 and m.metrics.cold_start_signal()
        ):
            self.tick_now = True

    def take_tick_now(self) -> bool:
        """Whether an input since the last call asks for a tick at once (`tick_now`)."""
        now, self.tick_now = self.tick_now, False
        return now

    def _fold_hosts(
        self, m: ManagedDeployment, foreign: tuple[HealthStatus, ...], recv: float
    ) -> None:
        """Rows naming no replica of `m`: a handle-owning host's own health rides on its
        in-process router's reports to any deployment of its app (one owner per app), so look
        the replica up in the app's other deployments (replica ids are global). The rest name
        replicas that left; they are dropped as before."""
        siblings = [d for d in self._app_deployments(m.app) if d is not m]
        for d in siblings:
            self._catch_up(d)
            d.follow_records(recv)
            self.schedule.touch((d.app, d.name))
        for status in foreign:
            for d in siblings:
                if d.index.slot(status.replica_id) != NO_SLOT:
                    d.health.observe(status.replica_id, status, recv, direct=False)
                    self.stats.ingested["host_health"] += 1
                    break

    def on_probe(
        self, app: str, deployment: str, replica_id: str, outcome: ProbeOutcome,
        status: HealthStatus | None, recv: float,
    ) -> None:  # fmt: skip
        self.probes.done((app, deployment, replica_id))
        m = self.deployments.get((app, deployment))
        if m is not None:
            self._catch_up(m)
            self.schedule.touch((app, deployment))
            m.follow_records(recv)
            m.health.probe_result(replica_id, outcome, recv, status)

    def _catch_up(self, m: ManagedDeployment) -> None:
        """The ticks `m` was skipped at, before an input lands (not while its app is held: a
        held app's window gets the replayed samples, no tick's)."""
        self._follow_held()  # released since the last tick: its held ticks do not count
        if m.app not in self.held:
            m.catch_up(self._ticks)

    # -- ticks -------------------------------------------------------------------------------

    def sample(self, now: float, apps: set[str] | None = None) -> None:
        """Rebuild mode: fill demand windows (of `apps`, default all), decide nothing."""
        for (app, _), m in self.deployments.items():
            if apps is None or app in apps:
                m.sample(now)
                self.schedule.touch((app, m.name))

    def release_apps(self, apps: set[str]) -> None:
        """Another member owns these apps now: forget them without deciding or writing."""
        for table in (self.deployments, self.deleting):
            for key in [k for k in table if k[0] in apps]:
                for rid in table[key].state.replicas:
                    self.placement.release(rid)  # its new owner accounts for them
                del table[key]
                self._forget(key)
        self._layout = None
        for app in apps:
            self.apps.pop(app, None)
            self.statuses.forget(app)
            self.held.discard(app)

    def tick(
        self, now: float, wall: float, *, pending: int | None = None, lag_s: float | None = None,
        overrun: bool = False,
    ) -> list[Action]:  # fmt: skip
        actions: list[Action] = list(self._pending_events)
        self._pending_events.clear()
        hold = self.stall_state.hold_verdicts if self.stall_state else False
        self._follow_held()
        lost = self.placement.lost_since_last(now)
        everyone = self.visit_all or hold or bool(lost)
        managed = self._due(now, everyone)
        for agent_id in sorted(lost) if not hold else ():
            for _, m in managed:
                actions.extend(_events(m, m.lose_agent(agent_id, now)))
        results = []
        asked: list[tuple[ManagedDeployment, StepResult, PolicyCall | None]] = []
        for key, m in managed:
            m.catch_up(self._ticks)
            decides = key in self.deployments
            if decides and m.custom_policy:
                res = m.begin_step(now, hold_verdicts=hold)
                asked.append((m, res, m.policy_call(now, res)))
            else:
                res = m.step(now, hold_verdicts=hold, decide_scale=decides)
            results.append((key, m, res))
        if asked:
            self._settle(asked, now)
        if self.placement.ever_seen:
            self._place(managed, now)
        stale_slots: list[tuple[ManagedDeployment, Int64Array]] = []
        for key, m, res in results:
            actions.extend(m.take_stray())
            m.finish(now, res)
            actions.extend(_events(m, res.events))
            if res.decision_changed and m.decision.changed:
                d = m.decision
                direction = "up" if d.target > res.previous_target else "down"
                actions.append(
                    Event(
                        "decision", m.app, m.name, detail=d.reason, rule=d.rule, direction=direction
                    )
                )
            actions.extend(res.kv)
            if res.status_changed or res.kv:
                self.statuses.changed(m.app)
            self._count_health(key, m.counts)
            self.statuses.touched(m.app)
            ev = res.evaluation
            if ev is not None and ev.stale:
                stale_slots.append((m, ev.stale_slots))
            self.schedule.place(key, m.next_visit(now, res, decided=key in self.deployments))
        stale, known = self._stale_total, self._known_total
        self.stats.stale, self.stats.known = stale, known
        self.stall_state = st = self.stall.tick(
            now, pending=pending, lag_s=lag_s, stale=stale, known=known, overrun=overrun
        )
        for e in st.events:
            reasons = ",".join(r.value for r in e.reasons)
            actions.append(Event(f"stall_{e.kind.value}", "", "", detail=reasons))
        limit = self.probes.candidate_limit(now, st.cap_probes)
        probe_candidates = _probe_candidates(stale_slots, limit)
        for app, dep, rid in self.probes.select(probe_candidates, now, st.cap_probes):
            self.stats.probes += 1
            actions.append(Probe(app, dep, rid))
        actions.extend(self._finish_deletes())
        for app in self.statuses.due(now, self._layout_now().by_app, self.held, self._figures):
            actions.append(PutStatus(app, self.app_status(app, wall)))
        self._ticks.add(now)
        return actions

    def _settle(
        self, asked: list[tuple[ManagedDeployment, StepResult, PolicyCall | None]], now: float
    ) -> None:
        """The custom policies of this tick's visits, asked in one batch (one round trip to a
        worker process): each answer decides its deployment, whose visit then finishes. The
        deployments are independent, so finishing these after the others changes nothing."""
        calls = [c for _, _, c in asked if c is not None]
        answers = iter(self.policies.run(calls) if calls else ())
        for m, res, call in asked:
            m.settle(now, res, None if call is None else next(answers))

    # -- which deployments a tick visits -------------------------------------------------------

    def _layout_now(self) -> Layout:
        if self._layout is None:
            self._layout = Layout.of(self.deployments, self.deleting)
        return self._layout

    def _app_deployments(self, app: str) -> list[ManagedDeployment]:
        return [self._get(k) for k in self._layout_now().by_app.get(app, ())]

    def _get(self, key: DepKey) -> ManagedDeployment:
        return self.deployments.get(key) or self.deleting[key]

    def _due(self, now: float, everyone: bool) -> list[tuple[DepKey, ManagedDeployment]]:
        """The deployments this tick visits, in the order a visit of all would take."""
        layout = self._layout_now()
        if everyone:
            self.schedule.due(now)  # consumed: every visit places its deployment again
            keys: list[DepKey] = list(layout.order)
        else:
            rank = layout.rank
            pending = self.schedule.pending() | self._gap_visits(now)
            due = pending | self._timer_visits(self.schedule.fired(now) - pending, now)
            keys = sorted((k for k in due if k in rank), key=rank.__getitem__)
        # rebuilding its window from the stream: no decisions yet (visited when released)
        return [(k, self._get(k)) for k in keys if k[0] not in self.held]

    def _gap_visits(self, now: float) -> set[DepKey]:
        """After a gap between ticks longer than a deployment's demand window bridges (the loop
        stalled), that deployment: a visit at every tick would see the hole at once. Rare, so
        the look at every deployment is only then."""
        last = self._ticks.last
        if last is None or now - last <= self._min_gap_s:
            return set()
        return {
            k
            for t in (self.deployments, self.deleting)
            for k, m in t.items()
            if now - last > m.window.max_gap_s
        }

    def _timer_visits(self, fired: set[DepKey], now: float) -> set[DepKey]:
        """Deployments whose timer fired: those that need their step (the rest were looked at
        and placed again)."""
        out = set()
        for key in fired:
            m = self.deployments.get(key) or self.deleting.get(key)
            if m is None or key[0] in self.held:
                out.add(key)
                continue
            due = m.timer_visit(now, self._ticks)
            if due is None:
                out.add(key)
            else:
                self._count_health(key, m.counts)
                self.schedule.place(key, due)
        return out

    def _follow_held(self) -> None:
        """Apps that became held stop counting for the stall guard; apps released are visited at
        once and skip the ticks they were held at (a visit of all skips them too)."""
        if self.held == self._held_seen:
            return
        started, ended = self.held - self._held_seen, self._held_seen - self.held
        self._held_seen = set(self.held)
        last = self._ticks.last
        for app in started | ended:
            for key in self._layout_now().by_app.get(app, ()):
                if app in started:
                    self._count_health(key, None)
                else:
                    if last is not None:
                        self._get(key).skip_to(last)
                    self.schedule.touch(key)

    def _count_health(self, key: DepKey, counts: tuple[int, int] | None) -> None:
        stale, known = self._counted.pop(key, (0, 0))
        self._stale_total -= stale
        self._known_total -= known
        if counts is not None:
            self._counted[key] = counts
            self._stale_total += counts[0]
            self._known_total += counts[1]

    def _forget(self, key: DepKey) -> None:
        self.schedule.forget(key)
        self._count_health(key, None)

    def _place(self, managed: list[tuple[DepKey, ManagedDeployment]], now: float) -> None:
        """Agents for the visited deployments' waiting replicas; what is assigned is in the
        placement's ledger already, so this looks at the waiting replicas only."""
        waiting = [w for _, m in managed for w in m.waiting_for_agent()]
        if not waiting and not any(m.state.unplaced for _, m in managed):
            return  # the usual tick: nothing to place
        placed, why = self.placement.place(waiting, now)
        for w in waiting:
            spot = placed.get(w.replica_id)
            if spot is not None:
                self._get(w.dep).state.placed(w.replica_id, spot.agent_id, spot.devices, now)
        for key, m in managed:
            m.state.unplaced = why.get(key, "")

    def on_agent(self, info: AgentInfo, recv: float) -> None:
        """An agent announced itself (KV fp_agents put)."""
        first = not self.placement.ever_seen
        self.placement.heard(info, recv)
        self._environments(info.agent_id, info, recv)
        if first:  # placement is on from now: replicas without an agent wait for room
            for table in (self.deployments, self.deleting):
                for m in table.values():
                    m.state.placing = True

    def agent_gone(self, agent_id: str) -> None:
        """An agent removed its entry (clean shutdown)."""
        self.placement.gone(agent_id)
        self._environments(agent_id, None, None)

    def _environments(self, agent_id: str, info: AgentInfo | None, recv: float | None) -> None:
        """The agents' notes on runtime environments (preparing, failed) into the status
        messages of the deployments they name (shared/kv/agents.py EnvNote), and which agents
        prepare which deployment's (its replicas' start clock stops meanwhile)."""
        before = self._env_notes.pop(agent_id, {})
        now: dict[DepKey, str] = {}
        preparing: set[DepKey] = set()
        for n in info.environments if info is not None else ():
            app, _, dep = n.deployment.partition(".")
            what = "runtime_env failed" if n.state == "failed" else "runtime_env"
            now[(app, dep)] = f"{what} on agent {agent_id}: {n.detail}"
            if n.state == "preparing":
                preparing.add((app, dep))
        for key in before.keys() | now.keys():
            m = self.deployments.get(key)
            if m is not None:
                m.state.preparing_on(agent_id, key in preparing, recv)
        if now:
            self._env_notes[agent_id] = now
        if not before and not now:
            return  # the usual announcement: nothing to do
        for key in before.keys() | now.keys():
            m = self.deployments.get(key) or self.deleting.get(key)
            if m is not None:
                texts = [notes[key] for _, notes in sorted(self._env_notes.items()) if key in notes]
                failed = [t for t in texts if t.startswith("runtime_env failed")]
                m.state.environment = (failed or texts or [""])[0]

    def _finish_deletes(self) -> list[Action]:
        out: list[Action] = []
        for key, m in list(self.deleting.items()):
            if not m.state.replicas:
                del self.deleting[key]  # its replicas' keys went with them
                self._forget(key)
                self._layout = None
                if not self._layout_now().by_app.get(key[0]):
                    out.append(DeleteKey(buckets.STATUS.name, key[0]))
                    self.statuses.forget(key[0])
        return out

    def _figures(self, app: str) -> Figures:
        deps = [self._get(k) for k in self._layout_now().by_app[app]]
        return tuple(m.status_figures() for m in deps), tuple(m.status_demand() for m in deps)

    def app_status(self, app: str, wall: float) -> AppStatusView:
        keys = self._layout_now().by_app.get(app, ())
        mine = {k[1]: self.deployments[k] for k in keys if k in self.deployments}
        gone = {k[1]: self.deleting[k] for k in keys if k in self.deleting}
        cfg = self.apps.get(app)
        status = app_status(
            [m.state.status for m in mine.values()], deleting=bool(gone) and not mine
        )
        return AppStatusView(
            app=app,
            status=status,
            route_prefix=cfg.route_prefix if cfg else None,
            ingress=cfg.ingress if cfg else None,
            updated_at=wall,
            owner_epoch=self.cfg.owner_epoch,
            deployments={name: m.status_view() for name, m in {**gone, **mine}.items()},
        )


def _probe_candidates(
    stale: list[tuple[ManagedDeployment, Int64Array]], limit: int
) -> list[tuple[str, str, str]]:
    """Stale replicas as probe keys, deployment by deployment, most overdue first within each;
    only the first `limit` (the limiter never looks further), so a mass staleness of 100,000
    replicas costs a few hundred keys per tick, not 100,000."""
    out: list[tuple[str, str, str]] = []
    for m, slots in stale:
        for slot in slots:
            if len(out) >= limit:
                return out
            rid = m.index.id_at(int(slot))
            if rid is not None:
                out.append((m.app, m.name, rid))
    return out


def _events(m: ManagedDeployment, events: Iterable[StateEvent]) -> list[Action]:
    return [Event(e.kind, m.app, m.name, e.replica_id, e.detail, refused=e.refused) for e in events]


def _id_prefix(app: str, deployment: str) -> str:
    """Replica ids are global (probe subjects, agents): `{app}-{deployment}-{tag}`, where the
    tag, a hash of both full names, keeps ids apart even when long names are cut short."""
    tag = hashlib.sha256(f"{app}.{deployment}".encode()).hexdigest()[:4]
    return f"{app[:24]}-{deployment[:24]}-{tag}"

"""What-if replay: a recording run through the autoscaling policy under another config.

How it works. The recorded reports describe the production fleet, not the simulated one: fed
to the controller core as they are, its replicas would run only when an agent reported them
ready, which no recording of another config can. So the simulation takes the parts of the core
that measure and decide, and simulates the rest. Per deployment:

1. Offered load. A `DeploymentMetrics` (the controller's store) is fed the recorded handle and
   replica reports in recv_time order, with recv_time as its clock. Its running-replica gate is
   the set of replicas present in reports: a replica joins when a report first names it and
   leaves once no report has named it for the source timeout (`source_timeout_s`). Its total
   demand, running + queued, is the load offered to the simulated deployment.
2. Control loop. Every `interval_s` of simulated time from the first report on, that demand is
   sampled into a `DemandWindow` and `policy.decide` runs with the config under test, as a
   controller tick does.
3. Simulated replicas. The deployment starts at the policy's initial target, already running. A
   target increase starts replicas that count as running `startup_delay_s` later; a decrease
   stops the newest first (still-starting ones before running ones).

Determinism: times are offsets from the first report's recv_time (integer microseconds), tick k
happens at `k * interval_s` (never accumulated), deployments run in sorted order and counters
are sorted; the JSON rounds every float to `DIGITS` places and sorts keys. The same recording and
config therefore give byte-identical output. No clock, no I/O (except `plot`, which writes the
PNG it is asked for).
"""

from __future__ import annotations

import bisect
import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from services.controller.demand_window import DemandWindow
from services.controller.metrics_store import DeploymentMetrics
from services.controller.policy import PolicyInputs, decide, initial_state
from services.controller.replica_index import ReplicaIndex
from services.controller.staleness import source_timeout_s
from shared.appconfig import AppConfig, AutoscalingConfig
from shared.errors import UsageError, WireError
from shared.subjects import DEFAULT_NAMESPACE, Subjects, deployment_key
from shared.wire.codec import decode_as
from shared.wire.columnar import decode_handle_report_columnar, detect_format
from shared.wire.messages import HandleReport, ReplicaReport

DIGITS: Final = 6
"""Decimal places of every float in the JSON (microseconds for times)."""
DEFAULT_INTERVAL_S: Final = 0.1
"""The live controller's control interval (ControllerConfig.control_interval_s)."""
DEFAULT_SAMPLE_EVERY_S: Final = 10.0
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_US: Final = 1e6

ReportRow = tuple[int, str, bytes]
"""(recv_time in unix microseconds, subject, payload), in recv_time order."""
F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class WhatIfOptions:
    interval_s: float = DEFAULT_INTERVAL_S
    startup_delay_s: float = 0.0
    sample_every_s: float = DEFAULT_SAMPLE_EVERY_S
    """Spacing of the per-deployment samples written to the JSON (the plot uses every tick)."""
    namespace: str = DEFAULT_NAMESPACE

    def __post_init__(self) -> None:
        for name in ("interval_s", "sample_every_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise UsageError(f"{name} must be a positive number of seconds, not {value!r}")
        if not (math.isfinite(self.startup_delay_s) and self.startup_delay_s >= 0):
            raise UsageError(f"startup_delay_s must be >= 0, not {self.startup_delay_s!r}")


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    """A tick where the target or the deciding rule changed (what a controller would log)."""

    t: float
    deployment: str
    demand: float | None
    """The look-back mean the policy saw (None: no data)."""
    target: int
    desired: int
    running: int
    rule: str
    reason: str


@dataclass(frozen=True, slots=True, eq=False)
class DeploymentRun:
    key: str
    config: AutoscalingConfig
    reports: int
    times: F64
    demand: F64
    """Offered load (running + queued) at each tick."""
    target: I64
    running: I64


@dataclass(frozen=True, slots=True, eq=False)
class WhatIfResult:
    options: WhatIfOptions
    start_us: int
    duration_s: float
    deployments: dict[str, DeploymentRun]
    timeline: tuple[TimelineEntry, ...]
    used: dict[str, int]
    ignored: dict[str, int]


class _DeploymentSim:
    """One deployment: offered load from its reports, policy ticks, simulated replicas."""

    def __init__(self, key: str, cfg: AutoscalingConfig, opts: WhatIfOptions) -> None:
        self.key = key
        self.cfg = cfg
        self.startup_delay_s = opts.startup_delay_s
        self.index = ReplicaIndex()
        self.metrics = DeploymentMetrics(self.index, cfg.metrics_interval_s)
        self.window = DemandWindow.for_policy(cfg)
        self.keep_s = max(cfg.look_back_period_s, cfg.panic_window_s)
        self.policy = initial_state(cfg, 0.0)
        self.gate_timeout_s = source_timeout_s(cfg.metrics_interval_s)
        self.last_seen: dict[str, float] = {}
        self.next_expiry = math.inf
        self.ready_at: list[float] = [0.0] * self.policy.target
        self.last_rule = ""
        self.reports = 0
        self.times: list[float] = []
        self.demand: list[float] = []
        self.targets: list[int] = []
        self.running: list[int] = []

    # -- offered load ------------------------------------------------------------------------

    def ingest(self, kind: str, payload: bytes, t: float, used: Counter[str]) -> None:
        if kind == "handle":
            if detect_format(payload) == "columnar":
                c = decode_handle_report_columnar(payload)
                self._present(c.replica_dictionary.to_pylist(), t)
                used["columnar_" + self.metrics.ingest_columnar(c, t).reason] += 1
            else:
                r = decode_as(payload, HandleReport)
                self._present(list(r.running), t)
                used["object_" + self.metrics.ingest_handle_report(r, t).reason] += 1
        else:
            rr = decode_as(payload, ReplicaReport)
            self._present([rr.replica_id], t)
            used["replica_" + self.metrics.ingest_replica_report(rr, t).reason] += 1
        self.reports += 1

    def _present(self, replica_ids: list[str], t: float) -> None:
        """Replicas named by a report are running from now until they go unnamed for the gate
        timeout; a newcomer joins the gate before its report is merged."""
        seen = self.last_seen
        new = [rid for rid in replica_ids if rid not in seen]
        for rid in replica_ids:
            seen[rid] = t
        if new:
            for rid in new:
                self.index.add(rid)
            self.metrics.set_running(seen)
        self.next_expiry = min(self.next_expiry, t + self.gate_timeout_s)

    def _expire(self, now: float) -> None:
        if now < self.next_expiry:
            return
        cutoff = now - self.gate_timeout_s
        gone = [rid for rid, ts in self.last_seen.items() if ts <= cutoff]
        for rid in gone:
            del self.last_seen[rid]
            self.index.remove(rid)
        if gone:
            self.metrics.set_running(self.last_seen)
        oldest = min(self.last_seen.values(), default=math.inf)
        self.next_expiry = oldest + self.gate_timeout_s

    # -- control loop ------------------------------------------------------------------------

    def tick(self, now: float) -> TimelineEntry | None:
        self._expire(now)
        self.metrics.expire(now)
        demand = self.metrics.total_demand()
        self.window.add(now, demand)
        cfg = self.cfg
        mean, short, full = self.window.policy_demand(cfg, self.policy.target, now)
        inputs = PolicyInputs(
            demand_mean=mean,
            demand_short=short,
            window_full=full,
            cold_start=self.policy.target == 0 and self.metrics.cold_start_signal(),
            running_replicas=self._running(now),
        )
        self.policy, d = decide(cfg, self.policy, inputs, now)
        self._scale_to(d.target, now)
        running = self._running(now)
        self.times.append(now)
        self.demand.append(demand)
        self.targets.append(d.target)
        self.running.append(running)
        self.window.trim(now, self.keep_s)
        entry = None
        if d.changed or d.rule != self.last_rule:
            entry = TimelineEntry(
                now, self.key, mean, d.target, d.desired, running, d.rule, d.reason
            )
        self.last_rule = d.rule
        return entry

    def _scale_to(self, target: int, now: float) -> None:
        while len(self.ready_at) < target:
            self.ready_at.append(now + self.startup_delay_s)
        del self.ready_at[target:]

    def _running(self, now: float) -> int:
        # ready_at is non-decreasing: replicas start in time order and stop newest first
        return bisect.bisect_right(self.ready_at, now)

    def result(self) -> DeploymentRun:
        return DeploymentRun(
            key=self.key,
            config=self.cfg,
            reports=self.reports,
            times=np.asarray(self.times, dtype=np.float64),
            demand=np.asarray(self.demand, dtype=np.float64),
            target=np.asarray(self.targets, dtype=np.int64),
            running=np.asarray(self.running, dtype=np.int64),
        )


def simulate(
    rows: Iterable[ReportRow], apps: Sequence[AppConfig], opts: WhatIfOptions | None = None
) -> WhatIfResult:
    """Run the recording's reports (`rows`, in recv_time order) through the policy of every
    deployment in `apps`. Reports of other deployments, other subjects or bad payloads are
    counted in `ignored`; nothing raises for bad data."""
    opts = opts or WhatIfOptions()
    subjects = Subjects(opts.namespace)
    sims: dict[tuple[str, str], _DeploymentSim] = {}
    for app in apps:
        for d in app.deployments:
            key = deployment_key(app.name, d.name)
            sims[(app.name, d.name)] = _DeploymentSim(key, d.policy, opts)
    order = [sims[k] for k in sorted(sims)]
    used: Counter[str] = Counter()
    ignored: Counter[str] = Counter()
    timeline: list[TimelineEntry] = []
    start_us: int | None = None
    last_us = 0
    k = 0

    def run_ticks_before(t: float) -> None:
        nonlocal k
        while (k + 1) * opts.interval_s < t:
            k += 1
            now = k * opts.interval_s
            for sim in order:
                entry = sim.tick(now)
                if entry is not None:
                    timeline.append(entry)

    for recv_us, subject, payload in rows:
        if start_us is None:
            start_us = last_us = recv_us
        if recv_us < last_us:
            raise UsageError("what-if rows must be in recv_time order")
        last_us = recv_us
        t = (recv_us - start_us) / _US
        run_ticks_before(t)
        try:
            where = subjects.parse_report(subject)
        except UsageError:
            ignored["not_a_report"] += 1
            continue
        sim = sims.get((where.app, where.deployment))
        if sim is None:
            ignored["other_deployment:" + deployment_key(where.app, where.deployment)] += 1
            continue
        if where.kind not in ("handle", "replica"):
            ignored[where.kind] += 1
            continue
        try:
            sim.ingest(where.kind, payload, t, used)
        except WireError as exc:
            ignored["wire_" + exc.reason] += 1
    duration = 0.0 if start_us is None else (last_us - start_us) / _US
    # one last tick at or after the last report, so it is seen
    run_ticks_before(duration + opts.interval_s)
    return WhatIfResult(
        options=opts,
        start_us=start_us or 0,
        duration_s=duration,
        deployments={s.key: s.result() for s in sorted(order, key=lambda s: s.key)},
        timeline=tuple(timeline),
        used=dict(sorted(used.items())),
        ignored=dict(sorted(ignored.items())),
    )


# -- JSON ----------------------------------------------------------------------------------------


def _r(x: float) -> float:
    v = round(float(x), DIGITS)
    return 0.0 if v == 0 else v  # no "-0.0"


def _iso(us: int) -> str:
    return (_EPOCH + timedelta(microseconds=us)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _summary(run: DeploymentRun, interval_s: float) -> dict[str, Any]:
    if run.target.size == 0:
        return {"reports": run.reports, "ticks": 0}
    changes = np.diff(run.target)
    return {
        "reports": run.reports,
        "ticks": int(run.target.size),
        "min_target": int(run.target.min()),
        "max_target": int(run.target.max()),
        "final_target": int(run.target[-1]),
        "mean_target": _r(float(run.target.mean())),
        "replica_seconds": _r(float(run.running.sum()) * interval_s),
        "peak_demand": _r(float(run.demand.max())),
        "mean_demand": _r(float(run.demand.mean())),
        "scale_ups": int(np.count_nonzero(changes > 0)),
        "scale_downs": int(np.count_nonzero(changes < 0)),
    }


def _samples(run: DeploymentRun, opts: WhatIfOptions) -> dict[str, list[Any]]:
    step = max(1, round(opts.sample_every_s / opts.interval_s))
    sel = slice(step - 1, None, step)
    return {
        "t": [_r(x) for x in run.times[sel].tolist()],
        "demand": [_r(x) for x in run.demand[sel].tolist()],
        "target": run.target[sel].tolist(),
        "running": run.running[sel].tolist(),
    }


def timeline_doc(result: WhatIfResult) -> dict[str, Any]:
    """The JSON document of one run (plain data; `timeline_json` serialises it)."""
    opts = result.options
    return {
        "v": 1,
        "kind": "whatif_timeline",
        "options": {k: _r(v) if isinstance(v, float) else v for k, v in asdict(opts).items()},
        "recording": {
            "start": _iso(result.start_us),
            "start_us": result.start_us,
            "duration_s": _r(result.duration_s),
            "used": result.used,
            "ignored": result.ignored,
        },
        "deployments": {
            key: {
                "config": {
                    k: _r(v) if isinstance(v, float) else v for k, v in asdict(run.config).items()
                },
                "summary": _summary(run, opts.interval_s),
                "samples": _samples(run, opts),
            }
            for key, run in result.deployments.items()
        },
        "timeline": [
            {
                "t": _r(e.t),
                "time": _iso(result.start_us + round(e.t * _US)),
                "deployment": e.deployment,
                "demand": None if e.demand is None else _r(e.demand),
                "target": e.target,
                "desired": e.desired,
                "running": e.running,
                "rule": e.rule,
                "reason": e.reason,
            }
            for e in result.timeline
        ],
    }


def _is_leaf(v: object) -> bool:
    items = v.values() if isinstance(v, dict) else v if isinstance(v, list) else None
    return items is not None and not any(isinstance(x, dict | list) for x in items)


def _dump(v: object, depth: int) -> str:
    # Containers of scalars (a timeline entry, a config, a sample series) on one line, the rest
    # one item per line: a change of decisions shows as a readable diff of the committed fixture.
    if not isinstance(v, dict | list) or not v or _is_leaf(v):
        return json.dumps(v, sort_keys=True, allow_nan=False, separators=(", ", ": "))
    pad = " " * (depth + 1)
    if isinstance(v, dict):
        parts = [f"{pad}{json.dumps(str(k))}: {_dump(v[k], depth + 1)}" for k in sorted(v)]
        return "{\n" + ",\n".join(parts) + "\n" + " " * depth + "}"
    parts = [pad + _dump(x, depth + 1) for x in v]
    return "[\n" + ",\n".join(parts) + "\n" + " " * depth + "]"


def dumps(doc: dict[str, Any]) -> bytes:
    """Deterministic JSON: sorted keys, fixed layout, no NaN."""
    return (_dump(doc, 0) + "\n").encode()


def timeline_json(result: WhatIfResult) -> bytes:
    return dumps(timeline_doc(result))


def compare_json(runs: Sequence[tuple[str, WhatIfResult]]) -> bytes:
    return dumps(
        {
            "v": 1,
            "kind": "whatif_compare",
            "runs": [{"label": label, **timeline_doc(r)} for label, r in runs],
        }
    )


# -- plot ----------------------------------------------------------------------------------------


_COLORS: Final = ("tab:blue", "tab:orange", "tab:green", "tab:red")
_LINESTYLES: Final = ("-", "--", "-.", (0, (5, 1, 1, 1)))


def plot(runs: Sequence[tuple[str, WhatIfResult]], path: str | Path, title: str = "") -> None:
    """Demand (left axis) and target/running replicas (right axis) per deployment, one line per
    run: a single run, or several configs compared on the same recording."""
    if not runs:
        raise UsageError("nothing to plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({k for _, r in runs for k in r.deployments})
    if not keys:
        raise UsageError("no deployment to plot")

    def runs_of(key: str) -> list[DeploymentRun]:
        return [r.deployments[key] for _, r in runs if key in r.deployments]

    fig, axes = plt.subplots(len(keys), 1, figsize=(11, 3.4 * len(keys)), squeeze=False)
    for ax, key in zip(axes[:, 0], keys, strict=True):
        base = next(r.deployments[key] for _, r in runs if key in r.deployments)
        minutes = base.times / 60.0
        ax.fill_between(minutes, base.demand, step="post", color="0.85", label="demand")
        ax.step(minutes, base.demand, where="post", color="0.4", linewidth=0.8)
        ax.set_ylabel("demand (requests)")
        ax.set_xlabel("minutes since the first report")
        ax.set_title(f"{title} {key}".strip())
        rx = ax.twinx()
        for i, (label, r) in enumerate(runs):
            run = r.deployments.get(key)
            if run is None:
                continue
            color = _COLORS[i % len(_COLORS)]
            ls = _LINESTYLES[i % len(_LINESTYLES)]
            rx.step(run.times / 60.0, run.target, where="post", color=color, linestyle=ls,
                    label=f"target ({label})")  # fmt: skip
            if r.options.startup_delay_s > 0:
                rx.step(run.times / 60.0, run.running, where="post", color=color,
                        linestyle=":", alpha=0.6, label=f"running ({label})")  # fmt: skip
        # Scale the replica axis so that a replica sits at the demand it is sized for (its
        # target_ongoing_requests): a target line above the demand is headroom, below is overload.
        per = base.config.target_ongoing_requests
        ax.set_ylim(bottom=0)
        peaks = [float(r.target.max()) * 1.05 for r in runs_of(key) if r.target.size]
        rx.set_ylim(0, max(ax.get_ylim()[1] / per, 1.0, *peaks))
        rx.set_ylabel(f"replicas (1 = {per:g} requests)")
        lines = ax.get_legend_handles_labels()
        more = rx.get_legend_handles_labels()
        ax.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left", fontsize="small")
    fig.tight_layout()
    fig.savefig(str(path), dpi=100, metadata={"Software": None})
    plt.close(fig)

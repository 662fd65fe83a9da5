"""A synthetic recording with request stats: what the closed-loop what-if calibrates from.

One router per deployment reports every `interval_s` with cumulative counters (seeded Poisson
arrivals of `rate(t)`: idle, a ramp, a burst, a plateau, idle again) and a service time that
grows with the requests in flight per replica, `BASE_S * (1 + SLOPE * (c - 1))`; replicas
announce start and ready (`STARTUP_S` apart) and their admission limit. Used by the determinism
fixture (generate.py), the unit tests and the speed benchmark (scripts/bench/whatif_model.py).
"""

from __future__ import annotations

import math

import numpy as np

from shared.subjects import DEFAULT_SUBJECTS as S
from shared.wire.codec import encode
from shared.wire.messages import HandleReport, Lifecycle, RequestStats

START = 1_714_550_400.0
BASE_S = 0.2
SLOPE = 0.5
STARTUP_S = 2.0
MAX_ONGOING = 5


def rate(t: float, peak: float) -> float:
    """Arrivals per second at t (a 600 s shape, repeated)."""
    t = t % 600.0
    if t < 60:
        return 0.0
    if t < 240:
        return peak * 0.5 * (t - 60) / 180
    if t < 300:
        return peak
    if t < 420:
        return peak * 0.3
    return 0.0


def messages(
    *,
    app: str = "queue",
    deployments: int = 1,
    replicas: int = 4,
    peak: float = 20.0,
    duration_s: float = 600.0,
    interval_s: float = 1.0,
    seed: int = 11,
) -> list[tuple[float, str, bytes]]:
    """(seconds since START, subject, payload), time-ordered."""
    rng = np.random.default_rng(seed)
    out: list[tuple[float, str, bytes]] = []
    for d in range(deployments):
        dep = f"d{d:03d}"
        ids = [f"{dep}-r{i:03d}" for i in range(replicas)]
        life = S.report("lifecycle", app, dep)
        for i, rid in enumerate(ids):
            t0 = 0.01 + 0.001 * i
            for state, at in (("starting", t0), ("ready", t0 + STARTUP_S)):
                ev = Lifecycle(rid, "agent-1", state, START + at, f"fp.v1.rpc.{app}.{dep}.{rid}",
                               "v1", None, app, dep,
                               MAX_ONGOING if state == "ready" else None)  # fmt: skip
                out.append((at, life, encode(ev)))
        subject = S.report("handle", app, dep)
        arrived = completed = c_sum = c_sq = 0
        service = service_sq = c_service = 0.0
        for seq, t in enumerate(np.arange(interval_s, duration_s, interval_s).tolist()):
            lam = rate(t, peak * (1 + 0.1 * (d % 5)))
            n = int(rng.poisson(lam * interval_s))
            arrived += n
            # in flight per replica by Little's law at the service time it implies; a request
            # is admitted with that many (rounded) on its replica, itself included
            c = max(1.0, lam * BASE_S / replicas)
            for _ in range(3):
                c = max(1.0, lam * BASE_S * (1 + SLOPE * (c - 1)) / replicas)
            k = max(1, round(c))
            s = BASE_S * (1 + SLOPE * (k - 1))
            completed += n
            service += n * s
            service_sq += n * s * s * 1.01  # a little spread around the mean
            c_sum += n * k
            c_sq += n * k * k
            c_service += n * k * s
            busy = lam * s / replicas
            running = {rid: round(busy, 4) for rid in ids}
            stats = RequestStats(arrived, completed, service, service_sq, 0.0, 0, 0, c_sum, c_sq,
                                 c_service)  # fmt: skip
            rep = HandleReport(f"router-{dep}", app, dep, START + t, seq + 1, 0.0, running, (),
                               1, stats=stats)  # fmt: skip
            out.append((t + 0.0005, subject, encode(rep)))
    out.sort(key=lambda m: m[0])
    return out


def config_yaml(app: str = "queue", deployments: int = 1, max_replicas: int = 20) -> str:
    lines = [
        "applications:",
        f"  - name: {app}",
        f"    route_prefix: /{app}",
        "    deployments:",
    ]
    for d in range(deployments):
        lines += [
            f"      - name: d{d:03d}",
            "        import_path: services.examples.model:Model",
            f"        max_ongoing_requests: {MAX_ONGOING}",
            "        autoscaling_config:",
            "          min_replicas: 1",
            f"          max_replicas: {max_replicas}",
            "          target_ongoing_requests: 2",
            "          upscale_delay_s: 5",
            "          downscale_delay_s: 30",
            "          look_back_period_s: 10",
            "          metrics_interval_s: 1",
        ]
    return "\n".join(lines) + "\n"


def duration(msgs: list[tuple[float, str, bytes]]) -> float:
    return math.ceil(msgs[-1][0]) if msgs else 0.0

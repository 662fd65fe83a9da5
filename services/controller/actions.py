"""What a control tick returns (actions for the shell to carry out) and the core's counts.

The shell (service.py) carries out KV writes and probes and logs events; the metrics module
moves `CoreStats` into Prometheus. Plain frozen data, no behaviour.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from shared.kv.status import AppStatusView
from shared.transitions import Refused

from .kv_delta import DeleteDoc, PutDoc


@dataclass(frozen=True, slots=True)
class PutStatus:
    key: str
    value: AppStatusView


@dataclass(frozen=True, slots=True)
class DeleteKey:
    bucket: str
    key: str


@dataclass(frozen=True, slots=True)
class Probe:
    app: str
    deployment: str
    replica_id: str


@dataclass(frozen=True, slots=True)
class Event:
    """Something to log once, with structured fields."""

    kind: str
    app: str
    deployment: str
    replica_id: str = ""
    detail: str = ""
    rule: str = ""
    """Decision events: the policy rule that moved the target (a stable token, unlike detail)."""
    direction: str = ""
    """Decision events: "up" or "down"."""
    refused: Refused | None = None
    """`transition_refused` events: the machine, state and event (counted, logged rate-limited)."""


Action = PutDoc | DeleteDoc | PutStatus | DeleteKey | Probe | Event


@dataclass(slots=True)
class CoreStats:
    """Cumulative counts (the shell moves them into Prometheus), and the last tick's health."""

    ingested: Counter[str] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)
    """Invalid messages, by reason."""
    turned_away: Counter[str] = field(default_factory=Counter)
    """Valid reports that changed nothing: stale, duplicate, unknown_replica."""
    probes: int = 0
    stale: int = 0
    """Last tick: live replicas without a verdict and without fresh health."""
    known: int = 0
    """Last tick: live replicas without a verdict."""

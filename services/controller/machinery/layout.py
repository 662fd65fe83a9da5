"""Where the core's deployments are, for a visit and by app: rebuilt only when deployments
come or go, so a tick never sorts or groups them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

DepKey = tuple[str, str]
"""(app, deployment)."""


@dataclass(frozen=True, slots=True)
class Layout:
    """The deployments' visit order (live ones, then those being deleted, each in insertion
    order, as a visit of all takes them) and their keys by app."""

    order: tuple[DepKey, ...]
    rank: dict[DepKey, int]
    by_app: dict[str, tuple[DepKey, ...]]

    @classmethod
    def of(cls, live: Mapping[DepKey, object], deleting: Mapping[DepKey, object]) -> Layout:
        order = (*live, *(k for k in deleting if k not in live))
        by_app: dict[str, list[DepKey]] = {}
        for k in order:
            by_app.setdefault(k[0], []).append(k)
        return cls(
            order, {k: i for i, k in enumerate(order)}, {a: tuple(ks) for a, ks in by_app.items()}
        )

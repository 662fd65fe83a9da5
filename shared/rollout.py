"""How a deployment rolls onto a new version: `rollout: {max_surge, max_unavailable}`.

fleetpulse's own deployment key (Ray Serve has none); the names and their meaning are those of
Kubernetes' Deployment `strategy.rollingUpdate`, which users know:
- `max_surge`: how many replicas may run above the target while rolling (a count, or a
  percentage of the target rounded up): new replicas start up to this many at once.
- `max_unavailable`: how far the routable replicas (running, healthy) may fall below the
  target while rolling (a count, or a percentage of the target rounded down).
Defaults 1 and 0: one new replica at a time, never below the target. Both 0 would never move
and is refused; when percentages of a small target both round to 0, max_unavailable is 1 (as in
Kubernetes).

`PARAMS` declares each setting once; the config's validation (`RolloutConfig`), the YAML key
checks (shared.appkeys) and the fp_apps document (shared.kv.apps reads the dataclass) derive
from it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from shared.errors import ConfigError

PERCENT_RE = re.compile(r"(\d{1,3})%")
MAX_PERCENT = {"max_surge": 1000, "max_unavailable": 100}


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    default: int | str
    rounding: Literal["up", "down"]
    """How a percentage of the target becomes a count."""
    help: str

    def problem(self, value: Any) -> str | None:
        """What is wrong with `value` for this setting, or None."""
        if isinstance(value, int) and not isinstance(value, bool):
            return None if value >= 0 else f"must be >= 0, got {value}"
        if isinstance(value, str):
            m = PERCENT_RE.fullmatch(value)
            if m and int(m.group(1)) <= MAX_PERCENT[self.name]:
                return None
            return f"a percentage must look like '25%' (0-{MAX_PERCENT[self.name]}%), got {value!r}"
        shown = "null" if value is None else repr(value)
        return f"must be a count (like 2) or a percentage of the target (like '25%'), got {shown}"

    def resolve(self, value: int | str, target: int) -> int:
        """`value` as a number of replicas for `target`."""
        if isinstance(value, int):
            return value
        share = target * int(value.removesuffix("%"))
        return -(-share // 100) if self.rounding == "up" else share // 100


PARAMS: tuple[Param, ...] = (
    Param(
        "max_surge",
        1,
        "up",
        "replicas above the target while rolling: new ones start up to this many at once "
        "(a count, or a percentage of the target rounded up)",
    ),
    Param(
        "max_unavailable",
        0,
        "down",
        "how far routable replicas may fall below the target while rolling "
        "(a count, or a percentage of the target rounded down)",
    ),
)
BY_NAME: Mapping[str, Param] = {p.name: p for p in PARAMS}
_DEFAULT: Mapping[str, int | str] = {p.name: p.default for p in PARAMS}


def _is_zero(value: int | str) -> bool:
    return (value if isinstance(value, int) else int(value.removesuffix("%"))) == 0


@dataclass(frozen=True, slots=True)
class RolloutConfig:
    """A deployment's rolling-update settings (see PARAMS and the module header)."""

    max_surge: int | str = _DEFAULT["max_surge"]
    max_unavailable: int | str = _DEFAULT["max_unavailable"]

    def __post_init__(self) -> None:
        for p in PARAMS:
            problem = p.problem(getattr(self, p.name))
            if problem is not None:
                raise ConfigError(problem, field=p.name)
        if _is_zero(self.max_surge) and _is_zero(self.max_unavailable):
            raise ConfigError(
                "max_surge and max_unavailable cannot both be 0 (a rollout could not start "
                "a new replica nor stop an old one); raise one of them",
                field="max_surge",
            )

    def budget(self, target: int) -> tuple[int, int]:
        """(surge, unavailable) in replicas for `target`: unavailable at most the target, and
        at least one of them above 0 whenever the target is."""
        surge = BY_NAME["max_surge"].resolve(self.max_surge, target)
        unavailable = min(target, BY_NAME["max_unavailable"].resolve(self.max_unavailable, target))
        if surge == 0 and unavailable == 0 and target > 0:
            unavailable = 1
        return surge, unavailable


DEFAULT = RolloutConfig()

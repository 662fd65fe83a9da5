"""Reductions over the few rows one report brings (a router's report names a handful of
replicas). numpy's own `.all()`, `.any()`, `.min()` and `.max()` pass through Python wrappers that
cost about a microsecond each, more than the work on four rows; with a dozen of them per report
at thousands of reports a second they were a sixth of ingest. `count_nonzero` is C all the way,
and for a few rows a list's min and max are faster than numpy's; many rows still go to numpy."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

FEW = 64
"""Up to this many rows Python's min/max over `tolist()` beat numpy's reductions."""


def all_set(mask: npt.NDArray[np.bool_]) -> bool:
    return int(np.count_nonzero(mask)) == mask.size


def any_set(mask: npt.NDArray[np.bool_]) -> bool:
    return int(np.count_nonzero(mask)) > 0


def lowest(a: npt.NDArray[Any]) -> Any:
    """The smallest element of a non-empty array, as a Python number."""
    return min(a.tolist()) if a.size <= FEW else a.min().item()


def highest(a: npt.NDArray[Any]) -> Any:
    """The largest element of a non-empty array, as a Python number."""
    return max(a.tolist()) if a.size <= FEW else a.max().item()

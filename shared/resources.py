"""Resource requests (Ray Serve's `ray_actor_options`) and what agents offer, in one vocabulary.

A deployment asks for amounts per replica; an agent offers amounts (fp_agents `resources`);
placement (services/controller/capacity.py) fits the one into the other. Names:

    ray_actor_options.num_cpus  -> "cpus"     agents offer the machine's CPUs unless told
    ray_actor_options.num_gpus  -> "gpus"     agents offer none unless told (`--resource gpus=2`)
    ray_actor_options.memory    -> "memory"   bytes; agents offer the machine's memory unless told
    ray_actor_options.resources -> their own names (`--resource NAME=AMOUNT` on the agent)

Amounts are kept in integer units of 1/10,000 (Ray's resource granularity) so that sums of
fractions are exact: ten replicas of 0.1 GPU fill one device, not 0.9999999999999999 of it.

GPUs are devices: an agent offering `gpus=N` has devices 0..N-1, each of capacity 1. A request
of 1 or more must be whole (Ray's rule) and takes that many devices to itself; a fraction below
1 shares one device with other fractions (see `fit_devices`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

from shared.errors import ConfigError, UsageError
from shared.subjects import validate_name

CPUS: Final = "cpus"
GPUS: Final = "gpus"
MEMORY: Final = "memory"
BUILTIN: Final = (CPUS, GPUS, MEMORY)
UNIT: Final = 10_000
"""Units per whole amount (1 CPU = 10,000 units; memory: 10,000 units per byte)."""
MAX_NAMES: Final = 64
"""Custom resource names per request (the agent document has the same bound)."""
MAX_AMOUNT: Final = 2.0**53 / UNIT
"""Larger amounts would lose units in a float (no machine has 900 TB of memory per replica)."""
GPU_ENV: Final = "CUDA_VISIBLE_DEVICES"

# Ray's spellings that mean a built-in resource: a custom `resources: {GPU: 1}` is a mistake.
_RAY_BUILTIN = {"CPU": "num_cpus", "GPU": "num_gpus", "memory": "memory", CPUS: "num_cpus",
                GPUS: "num_gpus"}  # fmt: skip


def to_units(amount: float) -> int:
    return round(amount * UNIT)


def from_units(units: int) -> float:
    return units / UNIT


def amount_problem(value: Any, *, gpus: bool = False) -> str | None:
    """What is wrong with one requested or offered amount, or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "must be a number"
    if not math.isfinite(value) or value < 0:
        return "must be a finite number >= 0"
    if value > MAX_AMOUNT:
        return f"must be at most {MAX_AMOUNT:g}"
    if 0 < value < 1 / UNIT:
        return f"must be 0 or at least {1 / UNIT:g} (the finest amount placement counts)"
    if gpus and value > 1 and value != int(value):
        return "a GPU request above 1 must be a whole number of devices (fractions only below 1)"
    return None


def request_problem(value: Any) -> str | None:
    """What is wrong with a replica's resource request (name -> amount), or None. Used by
    ReplicaSpec's `resources` parameter, so every reader applies the same rules."""
    if not isinstance(value, Mapping):
        return "must be a map of resource names to amounts"
    if len(value) > MAX_NAMES + len(BUILTIN):
        return f"names more than {MAX_NAMES} custom resources"
    for name, amount in value.items():
        if not isinstance(name, str):
            return f"resource name {name!r} is not a string"
        try:
            validate_name(name, "resource name")
        except UsageError as exc:
            return str(exc)
        problem = amount_problem(amount, gpus=name == GPUS)
        if problem is not None:
            return f"{name} {problem}"
    return None


def build_request(
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    memory: float | None = None,
    custom: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Ray's `ray_actor_options` as a request: canonical names, zero amounts left out, sorted
    (so equal requests are equal maps and hash alike). Raises ConfigError naming the key."""
    out: dict[str, float] = {}
    for key, name, value in (
        ("num_cpus", CPUS, num_cpus),
        ("num_gpus", GPUS, num_gpus),
        ("memory", MEMORY, memory),
    ):
        if value is None:
            continue
        problem = amount_problem(value, gpus=name == GPUS)
        if problem is not None:
            raise ConfigError(problem, field=key)
        if value:
            out[name] = float(value)
    for name, value in (custom or {}).items():
        where = f"resources.{name}"
        if name in _RAY_BUILTIN:
            raise ConfigError(
                f"{name!r} is a built-in resource; set ray_actor_options.{_RAY_BUILTIN[name]}",
                field=where,
            )
        try:
            validate_name(name, "resource name")
        except UsageError as exc:
            raise ConfigError(
                f"{exc} (agents offer it as --resource NAME=AMOUNT)", field=where
            ) from None
        problem = amount_problem(value)
        if problem is not None:
            raise ConfigError(problem, field=where)
        if value:
            out[name] = float(value)
    if len(out) > MAX_NAMES + len(BUILTIN):
        raise ConfigError(f"at most {MAX_NAMES} custom resources", field="resources")
    return dict(sorted(out.items()))


def describe(request: Mapping[str, float]) -> str:
    """`gpus 0.25, cpus 1` (for messages); `nothing` for an empty request."""
    return ", ".join(f"{name} {_amount(name, v)}" for name, v in request.items()) or "nothing"


def _amount(name: str, value: float) -> str:
    if name == MEMORY and value >= 2**20:
        return f"{value / 2**30:.3g} GiB"
    return f"{value:g}"


def show_amount(name: str, value: float) -> str:
    return _amount(name, value)


def device_count(gpus: float) -> int:
    """Devices an agent offering `gpus` has (whole devices; a fraction offers nothing more)."""
    return math.floor(gpus + 1e-9)


def fit_devices(free: Sequence[int], units: int) -> tuple[int, ...] | None:
    """Which devices (indices) a GPU request of `units` takes, given each device's free units,
    or None if it does not fit. The rule:

    - a request of one or more devices takes that many devices that are wholly free, the
      lowest indices first: no other replica shares them;
    - a fraction takes the device with the least room that still fits it (best fit), lowest
      index on a tie: fractions fill one device before they start on the next, so whole
      devices stay free for whole requests.
    """
    if units <= 0:
        return ()
    if units >= UNIT:
        whole = [i for i, f in enumerate(free) if f >= UNIT]
        need = units // UNIT
        return tuple(whole[:need]) if len(whole) >= need else None
    fits = [(f, i) for i, f in enumerate(free) if f >= units]
    return (min(fits)[1],) if fits else None


def visible_devices(devices: Sequence[int], own: str | None) -> str:
    """`CUDA_VISIBLE_DEVICES` for a replica given `devices` (indices into the agent's GPUs). An
    agent started with its own `CUDA_VISIBLE_DEVICES` (`own`, e.g. "2,3") offers those: index i
    is its i-th entry. Otherwise index i is device i."""
    listed = [d.strip() for d in own.split(",") if d.strip()] if own else []
    names = [listed[i] if i < len(listed) else str(i) for i in devices]
    return ",".join(names)


RAY_ACTOR_REFUSED: Final[Mapping[str, str]] = {
    "accelerator_type": (
        "not supported: ask for a custom resource instead (resources: {A100: 1}) and start "
        "the agents of those machines with --resource A100=N"
    ),
    "object_store_memory": "fleetpulse has no object store; remove the key",
    "runtime_env": (
        "not supported per deployment: replicas run in their agent's --workdir with its "
        "Python; remove the key"
    ),
    "scheduling_strategy": (
        "not supported: placement spreads replicas over the agents that have room "
        "(max_replicas_per_node limits them per agent); remove the key"
    ),
    "label_selector": "not supported: use a custom resource that only some agents offer",
    "max_concurrency": "use the deployment's max_ongoing_requests",
    "max_restarts": "the controller replaces failed replicas itself; remove the key",
    "max_task_retries": "the router retries what no replica admitted; remove the key",
    "name": "replicas are named by the controller; remove the key",
    "namespace": "remove the key (the subject namespace is the services' --namespace)",
    "lifetime": "remove the key (replicas live as long as the controller wants them)",
}
"""`ray_actor_options` keys refused by name, with what to do instead."""

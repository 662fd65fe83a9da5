"""Model multiplexing across real replica processes on a real nats-server: the router learns
from admissions which replica holds which model and keeps each model's requests there; a killed
holder's models load again on a survivor."""

from __future__ import annotations

import json
import signal
from collections.abc import AsyncIterator
from typing import Any

import pytest

from services.router.handle import DeploymentHandle, connect_handle
from services.router.testing import Seat, put_membership
from shared.bus import Bus
from shared.natsbus import NatsBus
from shared.subjects import DEFAULT_SUBJECTS as S
from tests.procs import replica_args, service_processes, wait_for_replica
from tests.waiting import eventually

pytestmark = pytest.mark.integration

APP, DEP = "app", "dep"
LOCATED = "tests.unit.serve_apps.multiplex_apps:Located"


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    b = await NatsBus.connect(nats_url, name="test")
    yield b
    await b.close()


async def where(handle: DeploymentHandle, model: str) -> dict[str, Any]:
    result: dict[str, Any] = await handle.options(method="where", model_id=model).remote()
    return result


async def test_each_model_stays_where_it_loaded_and_moves_when_its_holder_dies(
    nats_url: str, bus: Bus
) -> None:
    ids = ["mx-a", "mx-b", "mx-c"]
    extra = ["--health-check-period-s", "0.2", "--max-ongoing-requests", "4",
             "--init-kwargs", json.dumps({"load_s": 0.05})]  # fmt: skip
    with service_processes() as procs:
        started = {
            r: procs.start(replica_args(nats_url, r, import_path=LOCATED, extra=extra)) for r in ids
        }
        for r in ids:
            await wait_for_replica(bus, r)
        await put_membership(bus, APP, DEP, 1, [Seat(r, S.rpc(APP, DEP, r), 4) for r in ids])
        handle = await connect_handle(APP, DEP, bus=bus)
        try:
            models = ["m1", "m2", "m3", "m4"]
            for x in range(5):
                for m in models:
                    assert await handle.options(model_id=m).remote(x) == {"model": m, "x": x}
            # every model loaded once in all: later requests went where it was
            homes = {m: await where(handle, m) for m in models}
            per_replica = {home["replica"]: home["loaded"] for home in homes.values()}
            loaded = [m for held in per_replica.values() for m in held]
            assert sorted(loaded) == sorted(models), homes
            for m, home in homes.items():
                assert m in home["loaded"]
            # the holder of m1 dies; once it leaves the membership, m1 loads on a survivor
            dead = homes["m1"]["replica"]
            started[dead].send_signal(signal.SIGKILL)
            started[dead].wait(10)
            alive = [r for r in ids if r != dead]
            await put_membership(bus, APP, DEP, 2, [Seat(r, S.rpc(APP, DEP, r), 4) for r in alive])
            await _until_members(handle, set(alive))
            assert await handle.options(model_id="m1").remote(9) == {"model": "m1", "x": 9}
            moved = await where(handle, "m1")
            assert moved["replica"] in alive and "m1" in moved["loaded"]
        finally:
            await handle.close()


async def _until_members(handle: DeploymentHandle, members: set[str]) -> None:
    await eventually(lambda: set(handle.router.members) == members, 10, "the new membership")

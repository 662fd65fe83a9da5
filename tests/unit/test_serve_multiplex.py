"""Model multiplexing (fleetpulse/serve/multiplex.py): the per-replica LRU, the request's model
id, and the whole path on the in-memory bus: handle -> router (model-aware) -> replica -> user
code, with the replica's held models riding on its admissions."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fleetpulse import serve
from fleetpulse.serve.multiplex import (
    MULTIPLEXED_MODEL_ID_HEADER,
    ModelCache,
    held_models,
    model_caches,
    model_id_from_headers,
    reset_request_model_id,
    set_request_model_id,
)
from services.replica.config import ReplicaConfig
from services.replica.runtime import ReplicaRuntime
from services.replica.usercode import UserDeployment
from services.router.errors import RequestFailed
from services.router.handle import DeploymentHandle
from services.router.testing import Seat, put_membership
from shared.fakebus import FakeServer
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.wire import decode_as, encode
from shared.wire.messages import Admission, CallArgs, Request
from tests.unit.serve_apps import multiplex_apps

APP = "mx"


class Loader:
    """A loader that counts and can be held open or made to fail."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.gate: asyncio.Event | None = None
        self.fail: set[str] = set()

    async def __call__(self, model_id: str) -> dict[str, str]:
        self.calls.append(model_id)
        if self.gate is not None:
            await self.gate.wait()
        if model_id in self.fail:
            raise OSError(f"no such model {model_id}")
        return {"id": model_id}


async def test_the_lru_keeps_the_bound_and_evicts_the_least_recently_used() -> None:
    load = Loader()
    cache = ModelCache(load, 2)
    assert (await cache.get("a"))["id"] == "a"
    await cache.get("b")
    await cache.get("a")  # a is now the most recently used
    await cache.get("c")  # evicts b
    assert list(cache.models) == ["a", "c"] and cache.evictions == 1
    assert cache.held() == ["c", "a"]  # newest first
    await cache.get("b")  # loads again, evicting a
    assert load.calls == ["a", "b", "c", "b"] and list(cache.models) == ["c", "b"]
    assert cache.hits == 1 and cache.loads == 4
    unbounded = ModelCache(Loader(), -1)
    for i in range(20):
        await unbounded.get(f"m{i}")
    assert len(unbounded.models) == 20 and unbounded.evictions == 0


async def test_concurrent_requests_for_one_model_load_it_once_and_a_quitter_does_not_stop_it() -> (
    None
):
    load = Loader()
    load.gate = asyncio.Event()
    cache = ModelCache(load, 2)
    waiters = [asyncio.create_task(cache.get("m")) for _ in range(10)]
    await asyncio.sleep(0.01)
    assert cache.held() == ["m"]  # loading counts as held: routers send its requests here
    waiters[0].cancel()  # one caller gives up; the others still get the model
    load.gate.set()
    results = await asyncio.gather(*waiters[1:])
    assert load.calls == ["m"] and all(r is results[0] for r in results)
    assert waiters[0].cancelled() and list(cache.models) == ["m"]


async def test_a_failed_load_caches_nothing_and_the_next_request_tries_again() -> None:
    load = Loader()
    load.fail = {"bad"}
    cache = ModelCache(load, 2)
    results = await asyncio.gather(cache.get("bad"), cache.get("bad"), return_exceptions=True)
    assert all(isinstance(r, OSError) for r in results) and load.calls == ["bad"]
    assert cache.held() == [] and not cache.models
    load.fail = set()
    assert (await cache.get("bad"))["id"] == "bad"
    assert load.calls == ["bad", "bad"]


async def test_an_evicted_models_del_runs_sync_or_async_and_its_failure_is_contained() -> None:
    released: list[str] = []

    class Sync:
        def __init__(self, name: str) -> None:
            self.name = name

        def __del__(self) -> None:
            released.append(self.name)

    class Async:
        async def __del__(self) -> None:  # Ray awaits an async __del__
            released.append("async")

    class Broken:
        def __del__(self) -> None:
            raise RuntimeError("cleanup failed")

    models: dict[str, Any] = {"s": Sync("s"), "a": Async(), "x": Broken(), "z": object()}

    async def load(model_id: str) -> Any:
        return models[model_id]

    cache = ModelCache(load, 1)
    for name in ("s", "a", "x", "z"):
        await cache.get(name)
    assert released[:2] == ["s", "async"] and cache.evictions == 3
    # the garbage collector calls __del__ again later (as under Ray): quiet for the test run
    Async.__del__ = Broken.__del__ = lambda self: None  # type: ignore[method-assign,assignment]
    await cache.clear()
    assert not cache.models


async def test_the_decorator_checks_what_ray_checks() -> None:
    with pytest.raises(TypeError, match="async"):

        @serve.multiplexed  # type: ignore[type-var]
        def sync_loader(model_id: str) -> None: ...

    with pytest.raises(TypeError, match="model_id"):

        @serve.multiplexed
        async def too_many(a: str, b: str, c: str) -> None: ...

    with pytest.raises(ValueError, match="positive"):
        serve.multiplexed(max_num_models_per_replica=0)
    with pytest.raises(TypeError, match="int"):
        serve.multiplexed(max_num_models_per_replica="3")  # type: ignore[call-overload]

    calls: list[str] = []

    @serve.multiplexed(max_num_models_per_replica=1)
    async def plain(model_id: str) -> str:
        calls.append(model_id)
        return model_id.upper()

    assert await plain("a") == "A" and await plain("a") == "A" and calls == ["a"]
    assert "a" in (held_models() or ())  # a plain function's cache is process-wide
    with pytest.raises(ValueError, match="empty"):
        await plain("")
    with pytest.raises(TypeError, match="str"):
        await plain(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="model id only"):
        await plain("a", "b")  # type: ignore[call-arg]


async def test_each_instance_has_its_own_cache() -> None:
    one = multiplex_apps.Models.func_or_class()
    two = multiplex_apps.Models.func_or_class()
    assert held_models(one) in (None, ()) or not set(held_models(one) or ()) - {"a"}
    await one.get_model("m1")
    await two.get_model("m2")
    assert "m1" in (held_models(one) or ()) and "m1" not in (held_models(two) or ())
    assert list(model_caches(one)) == ["Models.get_model"]


def test_the_request_model_id_and_the_header() -> None:
    assert serve.get_multiplexed_model_id() == ""
    token = set_request_model_id("m7")
    assert serve.get_multiplexed_model_id() == "m7"
    reset_request_model_id(token)
    assert serve.get_multiplexed_model_id() == ""
    assert MULTIPLEXED_MODEL_ID_HEADER == "serve_multiplexed_model_id"
    assert model_id_from_headers([(b"serve_multiplexed_model_id", b"m1")]) == "m1"
    assert model_id_from_headers([(b"Serve-Multiplexed-Model-Id", b"m2")]) == "m2"
    assert model_id_from_headers([("SERVE_MULTIPLEXED_MODEL_ID", "m3")]) == "m3"
    assert model_id_from_headers([(b"x-other", b"m")]) is None
    assert model_id_from_headers([(b"serve_multiplexed_model_id", b"")]) is None


# -- the whole path on the in-memory bus --------------------------------------------------------


async def _drained(rt: ReplicaRuntime) -> bool:
    for _ in range(500):
        if not rt._wanted:
            return True
        await asyncio.sleep(0.01)
    return False


async def replica(bus: Any, rid: str, load_s: float = 0.0) -> ReplicaRuntime:
    cfg = ReplicaConfig.of(
        app=APP, deployment="Models", import_path=f"{multiplex_apps.__name__}:Models",
        replica_id=rid, health_check_period_s=0.5, health_check_timeout_s=1.0,
        max_ongoing_requests=4,
    )  # fmt: skip
    user = await UserDeployment.create(cfg.spec.import_path, (), {"load_s": load_s})
    rt = ReplicaRuntime(cfg, bus, user)
    await rt.start()
    return rt


async def test_requests_for_a_model_go_where_it_is_loaded() -> None:
    server = FakeServer()
    rbus, cbus = server.connect(), server.connect()
    replicas = [await replica(rbus, f"r{i}") for i in range(3)]
    try:
        seats = [
            Seat(r.cfg.replica_id, S.rpc(APP, "Models", r.cfg.replica_id), 4) for r in replicas
        ]
        await put_membership(cbus, APP, "Models", 1, seats)
        async with DeploymentHandle(APP, "Models", bus=cbus) as handle:
            await handle.router.wait_ready(5)
            for round_ in range(4):
                for m in ("m1", "m2", "m3"):
                    got = await handle.options(model_id=m).remote(round_)
                    assert got == {"model": m, "x": round_}  # user code saw the request's model
            assert await handle.options(method="which", model_id="m2").remote() == "m2"
            assert await handle.options(method="which").remote() == ""  # no model named
            # each model loaded once, on one replica: later requests found it there
            loads = [m for r in replicas for m in r.user.instance.loaded]
            assert sorted(loads) == ["m1", "m2", "m3"]
            # the router learnt what each replica holds from its admissions
            holders = {m: handle.router.chooser.holders(m) for m in ("m1", "m2", "m3")}
            for m, ids in holders.items():
                (rid,) = ids
                rt = next(r for r in replicas if r.cfg.replica_id == rid)
                assert m in rt.user.instance.loaded
            # the replica says what it holds on every admission (newest first)
            rt = replicas[0]
            stream = await cbus.request_stream(
                rt.rpc_subject,
                encode(Request("q", "which", False, False, None, encode(CallArgs((), {})),
                               "args", "m9")),
            )  # fmt: skip
            admission = decode_as((await stream.next(2.0)).data, Admission)
            await stream.close()
            # the request's own model first: it loads there now, before any load began
            assert admission.models == ("m9", *(held_models(rt.user.instance) or ()))
            assert set(rt.user.instance.loaded) <= set(admission.models)
            assert not rt._wanted or await _drained(rt)  # in-flight models are let go
            # a request naming no model reaches a loader that needs one: a clear error
            with pytest.raises(RequestFailed, match="model id is empty"):
                await handle.remote("x")
    finally:
        for r in replicas:
            await r.stop()
        await rbus.close()
        await cbus.close()


async def test_the_http_header_names_the_model_on_the_replicas_asgi_path() -> None:
    import httpx

    from services.replica.asgi import build_asgi_app

    user = await UserDeployment.create(f"{multiplex_apps.__name__}:HttpModels", (), {})
    app = build_asgi_app(user, route_prefix="/m")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        for header in ("serve_multiplexed_model_id", "Serve-Multiplexed-Model-Id"):
            r = await client.post("/m", json=[1, 2], headers={header: "m3"})
            assert r.status_code == 200 and r.json() == {"model": "m3", "x": [1, 2]}
        r = await client.post("/m", json=1)  # no header: the loader refuses an empty id
        assert r.status_code == 500
    assert (held_models(user.instance) or ())[0] == "m3"
    assert serve.get_multiplexed_model_id() == ""  # nothing leaks into the caller's context


async def test_the_http_front_ends_route_by_the_header() -> None:
    from services.router.http import send_http
    from shared.wire.messages import HttpRequest

    server = FakeServer()
    bus = server.connect()
    fakes = []
    try:
        from services.router.testing import FakeReplica

        for i in range(3):
            fakes.append(await FakeReplica(bus, APP, "Models", f"f{i}").start())
        await put_membership(bus, APP, "Models", 1, [f.member for f in fakes])
        async with DeploymentHandle(APP, "Models", bus=bus) as handle:
            await handle.router.wait_ready(5)
            req = HttpRequest("POST", "/", "", (("serve-multiplexed-model-id", "m5"),), b"")
            reader = await send_http(
                handle.router, req, method="__call__", deadline_s=5, stream=False
            )
            await reader.close()
            sent = [r for f in fakes for r in f.requests]
            assert [r.multiplexed_model_id for r in sent] == ["m5"]
            assert handle.router.chooser.holders("m5") == {reader.replica_id}
    finally:
        for f in fakes:
            await f.stop()
        await bus.close()


async def test_a_batch_holds_one_models_calls_and_sees_that_model() -> None:
    seen: list[tuple[str, list[int]]] = []

    class Batched:
        @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.05)
        async def predict(self, items: list[int]) -> list[str]:
            model = serve.get_multiplexed_model_id()
            seen.append((model, items))
            return [f"{model}:{i}" for i in items]

    owner = Batched()

    async def call(model: str, i: int) -> str:
        set_request_model_id(model)  # as the replica does, in the request's own task
        result: str = await owner.predict(i)
        return result

    calls = [call("a" if i % 2 else "b", i) for i in range(8)]
    results = await asyncio.gather(*(asyncio.create_task(c) for c in calls))
    assert results == [f"{'a' if i % 2 else 'b'}:{i}" for i in range(8)]
    assert sorted(seen) == [("a", [1, 3, 5, 7]), ("b", [0, 2, 4, 6])]  # never mixed

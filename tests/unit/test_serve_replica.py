"""The replica side of fleetpulse.serve: a decorated class is unwrapped, bound deployments
become handles, user_config reaches reconfigure() at start and on change, without a restart."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fleetpulse.serve import context
from fleetpulse.serve.handle import DeploymentHandle
from services.replica.user_config import UserConfigFollower, config_update
from services.replica.usercode import UserDeployment, load_target
from services.router.testing import FakeReplica, put_membership
from shared.appconfig import AppConfig, DeploymentConfig
from shared.appgraph import handle_ref
from shared.errors import ConfigError
from shared.fakebus import FakeBus, FakeServer
from shared.replicahttp import with_serving_env
from shared.subjects import DEFAULT_SUBJECTS
from tests.unit.serve_apps import replica_apps
from tests.waiting import eventually as until

MOD = "tests.unit.serve_apps.replica_apps"


@pytest.fixture
async def bus() -> AsyncIterator[FakeBus]:
    b = FakeServer().connect("replica")
    yield b
    await b.close()


@pytest.fixture
async def host(bus: FakeBus) -> AsyncIterator[FakeBus]:
    ctx = context.ReplicaContext("shop", "Tunable", "replica-1")
    context._enter(ctx, bus, asyncio.get_running_loop(), DEFAULT_SUBJECTS)
    yield bus
    context._leave()


def test_a_decorated_class_is_unwrapped() -> None:
    assert load_target(f"{MOD}:Tunable") is replica_apps.Tunable.func_or_class


async def test_handles_context_and_reconfigure_at_start(host: FakeBus) -> None:
    made: list[str] = []

    def handle(name: str) -> str:
        made.append(name)
        return f"handle to {name}"

    user = await UserDeployment.create(
        f"{MOD}:Tunable", (), {"downstream": [handle_ref("Back")]},
        handles=handle, user_config={"k": 2},
    )  # fmt: skip
    instance = user.instance
    assert instance.downstream == ["handle to Back"] and made == ["Back"]
    assert instance.context.replica_id == "replica-1"  # already in the constructor
    assert instance.configs == [{"k": 2}]  # before the first request


async def test_user_config_without_reconfigure_is_refused(host: FakeBus) -> None:
    with pytest.raises(ConfigError, match="no reconfigure"):
        await UserDeployment.create(f"{MOD}:Plain", (), {}, user_config={"k": 1})
    with pytest.raises(ConfigError, match="no bus to reach them"):
        await UserDeployment.create(f"{MOD}:Tunable", (handle_ref("X"),), {})


def app_json(user_config: dict[str, Any] | None, version: str = "", **kw: Any) -> bytes:
    d = DeploymentConfig("Tunable", f"{MOD}:Tunable", user_config=user_config, **kw)
    return AppConfig("shop", (d,), version=version).to_json()


def test_config_update_decides_what_a_value_means() -> None:
    version = AppConfig.from_json(app_json({"k": 1})).version_of(
        DeploymentConfig("Tunable", f"{MOD}:Tunable")
    )
    assert config_update(app_json({"k": 3}), "Tunable", version, {"k": 1}) == {"k": 3}
    keep = config_update(app_json({"k": 1}), "Tunable", version, {"k": 1})
    assert keep is not None and not isinstance(keep, dict)  # unchanged
    # another version rolls new replicas, which start with its config
    newer = app_json({"k": 3}, max_ongoing_requests=9)
    assert not isinstance(config_update(newer, "Tunable", version, {"k": 1}), dict)
    assert not isinstance(config_update(b"{not json", "Tunable", version, None), dict)
    assert not isinstance(config_update(app_json({"k": 3}), "Gone", version, None), dict)
    # the user_config is not part of the version: only it changed, the version is the same
    assert (
        AppConfig.from_json(app_json({"k": 9})).version_of(
            AppConfig.from_json(app_json({"k": 9})).deployments[0]
        )
        == version
    )


async def test_the_follower_reconfigures_in_place_and_a_refusal_fails_health(
    host: FakeBus,
) -> None:
    user = await UserDeployment.create(f"{MOD}:Tunable", (), {}, user_config={"k": 1})
    version = AppConfig.from_json(app_json({"k": 1})).version_of(
        DeploymentConfig("Tunable", f"{MOD}:Tunable")
    )
    follower = UserConfigFollower(host, user, "shop", "Tunable", version, {"k": 1})
    assert not await follower.offer(app_json({"k": 1}))
    assert await follower.offer(app_json({"k": 2}))
    assert user.instance.configs == [{"k": 1}, {"k": 2}]
    assert await user.check_health(1.0)
    assert not await follower.offer(app_json({"bad": True}))
    assert follower.failed_count == 1 and not await user.check_health(1.0)
    assert await follower.offer(app_json({"k": 3}))  # a later good config heals it
    assert await user.check_health(1.0)


async def test_the_follower_watches_fp_apps(host: FakeBus) -> None:
    user = await UserDeployment.create(f"{MOD}:Tunable", (), {}, user_config={"k": 1})
    version = AppConfig.from_json(app_json({"k": 1})).version_of(
        DeploymentConfig("Tunable", f"{MOD}:Tunable")
    )
    kv = await host.kv("fp_apps")
    await kv.put("shop", app_json({"k": 1}))
    follower = UserConfigFollower(host, user, "shop", "Tunable", version, {"k": 1})
    task = asyncio.create_task(follower.run())
    try:
        await kv.put("shop", app_json({"k": 5}))
        await until(lambda: follower.applied_count == 1, 10, "the new user_config applied")
        assert user.instance.configs == [{"k": 1}, {"k": 5}]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_handles_compose_chain_block_and_stream(host: FakeBus) -> None:
    back = await FakeReplica(host, "shop", "Back", "back-1").start()

    def fn(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if method == "count":
            return list(range(args[0]))
        return {"echo": args[0]}

    back.fn = fn
    await put_membership(host, "shop", "Back", 1, [back.member])
    loop = asyncio.get_running_loop()
    handle = DeploymentHandle._connect("shop", "Back", host, loop)
    front = replica_apps.Front.func_or_class(handle)
    try:
        # a response passed as an argument is awaited first
        assert await front.chain(4) == {"echo": {"echo": 4}}
        # from synchronous user code (a worker thread): result() blocks for it
        assert await asyncio.to_thread(front.blocking, 2) == {"echo": 2}
        assert [r.method for r in back.requests[-1:]] == ["echo"]
        assert await front.items(3) == [0, 1, 2]  # a streaming call, item by item
        with pytest.raises(TypeError):
            DeploymentHandle()
    finally:
        await back.stop()


def test_an_ingress_replica_takes_a_new_user_config_too() -> None:
    """The controller starts an ingress's replicas with its serving env in the spec (their
    version includes it): a value without that env still names their version."""
    d = DeploymentConfig("Tunable", f"{MOD}:Tunable", user_config={"k": 1})
    app = AppConfig("shop", (d,), route_prefix="/shop")
    version = app.version_of(with_serving_env(app, d))  # what the replica was started with
    value = dataclasses.replace(
        app, deployments=(dataclasses.replace(d, user_config={"k": 2}),)
    ).to_json()
    assert config_update(value, "Tunable", version, {"k": 1}) == {"k": 2}

"""Shared fixtures: real nats-servers started (and always stopped) by the test, and `bus`.

`bus` / `bus_factory` run a test once on the in-memory fake and once on a real nats-server; the
real variant, every test under tests/integration, and every test using a server fixture get the
`integration` marker (deselect them with `-m "not integration"`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from shared.bus import Bus
from shared.fakebus import FakeServer
from shared.natsbus import NatsBus
from shared.natsserver import NatsCluster, NatsServer

BusFactory = Callable[[], Awaitable[Bus]]

_SERVER_FIXTURES = frozenset({"nats_server", "nats_url", "nats_cluster"})
_INTEGRATION_DIR = Path(__file__).parent / "integration"
TEST_RECONNECT_WAIT_S = 0.1


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--engine",
        action="store_true",
        help="run the tests marked `engine` (a real Docker engine; scripts/compose-check)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--engine"):
        engine = [item for item in items if item.get_closest_marker("engine")]
        if engine:
            config.hook.pytest_deselected(items=engine)
            items[:] = [item for item in items if not item.get_closest_marker("engine")]
    for item in items:
        callspec = getattr(item, "callspec", None)
        real_bus = callspec is not None and callspec.params.get("bus_factory") == "nats"
        uses_server = bool(_SERVER_FIXTURES & set(getattr(item, "fixturenames", ())))
        if real_bus or uses_server or _INTEGRATION_DIR in Path(item.path).parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture
def nats_server() -> Iterator[NatsServer]:
    """A fresh nats-server (JetStream on, temp store, free loopback port) for one test."""
    server = NatsServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_url(nats_server: NatsServer) -> str:
    return nats_server.url


@pytest.fixture
async def nats_bus(nats_url: str) -> AsyncIterator[NatsBus]:
    """One connection to the test's nats-server (where a test needs JetStream, not the fake)."""
    bus = await NatsBus.connect(nats_url, name="test", reconnect_wait=TEST_RECONNECT_WAIT_S)
    yield bus
    await bus.close()


@pytest.fixture
def nats_cluster() -> Iterator[NatsCluster]:
    """Three routed nats-servers with JetStream, ready (meta leader known) before the test."""
    cluster = NatsCluster(3)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(params=["fake", "nats"])
async def bus_factory(request: pytest.FixtureRequest) -> AsyncIterator[BusFactory]:
    """Opens connections to one server: a FakeServer, or a real nats-server."""
    opened: list[Bus] = []
    if request.param == "fake":
        server = FakeServer()

        async def connect() -> Bus:
            bus = server.connect(f"test-{len(opened)}")
            opened.append(bus)
            return bus

    else:
        url = request.getfixturevalue("nats_url")

        async def connect() -> Bus:
            bus = await NatsBus.connect(
                url, name=f"test-{len(opened)}", reconnect_wait=TEST_RECONNECT_WAIT_S
            )
            opened.append(bus)
            return bus

    try:
        yield connect
    finally:
        for bus in opened:
            await bus.close()


@pytest.fixture
async def bus(bus_factory: BusFactory) -> Bus:
    return await bus_factory()

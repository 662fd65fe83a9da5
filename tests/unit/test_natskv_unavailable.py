"""A KV operation JetStream answers "temporarily unavailable" (a leader being elected) is retried
for the bus's `unavailable_retry_s` (the operator's CLI), and fails at once where it is 0
(services, which retry in their own loops). Fake JetStream, fake clock: no server."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import nats.errors
import nats.js.errors
import pytest

from shared.clock import FakeClock
from shared.errors import BusError, BusTimeout, NoResponders
from shared.natskv import UNAVAILABLE_RETRY_S, NatsKV


def _unavailable() -> Exception:
    return nats.js.errors.ServiceUnavailableError(
        code=503, description="JetStream system temporarily unavailable"
    )


@dataclass
class Flaky:
    """Raises each of `failures` in turn, then answers; each call advances the clock by `step_s`."""

    clock: FakeClock
    failures: list[Exception]
    step_s: float = 0.0
    calls: int = 0
    answer: Any = None

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        self.clock.advance(self.step_s)
        if self.failures:
            raise self.failures.pop(0)
        return self.answer


@dataclass
class Host:
    clock: FakeClock
    unavailable_retry_s: float
    js: Any = None
    watchers: list[Any] = field(default_factory=list)

    def remember(self, watcher: Any) -> None: ...

    def forget(self, watcher: Any) -> None: ...


def _kv(retry_s: float, **raw: Flaky) -> NatsKV:
    clock = next(iter(raw.values())).clock
    host = Host(clock, retry_s)
    return NatsKV(host, "fp_apps", SimpleNamespace(**raw))  # type: ignore[arg-type]


async def test_a_put_waits_out_a_leader_election() -> None:
    clock = FakeClock()
    put = Flaky(clock, [_unavailable(), nats.errors.NoRespondersError()], answer=7)
    assert await _kv(UNAVAILABLE_RETRY_S, put=put).put("audited", b"{}") == 7
    assert put.calls == 3


async def test_a_get_gives_up_after_the_retry_window_with_the_error_named() -> None:
    clock = FakeClock()
    get = Flaky(clock, [_unavailable() for _ in range(100)], step_s=4.0)
    with pytest.raises(BusError, match=r"KV get fp_apps/audited: ServiceUnavailableError"):
        await _kv(UNAVAILABLE_RETRY_S, get=get).get("audited")
    assert 2 <= get.calls <= 5  # ~15 s of fake time at 4 s a call


async def test_without_a_retry_window_the_first_answer_is_the_error() -> None:
    clock = FakeClock()
    delete = Flaky(clock, [nats.errors.NoRespondersError()])
    with pytest.raises(NoResponders):
        await _kv(0.0, delete=delete).delete("audited")
    assert delete.calls == 1


async def test_a_timeout_is_not_retried_since_the_write_may_have_landed() -> None:
    clock = FakeClock()
    update = Flaky(clock, [nats.errors.TimeoutError()])
    with pytest.raises(BusTimeout):
        await _kv(UNAVAILABLE_RETRY_S, update=update).update("audited", b"{}", 3)
    assert update.calls == 1


async def test_a_snapshot_is_read_again_when_its_consumer_could_not_be_made() -> None:
    """The failure the compose engine test met: `fleetpulse delete` right after a deploy, on a
    3-node cluster whose fp_apps stream was still electing a leader."""
    clock = FakeClock()
    add_consumer = Flaky(clock, [_unavailable()], answer=SimpleNamespace(num_pending=0, name="c"))
    deleted: list[str] = []

    async def delete_consumer(stream: str, name: str) -> None:
        deleted.append(name)

    kv = _kv(UNAVAILABLE_RETRY_S, get=add_consumer)
    kv.bus.js = SimpleNamespace(add_consumer=add_consumer, delete_consumer=delete_consumer)
    assert await kv.snapshot([">"]) == []
    assert add_consumer.calls == 2 and deleted == ["c"]

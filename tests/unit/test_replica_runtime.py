"""The replica shell on the in-memory bus: admission, streams, frames, heartbeats, drain."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import msgpack
import pytest

from services.replica.config import ReplicaConfig
from services.replica.runtime import ReplicaRuntime
from services.replica.usercode import UserDeployment
from shared.bus import Bus, Msg
from shared.errors import BusTimeout, NoResponders
from shared.fakebus import FakeServer
from shared.probes import NOT_HELD
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.wire import decode, decode_as, encode
from shared.wire.messages import (
    Admission,
    CallArgs,
    Chunk,
    End,
    ErrorReply,
    HealthFrame,
    HealthStatus,
    Heartbeat,
    HttpRequest,
    HttpResponse,
    Lifecycle,
    ProbeRequest,
    Request,
)

ECHO = "services.examples.echo:Echo"
VECTORS = Path(__file__).resolve().parents[2] / "schemas" / "vectors"


async def make_replica(bus: Bus, *, import_path: str = ECHO, **overrides: Any) -> ReplicaRuntime:
    cfg = ReplicaConfig.of(
        app="app",
        deployment="dep",
        import_path=import_path,
        replica_id=overrides.pop("replica_id", "r1"),
        health_check_period_s=overrides.pop("health_check_period_s", 0.05),
        health_check_timeout_s=1.0,
        graceful_shutdown_timeout_s=overrides.pop("graceful_shutdown_timeout_s", 2.0),
        **overrides,
    )
    user = await UserDeployment.create(
        cfg.spec.import_path, cfg.spec.init_args, cfg.spec.init_kwargs
    )
    rt = ReplicaRuntime(cfg, bus, user)
    await rt.start()
    return rt


def call(
    method: str,
    *args: Any,
    frames: bool = False,
    stream: bool = False,
    deadline: float | None = None,
) -> bytes:
    body = encode(CallArgs(tuple(args), {}))
    req = Request(uuid.uuid4().hex, method, frames, stream, deadline, body, "args")
    return encode(req)


async def collect(bus: Bus, data: bytes, wait_s: float = 2.0) -> list[Any]:
    stream = await bus.request_stream(S.rpc("app", "dep", "r1"), data)
    out: list[Any] = []
    try:
        while True:
            msg = decode((await stream.next(wait_s)).data)
            out.append(msg)
            if isinstance(msg, End | ErrorReply) or (
                isinstance(msg, Admission) and not msg.accepted
            ):
                return out
    finally:
        await stream.close()


HTTP_GET = HttpRequest("GET", "/", "", (), b"")


@pytest.fixture
async def buses() -> Any:
    server = FakeServer()
    a, b = server.connect(), server.connect()
    yield a, b
    await a.close()
    await b.close()


async def test_unary_call_gets_admission_with_health_then_result(buses: Any) -> None:
    rbus, cbus = buses
    rt = await make_replica(rbus)
    out = await collect(cbus, call("echo", {"x": 1}))
    adm, chunk, end = out
    assert isinstance(adm, Admission) and adm.accepted and adm.num_ongoing == 1
    assert adm.health.replica_id == "r1" and adm.health.healthy
    assert adm.will_send_health_frames is False  # the caller did not offer frames
    assert isinstance(chunk, Chunk) and msgpack.unpackb(chunk.data) == {"x": 1}
    assert isinstance(end, End)
    assert rt.stats.completed == 1
    await rt.stop()


async def test_sync_method_and_generators_stream_chunks_in_order(buses: Any) -> None:
    rbus, cbus = buses
    rt = await make_replica(rbus)
    out = await collect(cbus, call("sync_echo", "hi"))
    assert msgpack.unpackb(out[1].data) == "hi"
    for method in ("count", "sync_count"):
        out = await collect(cbus, call(method, 4, stream=True))
        chunks = [m for m in out if isinstance(m, Chunk)]
        assert [c.seq for c in chunks] == [0, 1, 2, 3]
        assert [msgpack.unpackb(c.data) for c in chunks] == [0, 1, 2, 3]
    # a generator called without stream=True is collected into one value
    out = await collect(cbus, call("count", 3))
    assert msgpack.unpackb(out[1].data) == [0, 1, 2]
    await rt.stop()


async def test_the_end_counts_the_chunks_sent(buses: Any) -> None:
    """`End.chunks` lets a router tell a chunk lost in transit from a short result."""
    rbus, cbus = buses
    rt = await make_replica(rbus)
    for data, sent in [
        (call("echo", 1), 1),
        (call("count", 4, stream=True), 4),
        (call("count", 0, stream=True), 0),
        (call("count", 3), 1),  # collected into one value
        (encode(Request("h1", "__call__", False, True, None, encode(HTTP_GET), "http")), 1),
    ]:
        out = await collect(cbus, data)
        assert out[-1] == End(sent)
        assert sum(isinstance(m, Chunk) for m in out) == sent
    await rt.stop()


async def test_full_replica_rejects_with_its_load_and_health(buses: Any) -> None:
    rbus, cbus = buses
    rt = await make_replica(rbus, max_ongoing_requests=1)
    held = asyncio.create_task(collect(cbus, call("sleep", 0.3)))
    await asyncio.sleep(0.05)
    out = await collect(cbus, call("echo", 1))
    assert len(out) == 1 and isinstance(out[0], Admission) and not out[0].accepted
    assert out[0].num_ongoing == 1 and out[0].health.replica_id == "r1"
    assert isinstance((await held)[-1], End)
    assert rt.stats.rejected == 1
    await rt.stop()


@pytest.mark.parametrize(
    "method,args,code",
    [
        ("fail", ("boom",), "user_error"),
        ("nope", (), "method_not_found"),
        ("_private", (), "method_not_found"),
    ],
)
async def test_errors_are_typed_replies(
    buses: Any, method: str, args: tuple[Any, ...], code: str
) -> None:
    rbus, cbus = buses
    rt = await make_replica(rbus)
    out = await collect(cbus, call(method, *args))
    assert isinstance(out[-1], ErrorReply) and out[-1].code == code and not out[-1].retryable
    await rt.stop()


async def test_garbage_gets_bad_request_and_the_replica_keeps_serving(buses: Any) -> None:
    rbus, cbus = buses
    rt = await make_replica(rbus)
    req = msgpack.unpackb(call("echo", 1))
    unsupported = msgpack.packb({**req, "body_kind": "grpc"}, use_bin_type=True)
    for junk in (b"", b"\x00\xff garbage", encode(CallArgs((), {})), unsupported):
        out = await collect(cbus, junk)
        # every stream starts with exactly one admission (docs/wire.md), even this one
        assert [type(m) for m in out] == [Admission, ErrorReply], junk
        assert out[1].code == "bad_request" and not out[1].retryable
    assert rt.bad.total == 4
    out = await collect(cbus, call("echo", 5))
    assert msgpack.unpackb(out[1].data) == 5
    await rt.stop()


async def test_deadline_exceeded(buses: Any) -> None:
    rbus, cbus = buses
    rt = await make_replica(rbus)
    out = await collect(cbus, call("sleep", 5, deadline=rt.clock.wall() + 0.1))
    assert isinstance(out[-1], ErrorReply) and out[-1].code == "deadline_exceeded"
    out = await collect(cbus, call("echo", 1, deadline=rt.clock.wall() - 1))
    assert out[-1].code == "deadline_exceeded"
    await rt.stop()


async def test_the_golden_request_vectors_are_served_by_a_live_replica(buses: Any) -> None:
    """A vector is what an outside implementer copies: a live replica must serve it, not refuse
    its method as private (issue 14: request_http used `__http__`)."""
    rbus, cbus = buses
    rt = await make_replica(rbus)
    out = await collect(cbus, (VECTORS / "request_http.msgpack").read_bytes())
    assert isinstance(out[0], Admission) and out[0].accepted
    assert isinstance(out[-1], End), out[-1]
    await rt.stop()


async def test_http_body_kind_reaches_call_as_a_request(buses: Any) -> None:
    rbus, cbus = buses
    rt = await make_replica(rbus)
    http = HttpRequest("PUT", "/x", "a=1", (("h", "v"),), b"payload")
    req = Request("id1", "__call__", False, False, None, encode(http), "http")
    out = await collect(cbus, encode(req))
    resp = decode_as(out[1].data, HttpResponse)
    assert resp.status == 200 and resp.body == b"payload"
    assert ("x-echo-method", "PUT") in resp.headers
    await rt.stop()


async def test_a_held_request_gets_frames_only_when_declared(buses: Any) -> None:
    rbus, cbus = buses
    rt = await make_replica(rbus, health_check_period_s=0.05)
    # frames start once the admission (a riding channel) is a freshness window (1 s) old
    out = await collect(cbus, call("sleep", 1.5, frames=True))
    adm = out[0]
    assert adm.will_send_health_frames
    frames = [m for m in out if isinstance(m, HealthFrame)]
    assert len(frames) >= 3
    stamps = [adm.health.checked_at] + [f.health.checked_at for f in frames]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
    assert isinstance(out[-1], End)
    out = await collect(cbus, call("sleep", 0.3, frames=False))
    assert not any(isinstance(m, HealthFrame) for m in out)
    await rt.stop()


async def test_self_reporting_replica_declines_frames(buses: Any) -> None:
    rbus, cbus = buses
    # its reports come at least once a health period: every check rides on one
    rt = await make_replica(
        rbus, push_metrics=True, metrics_interval_s=0.1, health_check_period_s=0.2
    )
    out = await collect(cbus, call("sleep", 0.2, frames=True))
    assert not out[0].will_send_health_frames
    assert not any(isinstance(m, HealthFrame) for m in out)
    await rt.stop()


async def test_heartbeats_stop_while_traffic_flows_and_resume_after(buses: Any) -> None:
    rbus, cbus = buses
    beats: list[tuple[float, Heartbeat]] = []
    loop = asyncio.get_running_loop()

    async def on_beat(msg: Msg) -> None:
        beats.append((loop.time(), decode_as(msg.data, Heartbeat)))

    await cbus.subscribe(S.report("heartbeat", "app", "dep", "r1"), on_beat)
    # period 0.2 s -> freshness window max(0.3, 1.0) = 1.0 s
    rt = await make_replica(rbus, health_check_period_s=0.2)
    await asyncio.sleep(1.3)
    idle_beats = len(beats)
    assert idle_beats >= 1  # nothing else carries health: heartbeats flow
    start = loop.time()
    while loop.time() - start < 2.5:  # traffic: admissions carry health
        await collect(cbus, call("echo", 1))
        await asyncio.sleep(0.1)
    during = [t for t, _ in beats if start + 0.05 < t < start + 2.5]
    assert during == []
    await asyncio.sleep(1.6)
    assert len(beats) > idle_beats  # traffic stopped: heartbeats resume on their own
    assert rt.stats.heartbeats == len(beats)
    await rt.stop()


async def test_probe_answers_with_latest_health(buses: Any) -> None:
    rbus, cbus = buses
    rt = await make_replica(rbus)
    reply = await cbus.request(S.probe("r1"), b"", timeout=1.0)
    status = decode_as(reply.data, HealthStatus)
    assert status.replica_id == "r1" and status.healthy
    await rt.stop()


async def test_a_probe_naming_a_request_says_whether_the_replica_still_holds_it(
    buses: Any,
) -> None:
    rbus, cbus = buses
    rt = await make_replica(rbus)
    data = call("sleep", 0.5)
    running = asyncio.create_task(collect(cbus, data))
    request_id = decode_as(data, Request).request_id

    async def ask(rid: str | None) -> Any:
        probe = encode(ProbeRequest(0.0, rid))
        return decode((await cbus.request(S.probe("r1"), probe, timeout=1.0)).data)

    await until(lambda: request_id in rt._held)
    assert isinstance(await ask(request_id), HealthStatus)  # running: health, as any probe
    assert isinstance(await ask(None), HealthStatus)
    assert isinstance((await running)[-1], End)
    gone = await ask(request_id)  # finished: its reply, if we missed it, is lost
    assert isinstance(gone, ErrorReply) and gone.code == NOT_HELD and gone.retryable
    bad = rt.bad.total
    with pytest.raises(BusTimeout):  # garbage: dropped, no answer
        await cbus.request(S.probe("r1"), b"\xc1", timeout=0.2)
    assert rt.bad.total == bad + 1
    await rt.stop()


async def until(cond: Any, within_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def test_failing_check_is_counted_and_reported(buses: Any, tmp_path: Any) -> None:
    rbus, cbus = buses
    flag = tmp_path / "fail"
    flag.write_text("x")
    rt = await make_replica(rbus, init_kwargs={"fail_health_file": str(flag)})
    await asyncio.sleep(0.3)
    reply = await cbus.request(S.probe("r1"), b"", timeout=1.0)
    status = decode_as(reply.data, HealthStatus)
    assert not status.healthy and status.consecutive_failures >= 3
    flag.unlink()
    await asyncio.sleep(0.2)
    status = decode_as((await cbus.request(S.probe("r1"), b"", timeout=1.0)).data, HealthStatus)
    assert status.healthy and status.consecutive_failures == 0
    await rt.stop()


async def test_drain_finishes_in_flight_rejects_new_and_reports_lifecycle(buses: Any) -> None:
    rbus, cbus = buses
    states: list[str] = []

    async def on_life(msg: Msg) -> None:
        states.append(decode_as(msg.data, Lifecycle).state)

    await cbus.subscribe(S.report("lifecycle", "app", "dep", "r1"), on_life)
    rt = await make_replica(rbus)
    held = asyncio.create_task(collect(cbus, call("sleep", 0.3)))
    await asyncio.sleep(0.05)
    drain = asyncio.create_task(rt.drain())
    await asyncio.sleep(0.05)
    out = await collect(cbus, call("echo", 1))
    assert isinstance(out[0], Admission) and not out[0].accepted  # draining: not admitted
    assert isinstance((await held)[-1], End)  # the in-flight request finished
    await drain
    await cbus.flush()
    await asyncio.sleep(0.05)
    assert states == ["starting", "ready", "draining", "exited"]
    with pytest.raises(NoResponders):  # unsubscribed after the drain
        await collect(cbus, call("echo", 1), wait_s=0.2)


async def test_drain_timeout_cancels_with_a_retryable_error(buses: Any) -> None:
    rbus, cbus = buses
    rt = await make_replica(rbus, graceful_shutdown_timeout_s=0.1)
    held = asyncio.create_task(collect(cbus, call("sleep", 5)))
    await asyncio.sleep(0.05)
    await rt.drain()
    out = await held
    assert (
        isinstance(out[-1], ErrorReply) and out[-1].code == "replica_shutdown" and out[-1].retryable
    )

"""Per-replica identities through the NATS auth callout, on a real nats-server.

A replica of app A connects with the credential its agent minted; the server asks `fleetpulse
auth`, which grants the replica role narrowed to that one replica. It must not be able to read
B's requests, speak for B, or pass for another replica; legitimate traffic must flow as before.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shared.bus import Msg
from shared.errors import BusAuthError
from shared.natsauth import NatsAuth
from shared.natsbus import NatsBus
from shared.natsjwt import PREFIX_USER, KeyPair
from shared.subjects import KV_MEMBERSHIP, Subjects
from tests.integration.authcallout import AUTH_USER, MODES, Callout, callout_server
from tests.procs import service_processes
from tests.waiting import eventually

pytestmark = pytest.mark.integration
S = Subjects()
QUIET_S = 0.5
"""How long a message that must not arrive is given to arrive anyway, after a flush proved
the server had everything."""


@pytest.fixture(params=MODES)
async def callout(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Callout]:
    async for c in callout_server(tmp_path, request.param):
        yield c


async def _collect(bus: NatsBus, subject: str) -> list[Msg]:
    got: list[Msg] = []

    async def handler(m: Msg) -> None:
        got.append(m)

    await bus.subscribe(subject, handler)
    await bus.flush()
    return got


async def test_legitimate_traffic_flows(callout: Callout) -> None:
    replica = await callout.replica("A", "d", "a1")
    router = await callout.role("router")
    controller = await callout.role("controller")
    reports = await _collect(controller, S.reports_wildcard())

    async def answer(m: Msg) -> None:
        assert m.reply
        await replica.publish(m.reply, b"pong:" + m.data)

    await replica.subscribe(S.rpc("A", "d", "a1"), answer)
    await replica.flush()
    reply = await router.request(S.rpc("A", "d", "a1"), b"ping", timeout=5)
    assert reply.data == b"pong:ping"
    for kind in ("replica", "heartbeat", "lifecycle"):
        await replica.publish(S.report(kind, "A", "d", "a1"), kind.encode())  # type: ignore[arg-type]
    await replica.flush()
    await eventually(lambda: len(reports) == 3, what="the replica's three reports")
    # its KV reads (membership, user_config) work, their replies on its own inboxes
    await (await controller.kv(KV_MEMBERSHIP)).put("A.d", b"m")
    entry = await (await replica.kv(KV_MEMBERSHIP, create=False)).get("A.d")
    assert entry is not None and entry.value == b"m"
    assert replica.permission_violations == 0


async def test_cannot_read_another_apps_rpc(callout: Callout) -> None:
    a = await callout.replica("A", "d", "a1")
    b = await callout.replica("B", "d", "b1")
    router = await callout.role("router")
    stolen = await _collect(a, S.rpc("B", "d", "b1"))
    stolen_all = await _collect(a, "fp.v1.rpc.>")
    theirs = await _collect(b, S.rpc("B", "d", "b1"))
    await eventually(lambda: a.permission_violations >= 2, what="the server refusing both SUBs")
    await router.publish(S.rpc("B", "d", "b1"), b"secret")
    await router.flush()
    await eventually(lambda: theirs, what="B's own request reaching B")
    await asyncio.sleep(QUIET_S)
    assert stolen == [] and stolen_all == []


async def test_cannot_read_other_inboxes(callout: Callout) -> None:
    """Responses travel to the caller's inbox: a replica must not see another's."""
    a = await callout.replica("A", "d", "a1")
    router = await callout.role("router")
    snooped = await _collect(a, "_INBOX.>")
    await eventually(lambda: a.permission_violations >= 1, what="the server refusing the SUB")
    await router.publish(router.new_inbox(), b"a response for someone else")
    await router.flush()
    await asyncio.sleep(QUIET_S)
    assert snooped == []


async def test_cannot_publish_another_apps_reports(callout: Callout) -> None:
    a = await callout.replica("A", "d", "a1")
    controller = await callout.role("controller")
    reports = await _collect(controller, S.reports_wildcard())
    for kind in ("replica", "heartbeat", "lifecycle", "handle"):
        await a.publish(S.report(kind, "B", "d"), b"forged")  # type: ignore[arg-type]
    await a.publish(S.report("replica", "A", "other"), b"forged: a sibling deployment")
    await a.publish(S.report("replica", "A", "d", "a2"), b"forged: a sibling replica")
    await a.publish(S.report("heartbeat", "A", "d"), b"forged: no id, so anyone's")
    await a.flush()
    await eventually(lambda: a.permission_violations >= 7, what="the server refusing each PUB")
    await asyncio.sleep(QUIET_S)
    assert reports == []


async def test_credential_is_bound_to_its_replica(callout: Callout) -> None:
    a1 = await callout.replica("A", "d", "a1")
    router = await callout.role("router")
    sibling = await _collect(a1, S.rpc("A", "d", "a2"))
    probe = await _collect(a1, S.probe("a2"))
    await eventually(lambda: a1.permission_violations >= 2, what="the server refusing the SUBs")
    await router.publish(S.rpc("A", "d", "a2"), b"for a2")
    await router.publish(S.probe("a2"), b"probe a2")
    await router.flush()
    await asyncio.sleep(QUIET_S)
    assert sibling == [] and probe == []


async def test_forged_and_stale_credentials_are_refused(callout: Callout) -> None:
    url = callout.server.url

    async def refused(token: str) -> None:
        with pytest.raises(BusAuthError):
            await NatsBus.connect(url, name="x", auth=NatsAuth(token=token), connect_timeout=5)

    good = callout.credential("A", "d", "a1")
    head, claims, sig = good.split(".")
    body = json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))
    body["sub"] = "a2"  # the same credential, claimed for another replica id
    forged = base64.urlsafe_b64encode(json.dumps(body).encode()).decode().rstrip("=")
    await refused(f"{head}.{forged}.{sig}")
    await refused(callout.credential("A", "d", "a1", key=KeyPair.generate(PREFIX_USER)))
    expired = callout.credential("A", "d", "a1", ttl_s=1)
    await eventually(lambda: time.time() > json_exp(expired), within_s=5, what="expiry")
    await refused(expired)
    await refused("not-a-credential")
    # the shared `replica` password role of accounts.conf does not exist under the callout
    with pytest.raises(BusAuthError):
        await NatsBus.connect(url, name="x", auth=NatsAuth(user="replica", password="x"))
    with pytest.raises(BusAuthError):
        await NatsBus.connect(
            url, name="x", auth=NatsAuth(user="controller", password="wrong"), connect_timeout=5
        )


def json_exp(token: str) -> float:
    claims = token.split(".")[1]
    return float(json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))["exp"])


async def test_auth_service_outage(callout: Callout, caplog: pytest.LogCaptureFixture) -> None:
    """Connections made keep working while the auth service is down; a new one waits, says
    why, and gets in once the service is back."""
    replica = await callout.replica("A", "d", "a1")
    router = await callout.role("router")
    got = await _collect(replica, S.rpc("A", "d", "a1"))
    await callout.stop_service()

    await router.publish(S.rpc("A", "d", "a1"), b"during the outage")
    await router.flush()
    await eventually(lambda: got, what="a request on a connection made before the outage")

    caplog.set_level("WARNING", logger="shared.natsbus")
    newcomer = asyncio.create_task(callout.replica("A", "d", "a2", connect_timeout=60))
    await eventually(
        lambda: "the auth service may be down" in caplog.text,
        within_s=20,
        what="a log line saying why the newcomer waits",
    )
    assert not newcomer.done()
    await callout.start_service()
    a2 = await asyncio.wait_for(newcomer, 30)
    mine = await _collect(a2, S.rpc("A", "d", "a2"))
    await router.publish(S.rpc("A", "d", "a2"), b"after")
    await router.flush()
    await eventually(lambda: mine, what="the newcomer serving once the service is back")


async def test_reconnect_after_restart_needs_a_fresh_credential(callout: Callout) -> None:
    """A replica reconnecting after a NATS restart presents its credential file again: the
    renewed one gets it back in although the first has expired; one never renewed does not."""
    short = {rid: callout.credential("A", "d", rid, ttl_s=1) for rid in ("a1", "a2")}
    renewed = await callout.replica("A", "d", "a1", token=short["a1"])
    stale = await callout.replica("A", "d", "a2", token=short["a2"])
    callout.credential_file("a1", callout.credential("A", "d", "a1", ttl_s=60))
    first_exp = max(json_exp(t) for t in short.values())
    await eventually(lambda: time.time() > first_exp, within_s=5, what="the first window to end")

    await asyncio.to_thread(callout.server.restart)
    await eventually(lambda: renewed.nc.is_connected, within_s=20, what="the renewed reconnecting")
    router = await callout.role("router")
    got = await _collect(renewed, S.rpc("A", "d", "a1"))
    await router.publish(S.rpc("A", "d", "a1"), b"after the restart")
    await router.flush()
    await eventually(lambda: got, what="the renewed replica serving after the restart")
    await asyncio.sleep(QUIET_S * 4)
    assert not stale.nc.is_connected


async def test_the_auth_command(
    callout: Callout, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fleetpulse auth` as a process, configured by flags and environment, as an operator runs it."""
    await callout.stop_service()
    seed = tmp_path / "issuer.seed"
    seed.write_text(callout.issuer.seed + "\n")
    monkeypatch.setenv("FLEETPULSE_NATS_USER", AUTH_USER)
    monkeypatch.setenv("FLEETPULSE_NATS_PASSWORD", callout.auth_password)
    monkeypatch.setenv("FP_ROUTER_PASSWORD", callout.passwords["router"])
    monkeypatch.setenv("FLEETPULSE_AUTH_REPLICA_KEYS", callout.replica_key.public_key)
    log = tmp_path / "auth.log"
    argv = ["-m", "services.cli", "auth", "--nats", callout.server.url, "--issuer-seed", str(seed)]
    with service_processes() as procs:
        proc = procs.start(argv, log=log)
        await eventually(lambda: "auth callout up" in log.read_text(), within_s=20, what="ready")
        replica = await callout.replica("A", "d", "a1")
        router = await callout.role("router")
        got = await _collect(replica, S.rpc("A", "d", "a1"))
        await router.publish(S.rpc("A", "d", "a1"), b"hi")
        await router.flush()
        await eventually(lambda: got, what="a request through identities the process granted")
        with pytest.raises(BusAuthError):
            await NatsBus.connect(
                callout.server.url, name="x", auth=NatsAuth(user="operator", password="unset")
            )
        assert proc.poll() is None
    assert "refused connection 'x'" in log.read_text()

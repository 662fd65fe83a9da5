"""`NatsBus`: the `shared.bus.Bus` protocol over nats-py.

How it works: each call validates like the fake does (subjects, keys, payload size), then calls
nats-py and turns its errors into ours (`BusTimeout`, `NoResponders`, `KVConflict`, else
`BusError`). Handlers run on nats-py's per-subscription task behind a `HandlerGuard`, so a
raising handler is counted and logged and its subscription lives on; inline handlers and
`publish_nowait` skip nats-py's task hand-overs (shared.natsdirect), as do the response inbox
and the request a response stream sends. The connection reconnects
forever; disconnects, reconnects and errors are logged (errors rate-limited, since nats-py
reports every failed reconnect attempt); after a reconnect every live KV watcher reopens its
consumer (see `shared.natskv`). `.nc` and `.js` are there for JetStream streams and consumers,
which the protocol does not cover.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, cast

import nats.errors
import nats.js.errors
from nats.aio.client import DEFAULT_INBOX_PREFIX
from nats.aio.msg import Msg as NatsMsg
from nats.aio.subscription import Subscription as NatsSubscription
from nats.js import JetStreamContext

from shared.bus import (
    KV,
    Bus,
    Handler,
    HandlerGuard,
    InlineGuard,
    InlineHandler,
    MaxPayloadExceeded,
    Msg,
    QueueResponseStream,
    RateLimiter,
    ResponseStream,
    Subscription,
    validate_bucket,
    validate_subject,
)
from shared.clock import SYSTEM_CLOCK, Clock
from shared.errors import BucketNotFound, BusAuthError, BusError, BusTimeout, NoResponders
from shared.natsauth import NatsAuth, process_auth, token_source
from shared.natsdirect import DirectClient
from shared.natskv import NatsKV, NatsKVWatcher, nats_errors
from shared.natslean import websocket_support

logger = logging.getLogger(__name__)

RECONNECT_WAIT_S = 1.0
CONNECTION_ERROR_LOG_INTERVAL_S = 1.0
LEADER_WAIT_S = 10.0
LEADER_POLL_S = 0.1


def _seconds(value: float) -> int:
    # nats-py annotates its timeouts as int but uses them as float seconds
    return cast(int, value)


def _to_msg(m: NatsMsg) -> Msg:
    return Msg(subject=m.subject, data=m.data, reply=m.reply or None, headers=m.headers or None)


class _NatsSubscription:
    __slots__ = ("_guard", "_nc", "_sub")

    def __init__(self, nc: DirectClient, sub: NatsSubscription, guard: HandlerGuard) -> None:
        self._nc = nc
        self._sub = sub
        self._guard = guard

    @property
    def handler_errors(self) -> int:
        return self._guard.errors

    async def unsubscribe(self) -> None:
        self._nc.forget_inline(self._sub)
        await _unsubscribe(self._sub)


async def _unsubscribe(sub: NatsSubscription) -> None:
    # unsubscribing twice, or after the connection closed, is a no-op
    with contextlib.suppress(nats.errors.BadSubscriptionError, nats.errors.ConnectionClosedError):
        await sub.unsubscribe()


class NatsBus:
    """A Bus over one nats-py connection. Create with `await NatsBus.connect(...)`."""

    def __init__(
        self, nc: DirectClient, *, clock: Clock = SYSTEM_CLOCK, unavailable_retry_s: float = 0.0
    ) -> None:
        self.nc = nc
        # how long a KV operation JetStream answers "unavailable" is retried (shared.natskv)
        self.unavailable_retry_s = unavailable_retry_s
        # buckets this connection creates get this many replicas (3 on a 3-node cluster, so a
        # bucket survives losing a node); from $FLEETPULSE_KV_REPLICAS, default 1
        self.kv_replicas = max(1, int(os.environ.get("FLEETPULSE_KV_REPLICAS", "1") or "1"))
        self.js: JetStreamContext = nc.jetstream()
        self.clock = clock
        self._watchers: weakref.WeakSet[NatsKVWatcher] = weakref.WeakSet()
        self._mux_prefix = nc.new_inbox()
        self._mux_sub: NatsSubscription | None = None
        self._mux_lock = asyncio.Lock()
        self._mux_seq = 0
        self._mux_streams: dict[str, QueueResponseStream] = {}
        self.permission_violations = 0
        """Operations the server refused for lack of permission (each is also logged)."""

    def remember(self, watcher: NatsKVWatcher) -> None:
        self._watchers.add(watcher)

    def forget(self, watcher: NatsKVWatcher) -> None:
        self._watchers.discard(watcher)

    def _reconnected(self) -> None:
        for watcher in list(self._watchers):
            watcher.resume_soon()

    @classmethod
    async def connect(
        cls,
        url: str | Sequence[str],
        *,
        name: str,
        auth: NatsAuth | None = None,
        connect_timeout: float = 5,
        reconnect_wait: float = RECONNECT_WAIT_S,
        clock: Clock = SYSTEM_CLOCK,
        unavailable_retry_s: float = 0.0,
    ) -> NatsBus:
        """Connect (BusError if no server answers within `connect_timeout`, BusAuthError at once
        if it refuses the credentials), then reconnect forever. `url` may list several servers,
        as a sequence or comma-separated. `auth` defaults to the process's (`process_auth()`)."""
        servers = [u.strip() for u in url.split(",")] if isinstance(url, str) else list(url)
        websocket_support(servers)  # a replica imported nats-py without aiohttp (natslean.py)
        auth = (auth if auth is not None else process_auth()).validate()
        error_log = RateLimiter(CONNECTION_ERROR_LOG_INTERVAL_S, clock)
        denied_log = RateLimiter(CONNECTION_ERROR_LOG_INTERVAL_S, clock)
        refused = asyncio.Event()

        last_error: list[Exception] = []

        async def on_error(exc: Exception) -> None:
            last_error[:] = [exc]
            text = str(exc)  # nats-py lowercases some server errors
            if "authorization violation" in text.lower() or isinstance(
                exc, nats.errors.AuthorizationError
            ):
                if auth.token_file is not None:
                    # under the auth callout a refusal is also what a client gets while the
                    # auth service is down, and a renewed credential file may fix it: retry
                    if error_log.allow():
                        logger.warning(
                            "nats %s: refused (%s): the auth service may be down, or the "
                            "credential expired; retrying",
                            name,
                            auth.describe(),
                        )
                    return
                refused.set()  # wrong credentials do not get right by retrying
            if "permissions violation" in text.lower():
                bus.permission_violations += 1
                if denied_log.allow():
                    logger.warning("nats %s (%s): %s", name, auth.describe(), text)
            elif error_log.allow():
                logger.warning("nats %s: %s: %s", name, type(exc).__name__, exc)

        async def on_disconnected() -> None:
            if nc.is_closed:  # our own close(): nothing to warn about
                logger.debug("nats %s: disconnected on close", name)
            else:
                logger.warning("nats %s: disconnected", name)
                for stream in bus._mux_streams.values():
                    stream.interrupt()

        async def on_reconnected() -> None:
            logger.info("nats %s: reconnected to %s", name, _connected(nc))
            bus._reconnected()

        async def on_closed() -> None:
            logger.info("nats %s: connection closed", name)

        nc = DirectClient()
        bus = cls(nc, clock=clock, unavailable_retry_s=unavailable_retry_s)
        connecting = asyncio.ensure_future(
            # nats-py retries the first connect forever too when reconnects are unlimited
            nc.connect(
                servers,
                name=name,
                user=auth.user,
                password=auth.secret_password(),
                token=token_source(auth),
                user_credentials=auth.creds,
                inbox_prefix=auth.inbox_prefix or DEFAULT_INBOX_PREFIX,
                tls=_tls_context(servers, auth.tls_ca, auth.tls_cert, auth.tls_key),
                connect_timeout=_seconds(connect_timeout),
                reconnect_time_wait=_seconds(reconnect_wait),
                max_reconnect_attempts=-1,
                error_cb=on_error,
                disconnected_cb=on_disconnected,
                reconnected_cb=on_reconnected,
                closed_cb=on_closed,
            )
        )
        refusal = asyncio.ensure_future(refused.wait())
        try:
            await asyncio.wait(
                (connecting, refusal), timeout=connect_timeout, return_when="FIRST_COMPLETED"
            )
            if not connecting.done():
                connecting.cancel()
                await asyncio.gather(connecting, return_exceptions=True)
                if refused.is_set():
                    raise BusAuthError(
                        f"NATS at {','.join(servers)} refused the credentials "
                        f"({auth.describe()}): Authorization Violation"
                    )
                why = f" (last error: {type(last_error[0]).__name__}: {last_error[0]})"
                raise TimeoutError("no server answered" + (why if last_error else ""))
            connecting.result()
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            with contextlib.suppress(Exception):
                await nc.close()
            raise BusError(
                f"cannot connect to NATS at {','.join(servers)} within {connect_timeout:g}s: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        except BusAuthError:
            with contextlib.suppress(Exception):
                await nc.close()
            raise
        finally:
            refusal.cancel()
        logger.info("nats %s: connected to %s", name, _connected(nc))
        return bus

    @property
    def max_payload(self) -> int:
        return self.nc.max_payload

    def new_inbox(self) -> str:
        return self.nc.new_inbox()

    def _check_payload(self, subject: str, data: bytes) -> None:
        if len(data) > self.max_payload:
            raise MaxPayloadExceeded(subject, len(data), self.max_payload)

    async def publish(
        self,
        subject: str,
        data: bytes,
        *,
        reply: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        validate_subject(subject, wildcards=False)
        self._check_payload(subject, data)
        with nats_errors(f"publish to {subject!r}"):
            await self.nc.publish(
                subject, data, reply=reply or "", headers=dict(headers) if headers else None
            )

    def publish_nowait(self, subject: str, data: bytes, *, reply: str | None = None) -> None:
        validate_subject(subject, wildcards=False)
        self._check_payload(subject, data)
        self._publish_soon(subject, data, reply or "")

    def _publish_soon(self, subject: str, data: bytes, reply: str) -> None:
        try:  # not nats_errors(): a generator context costs more than this whole call
            self.nc.publish_soon(subject, data, reply)
        except nats.errors.Error as exc:
            raise BusError(f"publish to {subject!r}: {type(exc).__name__}: {exc}") from exc

    async def subscribe(
        self, subject: str, handler: Handler, *, queue: str | None = None
    ) -> Subscription:
        validate_subject(subject, wildcards=True)
        guard = HandlerGuard(subject, handler, self.clock)

        async def callback(m: NatsMsg) -> None:
            await guard(_to_msg(m))

        with nats_errors(f"subscribe to {subject!r}"):
            sub = await self.nc.subscribe(subject, queue=queue or "", cb=callback)
        return _NatsSubscription(self.nc, sub, guard)

    async def subscribe_inline(
        self, subject: str, handler: InlineHandler, *, queue: str | None = None
    ) -> Subscription:
        """Messages without headers reach `handler` from the reader (natsdirect.py), in order.
        The rest take the subscription's task: messages with headers (rare: a user's, a
        status), and any that arrive while this call is still registering the subscription;
        those may be handled after later inline ones (independent requests, for the replica;
        a reply inbox subscribes before its first request goes out)."""
        validate_subject(subject, wildcards=True)
        guard = InlineGuard(subject, handler, self.clock)

        async def callback(m: NatsMsg) -> None:
            await guard(_to_msg(m))

        def now(subject: str, reply: str, data: bytes) -> None:
            guard.now(Msg(subject, data, reply or None, None))

        with nats_errors(f"subscribe to {subject!r}"):
            sub = await self.nc.subscribe(subject, queue=queue or "", cb=callback)
        self.nc.inline(sub, now)
        return _NatsSubscription(self.nc, sub, guard)

    async def request(
        self,
        subject: str,
        data: bytes,
        *,
        timeout: float,  # noqa: ASYNC109 - NATS-style API: the timeout is the request's
        headers: Mapping[str, str] | None = None,
    ) -> Msg:
        validate_subject(subject, wildcards=False)
        self._check_payload(subject, data)
        try:
            m = await self.nc.request(
                subject, data, timeout=timeout, headers=dict(headers) if headers else None
            )
        except nats.errors.NoRespondersError:
            raise NoResponders(f"no responders on {subject!r}") from None
        except (nats.errors.TimeoutError, TimeoutError):
            raise BusTimeout(f"no reply on {subject!r} within {timeout:g}s") from None
        except nats.errors.Error as exc:
            raise BusError(f"request to {subject!r}: {type(exc).__name__}: {exc}") from exc
        return _to_msg(m)

    async def request_stream(
        self, subject: str, data: bytes, *, headers: Mapping[str, str] | None = None
    ) -> ResponseStream:
        """Replies arrive on `{mux prefix}.{token}`: one wildcard subscription per connection
        serves every stream, so a request costs no SUB/UNSUB round and no task of its own."""
        validate_subject(subject, wildcards=False)
        self._check_payload(subject, data)
        if self._mux_sub is None:
            await self._start_mux()
        self._mux_seq += 1
        token = str(self._mux_seq)
        stream = QueueResponseStream(subject)
        self._mux_streams[token] = stream

        async def close() -> None:
            self._mux_streams.pop(token, None)

        stream.attach(close)
        reply = f"{self._mux_prefix}.{token}"
        try:
            if headers:
                await self.publish(subject, data, reply=reply, headers=headers)
            else:
                self._publish_soon(subject, data, reply)
        except BaseException:
            await stream.close()
            raise
        return stream

    async def _start_mux(self) -> None:
        async with self._mux_lock:
            if self._mux_sub is not None:
                return

            async def dispatch(m: NatsMsg) -> None:  # a status ("no responders") or headers
                stream = self._mux_streams.get(m.subject.rpartition(".")[2])
                if stream is not None:
                    stream.push_nowait(_to_msg(m))

            def dispatch_now(subject: str, reply: str, data: bytes) -> None:
                stream = self._mux_streams.get(subject.rpartition(".")[2])
                if stream is not None:
                    stream.push_nowait(Msg(subject, data, reply or None, None))

            with nats_errors("response inbox"):
                self._mux_sub = await self.nc.subscribe(f"{self._mux_prefix}.*", cb=dispatch)
                self.nc.inline(self._mux_sub, dispatch_now)
                # the interest must be on the server before the first request goes out
                await self.flush()

    async def kv(
        self, bucket: str, *, history: int = 1, ttl: float | None = None, create: bool = True
    ) -> KV:
        """Bind to `bucket`, creating it (with `history` and `ttl`) when missing and `create`."""
        validate_bucket(bucket, history, ttl)
        with nats_errors(f"KV bucket {bucket!r}"):
            try:
                kv = await self.js.key_value(bucket)
            except nats.js.errors.BucketNotFoundError:
                if not create:
                    raise BucketNotFound(bucket) from None
                try:
                    kv = await self.js.create_key_value(
                        bucket=bucket, history=history, ttl=ttl, replicas=self.kv_replicas
                    )
                except nats.js.errors.BadRequestError:
                    # someone else created it between our two calls
                    kv = await self.js.key_value(bucket)
            await self._until_led(f"KV_{bucket}")
            return NatsKV(self, bucket, kv)

    async def _until_led(self, stream: str) -> None:
        """Return once a replicated stream has a leader. A bucket created a moment ago with
        three replicas answers writes with "no response from stream" until its group elects
        one; waiting here spares every caller from retrying its first put."""
        deadline = self.clock.monotonic() + LEADER_WAIT_S
        while True:
            info = await self.js.stream_info(stream)
            if info.cluster is None or info.cluster.leader or self.clock.monotonic() > deadline:
                return  # not clustered, led, or let the caller's own retries take over
            await asyncio.sleep(LEADER_POLL_S)

    async def flush(self, timeout: float = 5.0) -> None:  # noqa: ASYNC109
        """Return once the server has processed everything this connection sent so far."""
        if not self.nc.is_connected:
            state = "closed" if self.nc.is_closed else "reconnecting"
            raise BusError(f"flush: the NATS connection is {state}")
        with nats_errors("flush"):
            # nats-py writes its PING straight to the socket, ahead of commands still in its
            # write buffer (a SUB just made, recent PUBs), so its PONG alone proves nothing
            # about them: first wait until the buffer is written (private API, nats-py < 3).
            await asyncio.wait_for(self.nc._flush_pending(force_flush=True), timeout)
            await self.nc.flush(_seconds(timeout))

    async def close(self) -> None:
        for watcher in list(self._watchers):
            await watcher.stop()
        with contextlib.suppress(nats.errors.Error):
            await self.nc.close()


def _connected(nc: DirectClient) -> str:
    uri = nc.connected_url
    return uri.geturl() if uri is not None else "?"


def _tls_context(
    servers: Sequence[str], ca: str | None, cert: str | None, key: str | None
) -> ssl.SSLContext | None:
    if not (ca or cert or any(s.startswith("tls://") for s in servers)):
        return None
    ctx = ssl.create_default_context(cafile=ca)
    if cert:
        ctx.load_cert_chain(cert, key)
    return ctx


if TYPE_CHECKING:  # mypy proves the adapters satisfy the protocols
    _BUS: type[Bus] = NatsBus
    _SUBSCRIPTION: type[Subscription] = _NatsSubscription

"""The router gateway: callers in any language reach a deployment with a plain NATS request.

    nats req fp.v1.call.shop.cart 'payload' -H 'Fp-Path: /checkout'

How it works: a NATS micro service named "fleetpulse-router" (so `$SRV.PING`, `$SRV.INFO` and
`$SRV.STATS` discover it) with one endpoint on `fp.v1.call.*.*` in queue group "fp-gateway", so
any number of gateways share the load. Each request runs on its own task (a slow deployment must
not hold up the others) through the process-wide router of its deployment (handle.py), as an
HTTP-style request (`body_kind` "http", unary):

- request: the payload is the body; every NATS header is passed through into
  `HttpRequest.headers`. The HTTP method is "POST" and the path "/" unless the headers
  `Fp-Http-Method`, `Fp-Path` (and `Fp-Query`) say otherwise; `Fp-Method` names the deployment
  method (default `__call__`); `Fp-Deadline-S` sets the deadline in seconds (default: the
  gateway's `--deadline`). A caller's own deadline is its client timeout too, so the gateway
  gives up `reply_margin(d)` earlier and its 504 arrives while the caller still listens.
- reply: the `HttpResponse` body as the payload, its status in the `Fp-Status` header, its
  headers as NATS headers (repeats joined with ", "; names NATS cannot carry are dropped).
- failure: a micro-service error reply, headers `Nats-Service-Error-Code` (an HTTP-like code,
  e.g. 503 or 504) and `Nats-Service-Error` (the description), plus `Fp-Error` (a stable token
  such as `backpressure`, `deadline_exceeded`, `user_error`) and `Fp-Retryable`. A request is
  never left to time out silently while the gateway runs. Error replies count in the endpoint's
  `$SRV.STATS` (`num_errors`, `last_error`): the micro library counts only handlers that raise,
  and ours hands each request to a task and returns at once.

Routers are created on first use per deployment, at most `MAX_DEPLOYMENTS` of them. On SIGTERM or
SIGINT the gateway stops taking requests, lets in-flight ones finish for `drain_timeout_s`,
answers the rest with a 503 error, and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from nats.micro import add_service
from nats.micro.request import Request as MicroRequest
from nats.micro.service import Service

from services.router.config import (
    GATEWAY_SERVICE_NAME,
    GATEWAY_SERVICE_VERSION,
    GatewayConfig,
)
from services.router.errors import RouterError
from services.router.handle import DEFAULT_METHOD, release_router, shared_router
from services.router.http import (
    HDR_DEADLINE,
    HDR_ERROR,
    HDR_RETRYABLE,
    call_http,
    failure_of,
    parse_deadline,
    response_header_items,
)
from services.router.router import Router
from shared.bus import Bus
from shared.clock import SYSTEM_CLOCK, Clock
from shared.errors import BusError, UsageError, WireError
from shared.metrics_catalog import serve_metrics
from shared.natsbus import NatsBus
from shared.signals import on_stop_signals
from shared.subjects import Subjects
from shared.wire.messages import HttpRequest, HttpResponse

logger = logging.getLogger(__name__)

HDR_METHOD: Final = "Fp-Method"
HDR_HTTP_METHOD: Final = "Fp-Http-Method"
HDR_PATH: Final = "Fp-Path"
HDR_QUERY: Final = "Fp-Query"
HDR_STATUS: Final = "Fp-Status"
ENDPOINT_NAME: Final = "call"
REPLY_MARGIN_MAX_S: Final = 0.25
REPLY_MARGIN_FRACTION: Final = 0.1
MAX_DEPLOYMENTS: Final = 10_000
"""Routers one gateway keeps (each watches a KV key and reports): a bound against junk names."""


@dataclass(frozen=True, slots=True)
class GatewayReply:
    """What to answer: a result, or an error (then `error_code` is set)."""

    data: bytes
    headers: dict[str, str] = field(default_factory=dict)
    error_code: str | None = None
    error: str = ""


def reply_margin(deadline_s: float) -> float:
    """How much earlier than a caller-sent deadline the gateway gives up: time for its error
    reply to travel back (a tenth of the deadline, at most a quarter second)."""
    return min(REPLY_MARGIN_MAX_S, deadline_s * REPLY_MARGIN_FRACTION)


def error_reply(code: str, token: str, description: str, retryable: bool) -> GatewayReply:
    return GatewayReply(
        b"",
        {HDR_ERROR: token, HDR_RETRYABLE: "true" if retryable else "false"},
        code,
        description,
    )


class GatewayCore:
    """Turns one call-subject request into a reply; no NATS-micro specifics (unit-testable)."""

    def __init__(self, bus: Bus, config: GatewayConfig, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.bus = bus
        self.config = config
        self.clock = clock
        self.subjects = Subjects(config.namespace)
        self.routers: dict[tuple[str, str], Router] = {}

    def router(self, app: str, deployment: str) -> Router:
        router = self.routers.get((app, deployment))
        if router is None:
            if len(self.routers) >= MAX_DEPLOYMENTS:
                raise UsageError(f"this gateway already serves {MAX_DEPLOYMENTS} deployments")
            router = shared_router(
                self.bus,
                app,
                deployment,
                config=self.config.router,
                clock=self.clock,
                subjects=self.subjects,
            )
            self.routers[(app, deployment)] = router
        return router

    async def handle(
        self, subject: str, data: bytes, headers: Mapping[str, str] | None
    ) -> GatewayReply:
        try:
            app, deployment = self.subjects.parse_call(subject)
            hdrs = dict(headers or {})
            sent = hdrs.get(HDR_DEADLINE)
            deadline_s = parse_deadline(sent, self.config.deadline_s)
            if sent is not None and deadline_s is not None:
                deadline_s -= reply_margin(deadline_s)
            request = HttpRequest(
                method=hdrs.get(HDR_HTTP_METHOD, "POST"),
                path=hdrs.get(HDR_PATH, "/"),
                query=hdrs.get(HDR_QUERY, ""),
                headers=tuple(hdrs.items()),
                body=data,
            )
            router = self.router(app, deployment)
        except UsageError as exc:
            return error_reply("400", "bad_request", str(exc), False)
        try:
            response = await call_http(
                router,
                request,
                method=hdrs.get(HDR_METHOD, DEFAULT_METHOD),
                deadline_s=deadline_s,
            )
        except (RouterError, WireError, BusError) as exc:
            failure = failure_of(exc)
            return error_reply(
                str(failure.status), failure.token, failure.message, failure.retryable
            )
        return GatewayReply(response.body, _response_headers(response))

    async def close(self) -> None:
        routers, self.routers = list(self.routers.values()), {}
        for router in routers:
            await release_router(router)


def _response_headers(response: HttpResponse) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in response_header_items(response):
        out[name] = f"{out[name]}, {value}" if name in out else value
    out[HDR_STATUS] = str(response.status)
    return out


class Gateway:
    """The micro-service shell around `GatewayCore`."""

    def __init__(self, bus: NatsBus, config: GatewayConfig, *, clock: Clock = SYSTEM_CLOCK):
        self.bus = bus
        self.config = config
        self.core = GatewayCore(bus, config, clock=clock)
        self.service: Service | None = None
        self.errors = 0
        """Error replies sent (also in `$SRV.STATS`)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False

    async def start(self) -> None:
        self.service = await add_service(
            self.bus.nc,
            name=GATEWAY_SERVICE_NAME,
            version=GATEWAY_SERVICE_VERSION,
            description="fleetpulse router gateway: requests on "
            f"{self.core.subjects.call_wildcard()}",
            queue_group=self.config.queue_group,
        )
        await self.service.add_endpoint(
            name=ENDPOINT_NAME,
            subject=self.core.subjects.call_wildcard(),
            handler=self._on_request,
            queue_group=self.config.queue_group,
            metadata={"namespace": self.config.namespace},
        )
        await self.bus.flush()
        logger.info(
            "gateway: serving %s (queue group %s)",
            self.core.subjects.call_wildcard(),
            self.config.queue_group,
        )

    async def _on_request(self, req: MicroRequest) -> None:
        # one task per request: the endpoint's subscription delivers one message at a time
        task = asyncio.get_running_loop().create_task(self._serve(req))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, req: MicroRequest) -> None:
        try:
            reply = await self.core.handle(req.subject, req.data, req.headers)
        except asyncio.CancelledError:
            reply = error_reply("503", "shutting_down", "the gateway is shutting down", True)
        except Exception as exc:  # never leave a caller to time out silently
            logger.exception("gateway: request on %s failed", req.subject)
            reply = error_reply("500", "internal", f"{type(exc).__name__}: {exc}", True)
        if reply.error_code is not None:
            self._count_error(reply)
        await _respond(req, reply)

    def _count_error(self, reply: GatewayReply) -> None:
        self.errors += 1
        # nats.py's Endpoint keeps its stats in private fields (it counts only handlers that
        # raise); tests/integration/test_router_gateway.py catches a library change
        for endpoint in getattr(self.service, "_endpoints", ()):
            if hasattr(endpoint, "_num_errors"):
                endpoint._num_errors += 1
                endpoint._last_error = f"{reply.error_code}: {_one_line(reply.error, 256)}"

    async def stop(self) -> None:
        """Stop taking requests, drain in-flight ones, then release everything."""
        if self._stopping:
            return
        self._stopping = True
        if self.service is not None:
            with contextlib.suppress(Exception):
                await self.service.stop()
        if self._tasks:
            _, pending = await asyncio.wait(list(self._tasks), timeout=self.config.drain_timeout_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        await self.core.close()


async def _respond(req: MicroRequest, reply: GatewayReply) -> None:
    try:
        if reply.error_code is not None:
            await req.respond_error(reply.error_code, _one_line(reply.error), headers=reply.headers)
        else:
            await req.respond(reply.data, headers=reply.headers or None)
    except ValueError:
        return  # published without a reply subject: fire and forget
    except Exception as exc:  # e.g. the result is over max_payload: say so instead
        logger.warning("gateway: reply on %s failed: %s: %s", req.subject, type(exc).__name__, exc)
        with contextlib.suppress(Exception):
            await req.respond_error("500", _one_line(f"reply failed: {type(exc).__name__}: {exc}"))


def _one_line(text: str, limit: int = 1024) -> str:
    return " ".join(text.split())[:limit]


async def serve(config: GatewayConfig, *, stop: asyncio.Event | None = None, **kw: Any) -> int:
    """Connect, serve until `stop` is set (or SIGTERM/SIGINT), then shut down gracefully."""
    bus = await NatsBus.connect(config.nats_url, name="fleetpulse-router")
    serve_metrics(config.metrics_port, "gateway")
    gateway = Gateway(bus, config, **kw)
    stop = stop or asyncio.Event()
    try:
        with on_stop_signals(stop.set):
            await gateway.start()
            await stop.wait()
            logger.info("gateway: stopping (%d requests in flight)", len(gateway._tasks))
            await gateway.stop()
    finally:
        await bus.close()
    return 0

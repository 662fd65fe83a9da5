"""`ProxyServer`: the HTTP ingress. Routes by app route prefix to the app's ingress deployment.

How it works, per request:

1. Match the path to an app (registry.RouteTable: longest route prefix, whole segments). No app:
   404. A known app that is not registered (the serviceability rule says it cannot serve): 503
   with Retry-After and a body saying why (crashed, starting, being deleted, ...).
2. Take the process-wide router of the app's ingress deployment (`shared_router`, one per
   deployment, the one `DeploymentHandle`s use) and send an `HttpRequest` (body kind "http")
   through it. If the router has no replica, the request is *held* (holding.py): at most
   `max_held_per_app` per app, and it waits in the router's queue, whose cold-start report wakes
   the deployment. Every request waits at most `max_wait_s` for a replica to admit it; then 503
   with Retry-After. A held request whose app is deregistered meanwhile gets its 503 (with the
   reason) at once.
3. Chunk 0 is the response head. If `End` follows, the response is sent whole (Content-Length);
   if more chunks follow (the user code is a generator), the response is streamed with chunked
   encoding, one write per chunk. A stream that breaks after the head was sent cannot change its
   status any more: the connection is closed without the final chunk, so the client sees a
   truncated response rather than a silently short one.

With the HAProxy front door (`front="haproxy"`, the default) the public port is HAProxy's
(haproxy.py): it sends requests straight to the replicas that serve HTTP, and everything else
here, to a loopback port: the proxy's own paths, unknown paths, apps that cannot serve, and apps
with no replica yet (held here while they wake, forwarded over NATS).

The mapping of requests and responses (what passes through, what is added) is mapping.py,
documented in docs/proxy.md.
`/-/healthz`, `/-/routes` and `/metrics` are the proxy's own; every other path is routed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from services.proxy.config import INTERNAL_HOST, MAX_HEADER_OVERHEAD_BYTES, ProxyConfig
from services.proxy.haproxy import FrontDoor, listen, url_of
from services.proxy.holding import Hold, Holds
from services.proxy.mapping import to_http_request, to_response_headers
from services.proxy.metrics import NO_APP, ProxyMetrics
from services.proxy.registry import Route, RouteTable
from services.proxy.watch import RegistryWatch
from services.router.call import ResponseReader
from services.router.errors import RouterError
from services.router.handle import DEFAULT_METHOD, release_router, shared_router
from services.router.http import (
    HDR_DEADLINE,
    HDR_ERROR,
    HDR_RETRYABLE,
    HttpFailure,
    failure_of,
    parse_deadline,
    read_head,
    send_http,
)
from services.router.router import Router
from shared.bus import Bus
from shared.clock import SYSTEM_CLOCK, Clock
from shared.errors import BusError, UsageError, WireError
from shared.subjects import Subjects
from shared.wire.messages import HttpResponse

logger = logging.getLogger(__name__)

HEALTHZ_PATH: Final = "/-/healthz"
ROUTES_PATH: Final = "/-/routes"
METRICS_PATH: Final = "/metrics"
Call = Callable[[], Awaitable[ResponseReader]]


class ProxyServer:
    def __init__(self, bus: Bus, config: ProxyConfig, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.bus = bus
        self.config = config
        self.clock = clock
        self.subjects = Subjects(config.namespace)
        self.metrics = ProxyMetrics()
        self.holds = Holds(config.max_held_per_app)
        self.registry = RegistryWatch(
            bus,
            publish=config.publish_routes,
            on_change=self._on_routes,
            on_publish_error=self.metrics.publish_errors.inc,
            clock=clock,
        )
        self.routers: dict[str, Router] = {}
        """app -> the router of its ingress deployment."""
        self._router_config = config.router_config
        self.app = self._build_app()
        self.url = ""
        """`http://host:port` once started: the public one (HAProxy's, with the front door)."""
        self.internal_url = ""
        """Where this Python proxy listens (the same as `url` without the front door)."""
        self.front: FrontDoor | None = None
        self._runner: web.AppRunner | None = None
        self._releasing: set[asyncio.Task[None]] = set()

    def _build_app(self) -> web.Application:
        max_body = max(0, self.bus.max_payload - MAX_HEADER_OVERHEAD_BYTES)
        app = web.Application(client_max_size=max_body)
        app.router.add_get(HEALTHZ_PATH, self._healthz)
        app.router.add_get(ROUTES_PATH, self._routes)
        app.router.add_get(METRICS_PATH, self._metrics)
        app.router.add_route("*", "/{tail:.*}", self._proxy)
        return app

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        fronted = self.config.front == "haproxy"
        public = (
            listen(self.config.host, self.config.port, self.config.backlog) if fronted else None
        )
        await self.registry.start()
        runner = web.AppRunner(
            self.app, access_log=None, shutdown_timeout=self.config.drain_timeout_s
        )
        await runner.setup()
        self._runner = runner
        site = web.TCPSite(
            runner,
            INTERNAL_HOST if fronted else self.config.host,
            0 if fronted else self.config.port,
            backlog=self.config.backlog,
        )
        await site.start()
        host, port = runner.addresses[0][:2]
        self.url = f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}"
        self.internal_url = self.url
        if public is not None:
            public_url = url_of(public)
            try:
                self.front = FrontDoor(
                    self.bus,
                    routes=self._front_routes,
                    python_host=host,
                    python_port=port,
                    queue_timeout_s=self.config.max_wait_s,
                    retry_after_s=self.config.retry_after_s,
                    default_max_queued=self._router_config.max_queued_requests,
                    drain_timeout_s=self.config.drain_timeout_s,
                    metrics=self.metrics,
                    clock=self.clock,
                )
                await self.front.start(public)
            finally:
                public.close()  # HAProxy holds its own copy
            self.url = public_url
        logger.info("proxy: listening on %s", self.url)

    def _front_routes(self) -> RouteTable | None:
        return self.registry.table if self.registry.ready.is_set() else None

    async def stop(self) -> None:
        """Stop listening, let in-flight requests finish for `drain_timeout_s`, release all."""
        if self.front is not None:
            front, self.front = self.front, None
            await front.stop()  # stops accepting; what it already forwarded here finishes
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        await self.registry.stop()
        routers, self.routers = list(self.routers.values()), {}
        for router in routers:
            await release_router(router)
        if self._releasing:
            await asyncio.gather(*self._releasing, return_exceptions=True)

    # -- registry changes -------------------------------------------------------------------------

    def _on_routes(self, old: RouteTable, new: RouteTable) -> None:
        if self.front is not None:
            self.front.routes_changed()
        for app, before in old.routes.items():
            after = new.routes.get(app)
            if after is None:
                logger.info("proxy: app %s removed from the registry", app)
                self.holds.release_app(app, f"application {app!r} was deleted", known=False)
                self._release(app)
                continue
            if after.registered != before.registered:
                self._log_change(after)
            if not after.registered:
                self.holds.release_app(app, after.reason)
            if after.ingress != before.ingress:
                self._release(app)
        for app, after in new.routes.items():
            if app not in old.routes:
                if after.registered:
                    self._log_change(after)
                else:
                    logger.info("proxy: app %s known, not registered (%s)", app, after.reason)
        self.metrics.set_registry(old, new)

    def _log_change(self, route: Route) -> None:
        to = "registered" if route.registered else "deregistered"
        self.metrics.registry_changes.labels(route.app, to).inc()
        logger.info("proxy: app %s %s (%s)", route.app, to, route.reason)

    def _release(self, app: str) -> None:
        router = self.routers.pop(app, None)
        if router is not None:
            task = asyncio.get_running_loop().create_task(release_router(router))
            self._releasing.add(task)
            task.add_done_callback(self._releasing.discard)

    def _router(self, route: Route) -> Router:
        router = self.routers.get(route.app)
        if router is None or router.closed:
            assert route.ingress is not None  # a registered route has one
            router = shared_router(
                self.bus,
                route.app,
                route.ingress,
                config=self._router_config,
                clock=self.clock,
                subjects=self.subjects,
            )
            self.routers[route.app] = router
        return router

    # -- the proxy's own endpoints ------------------------------------------------------------------

    async def _healthz(self, request: web.Request) -> web.Response:
        table = self.registry.table
        ready = self.registry.ready.is_set()
        doc = {
            "status": "ok" if ready else "starting",
            "apps": len(table.routes),
            "registered": table.registered,
            "held": self.holds.total,
        }
        return _json(200 if ready else 503, doc)

    async def _routes(self, request: web.Request) -> web.Response:
        table = self.registry.table
        apps = {
            app: {**route.to_doc(), "held": self.holds.held(app)}
            for app, route in sorted(table.routes.items())
        }
        return _json(200, {"ready": self.registry.ready.is_set(), "apps": apps})

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    # -- proxying -----------------------------------------------------------------------------------

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        start = self.clock.monotonic()
        app, code = NO_APP, 500
        try:
            route = (
                self.registry.table.match(request.path) if self.registry.ready.is_set() else None
            )
            app = route.app if route is not None else NO_APP
            response = await self._serve(request, route)
            code = response.status
            return response
        except web.HTTPException as exc:  # e.g. 413 from reading an oversized body
            code = exc.status
            raise
        finally:
            self.metrics.observe(app, code, self.clock.monotonic() - start)

    async def _serve(self, request: web.Request, route: Route | None) -> web.StreamResponse:
        if route is None:
            if not self.registry.ready.is_set():
                return self._unavailable(None, "starting", "the proxy is loading its registry")
            return _error(404, None, "not_found", f"no application serves {request.path}", False)
        if not route.registered:
            token = "app_down" if route.down else "app_unavailable"
            return self._unavailable(route, token, f"{route.app}: {route.reason}")
        try:
            deadline_s = parse_deadline(
                request.headers.get(HDR_DEADLINE), self.config.request_timeout_s
            )
        except UsageError as exc:
            return _error(400, route, "bad_request", str(exc), False)
        http_request = to_http_request(
            request, route, await request.read(), behind_front=self.front is not None
        )
        router = self._router(route)
        call = functools.partial(
            send_http,
            router,
            http_request,
            method=DEFAULT_METHOD,
            deadline_s=deadline_s,
            stream=True,  # lets the router pump health frames while a slow client reads
        )
        try:
            admitted = await self._admit(route, router, call)
            if isinstance(admitted, web.Response):
                return admitted
            head = await read_head(admitted)
            return await self._respond(request, route, head, admitted)
        except (RouterError, WireError, BusError) as exc:
            return self._failure(route, failure_of(exc))

    async def _admit(
        self, route: Route, router: Router, call: Call
    ) -> ResponseReader | web.Response:
        """A replica admitted the request (its reader), or the response to answer instead."""
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self.config.max_wait_s
        try:
            async with asyncio.timeout_at(give_up_at):
                await router.wait_ready()
        except TimeoutError:
            return self._wait_exceeded(route)
        held = not router.members  # at zero: this request waits for the wake-up
        hold = self.holds.enter(route.app, held=held)
        if hold is None:
            self.metrics.held_outcomes.labels(route.app, "full").inc()
            return self._unavailable(
                route,
                "hold_queue_full",
                f"{route.app} is waking up and already holds "
                f"{self.config.max_held_per_app} requests",
            )
        gauge = self.metrics.held.labels(route.app) if held else None
        if gauge is not None:
            gauge.inc()
        try:
            # deregistered while we waited for the membership? Later changes resolve the hold.
            now = self.registry.table.routes.get(route.app)
            if now is None:
                return _error(404, route, "not_found", f"{route.app} was deleted", False)
            if not now.registered:
                return self._unavailable(route, "app_unavailable", f"{route.app}: {now.reason}")
            return await self._wait(route, hold, call, give_up_at - loop.time())
        finally:
            if gauge is not None:
                gauge.dec()
            hold.release()

    async def _wait(
        self, route: Route, hold: Hold, call: Call, wait_s: float
    ) -> ResponseReader | web.Response:
        """Wait for a replica to admit the request, for the app to be lost, or for the bound."""
        sent = asyncio.ensure_future(call())
        try:
            await asyncio.wait(
                (sent, hold.gone), timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            if not sent.done():
                sent.cancel()
                sent.add_done_callback(_close_unclaimed)
        if sent.done() and not sent.cancelled() and sent.exception() is None:
            self._held_outcome(hold, "admitted")
            return sent.result()
        if hold.gone.done():
            # before a failed call: losing the app also closes its router, failing the call
            self._held_outcome(hold, "deregistered")
            gone = hold.gone.result()
            if not gone.known:
                return _error(404, route, "not_found", gone.reason, False)
            return self._unavailable(route, "app_unavailable", f"{route.app}: {gone.reason}")
        if sent.done() and not sent.cancelled():
            self._held_outcome(hold, "failed")
            return sent.result()  # raises what the call raised
        self._held_outcome(hold, "timeout")
        return self._wait_exceeded(route)

    def _held_outcome(self, hold: Hold, outcome: str) -> None:
        if hold.held:
            self.metrics.held_outcomes.labels(hold.app, outcome).inc()

    async def _respond(
        self, request: web.Request, route: Route, head: HttpResponse, reader: ResponseReader
    ) -> web.StreamResponse:
        try:
            if not 100 <= head.status <= 599:
                raise WireError("bad_status", f"HTTP status {head.status} from the deployment")
            headers = to_response_headers(head)
            # a head saying more follows is streamed at once; else read on to see if it is all
            following = None if head.more else await reader.next_chunk()
            if following is None and not head.more:
                return web.Response(status=head.status, headers=headers, body=head.body)
            response = web.StreamResponse(status=head.status, headers=headers)
            await response.prepare(request)
        except BaseException:
            await reader.close()
            raise
        try:
            if head.body:
                await response.write(head.body)
            if head.more:
                following = await reader.next_chunk()
            while following is not None:
                await response.write(following.data)
                following = await reader.next_chunk()
        except ConnectionError:
            return response  # the client went away; nothing more to send
        except (RouterError, WireError, BusError) as exc:
            self.metrics.stream_errors.labels(route.app).inc()
            logger.warning("proxy: stream of %s broke after the head: %s", route.app, exc)
            if request.transport is not None:
                request.transport.close()  # no final chunk: the client sees the truncation
            return response
        finally:
            await reader.close()
        await response.write_eof()
        return response

    # -- errors ------------------------------------------------------------------------------------

    def _unavailable(self, route: Route | None, token: str, message: str) -> web.Response:
        response = _error(503, route, token, message, True)
        response.headers["Retry-After"] = str(self.config.retry_after_s)
        return response

    def _wait_exceeded(self, route: Route) -> web.Response:
        return self._unavailable(
            route,
            "no_replica",
            f"no replica of {route.app} could take the request within {self.config.max_wait_s:g} s",
        )

    def _failure(self, route: Route, failure: HttpFailure) -> web.Response:
        if failure.status == 503:
            return self._unavailable(route, failure.token, failure.message)
        return _error(failure.status, route, failure.token, failure.message, failure.retryable)


_CLOSING: set[asyncio.Task[None]] = set()
"""Readers being closed in the background (a task nobody references may be collected)."""


def _close_unclaimed(task: asyncio.Future[ResponseReader]) -> None:
    """A call given up on may still have been admitted: close its reader, or the request
    would stay counted as in flight at that replica."""
    if task.cancelled() or task.exception() is not None:
        return
    closing = asyncio.get_running_loop().create_task(task.result().close())
    _CLOSING.add(closing)
    closing.add_done_callback(_CLOSING.discard)


def _json(status: int, doc: Any) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps(doc, sort_keys=True).encode(),
        content_type="application/json",
    )


def _error(
    status: int, route: Route | None, token: str, message: str, retryable: bool
) -> web.Response:
    doc = {
        "error": token,
        "message": message,
        "app": route.app if route else None,
        "retryable": retryable,
    }
    response = _json(status, doc)
    response.headers[HDR_ERROR] = token
    response.headers[HDR_RETRYABLE] = "true" if retryable else "false"
    return response


async def serve_until(
    server: ProxyServer, stop: asyncio.Event, on_started: Callable[[str], None] | None = None
) -> None:
    """Start `server`, run until `stop` is set, then stop it (draining in-flight requests)."""
    await server.start()
    try:
        if on_started is not None:
            on_started(server.url)
        await stop.wait()
    finally:
        with contextlib.suppress(Exception):
            await server.stop()

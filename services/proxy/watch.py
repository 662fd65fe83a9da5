"""The live registry: KV fp_status and fp_apps in, a `RouteTable` out, and KV fp_routes written.

How it works: both buckets are mirrored with `shared.kvfollow.follow` (a KV watch: every
current value, then each change), into dicts that signal every change. One loop rebuilds the
route table (registry.build_routes, pure) whenever either changed, swaps it in, hands old and new
to the `on_change` callback (the server wakes held requests, releases routers, logs and counts),
and publishes the routes that changed to fp_routes.

- Nothing is built before both buckets delivered their current values (`ready`): a half-loaded
  registry would answer 404 for apps that exist.
- A watch that fails is re-established into a fresh dict, swapped in only once it holds the
  bucket's current values again, so values deleted while it was down do not linger and the
  registry never flickers to empty.
- Publishing writes a key only when its value differs from the one in the bucket (values carry
  no timestamps, so proxies that agree write nothing) and deletes keys of apps no longer known.
  A failed write is retried every `PUBLISH_RETRY_S`; routing never waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Final, TypeVar

from services.proxy.registry import KV_ROUTES, RouteTable, build_routes
from shared.appconfig import AppConfig
from shared.bus import KV, Bus, RateLimiter
from shared.clock import SYSTEM_CLOCK, Clock
from shared.errors import BusError
from shared.kv.status import AppStatusView
from shared.kvfollow import follow
from shared.subjects import KV_APPS, KV_STATUS

logger = logging.getLogger(__name__)

WATCH_RETRY_S: Final = 0.5
"""Pause before re-establishing a failed watch, and between looks for a bucket not created yet."""
PUBLISH_RETRY_S: Final = 2.0
ERROR_LOG_INTERVAL_S: Final = 30.0

V = TypeVar("V")


class SignallingDict(dict[str, V]):
    """A dict that calls `on_change` whenever `follow` writes to it."""

    def __init__(self, on_change: Callable[[], None]) -> None:
        super().__init__()
        self._on_change = on_change

    def __setitem__(self, key: str, value: V) -> None:
        super().__setitem__(key, value)
        self._on_change()

    def pop(self, key: str, default: V | None = None) -> V | None:  # type: ignore[override]
        self._on_change()
        return super().pop(key, default)


class RegistryWatch:
    def __init__(
        self,
        bus: Bus,
        *,
        publish: bool = True,
        on_change: Callable[[RouteTable, RouteTable], None] | None = None,
        on_publish_error: Callable[[], None] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.bus = bus
        self.publish = publish
        self.on_change = on_change
        self.on_publish_error = on_publish_error
        self.table = RouteTable({})
        self.ready = asyncio.Event()
        """Set once the first table was built from both buckets."""
        self.bad: dict[str, str] = {}
        """`bucket/key` -> why its value was ignored."""
        self.statuses: dict[str, AppStatusView] = {}
        self.apps: dict[str, AppConfig] = {}
        self._changed = asyncio.Event()
        self._published: dict[str, bytes] | None = None
        self._routes_kv: KV | None = None
        self._errors = RateLimiter(ERROR_LOG_INTERVAL_S, clock)
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        status_ready, apps_ready = asyncio.Event(), asyncio.Event()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(
                self._mirror(KV_STATUS, AppStatusView.decode, "statuses", status_ready),
                name="proxy-watch-status",
            ),
            loop.create_task(
                self._mirror(KV_APPS, AppConfig.from_json, "apps", apps_ready),
                name="proxy-watch-apps",
            ),
            loop.create_task(self._loop(status_ready, apps_ready), name="proxy-registry"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    # -- mirroring ----------------------------------------------------------------------------

    async def _mirror(
        self,
        bucket: str,
        decode: Callable[[bytes], V],
        attr: str,
        ready: asyncio.Event,
    ) -> None:
        while True:
            fresh: SignallingDict[V] = SignallingDict(self._changed.set)
            fresh_ready = asyncio.Event()
            task = asyncio.get_running_loop().create_task(
                follow(
                    self.bus,
                    bucket,
                    decode,
                    fresh,
                    self.bad,
                    fresh_ready,
                    live=True,
                    retry_s=WATCH_RETRY_S,
                )
            )
            waiter = asyncio.ensure_future(fresh_ready.wait())
            try:
                await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
                if fresh_ready.is_set():
                    setattr(self, attr, fresh)
                    ready.set()
                    self._changed.set()
                await task  # runs until the watch fails (or we are cancelled)
            except asyncio.CancelledError:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
                raise
            except Exception as exc:
                if self._errors.allow():
                    logger.warning(
                        "proxy: watch of %s failed (%s: %s); retrying",
                        bucket,
                        type(exc).__name__,
                        exc,
                    )
            finally:
                waiter.cancel()
            await asyncio.sleep(WATCH_RETRY_S)

    # -- rebuilding and publishing ------------------------------------------------------------

    async def _loop(self, *ready: asyncio.Event) -> None:
        for event in ready:
            await event.wait()
        publish_due = False
        while True:
            if self._changed.is_set():
                self._changed.clear()
                self._rebuild()
                publish_due = self.publish
            if publish_due:
                publish_due = not await self._publish()
            timeout = PUBLISH_RETRY_S if publish_due else None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._changed.wait()

    def _rebuild(self) -> None:
        old = self.table
        self.table = RouteTable(build_routes(self.statuses, self.apps))
        self.ready.set()
        if self.on_change is not None:
            try:
                self.on_change(old, self.table)
            except Exception:  # a bug there must not freeze the registry
                logger.exception("proxy: registry change handler failed")

    async def _publish(self) -> bool:
        """Bring fp_routes in line with the table; False if something could not be written."""
        routes = self.table.routes
        try:
            if self._routes_kv is None:
                self._routes_kv = await self.bus.kv(KV_ROUTES)
            kv = self._routes_kv
            if self._published is None:
                self._published = await self._read_published()
            published = self._published
            for app, route in routes.items():
                data = route.to_json()
                if published.get(app) != data:
                    await kv.put(app, data)
                    published[app] = data
            for app in [a for a in published if a not in routes]:
                await kv.delete(app)
                del published[app]
        except BusError as exc:
            if self._errors.allow():
                logger.warning("proxy: could not publish routes to %s: %s", KV_ROUTES, exc)
            if self.on_publish_error is not None:
                self.on_publish_error()
            return False
        return True

    async def _read_published(self) -> dict[str, bytes]:
        values: dict[str, bytes] = {}
        ready = asyncio.Event()
        await follow(self.bus, KV_ROUTES, bytes, values, {}, ready, live=False)
        return values

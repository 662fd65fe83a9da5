"""A replica follows its deployment's user_config: reconfigure() without a restart.

How it works: the replica starts with the user_config of its spec and hands it to the class's
`reconfigure()` before it serves (usercode.py). A class with `reconfigure()` then watches its
application's key in KV `fp_apps`: the watch delivers the current value first, then every change.
`config_update` (pure) says what a value means for this replica: nothing (not decodable, the
deployment is gone, another version: a new version rolls new replicas, which start with its
config), or a new user_config to apply. Updates are applied one at a time, in order; one that
equals the config applied last is skipped, so a redeploy that changes something else costs no
call. A reconfigure() that raises is logged, and the replica's health checks fail until a later
config is accepted: the controller replaces it, as Ray Serve does. Only replicas whose class has
`reconfigure()` hold a watch, so the cost is one watch per such replica, and a change of
user_config is one KV update that reaches each of them once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from shared.appconfig import AppConfig
from shared.bus import Bus
from shared.kv import buckets
from shared.replicahttp import with_serving_env

from .usercode import UserDeployment

log = logging.getLogger(__name__)

RETRY_S = 2.0
_KEEP = object()


def config_update(
    value: bytes | None, deployment: str, version: str, applied: Mapping[str, Any] | None
) -> Any:
    """The user_config to apply for this fp_apps value, or `_KEEP` (see the module docstring)."""
    if value is None:
        return _KEEP
    try:
        app = AppConfig.from_json(value)
        d = app.deployment(deployment)
    except Exception:
        return _KEEP
    # the version as the controller computed it: with the ingress's serving env in the spec
    if (
        app.version_of(with_serving_env(app, d)) != version
        or d.user_config is None
        or d.user_config == applied
    ):
        return _KEEP
    return d.user_config


class UserConfigFollower:
    """The shell: one KV watch, retried while the replica runs."""

    def __init__(
        self,
        bus: Bus,
        user: UserDeployment,
        app: str,
        deployment: str,
        version: str,
        applied: Mapping[str, Any] | None,
    ) -> None:
        self.bus, self.user = bus, user
        self.app, self.deployment, self.version = app, deployment, version
        self.applied = applied
        self.applied_count = 0
        self.failed_count = 0

    async def run(self) -> None:
        failing = False
        while True:
            try:
                await self._follow()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # once per failing streak: a missing bucket must not flood the replica's log
                (log.debug if failing else log.warning)(
                    "user_config watch of %s failed (%s); retrying every %g s",
                    self.app,
                    exc,
                    RETRY_S,
                )
                failing = True
            await asyncio.sleep(RETRY_S)

    async def _follow(self) -> None:
        kv = await buckets.open_bucket(self.bus, buckets.APPS, create=False)
        watcher = await kv.watch(self.app)
        try:
            async for entry in watcher:
                if entry is not None and entry.op == "PUT":
                    await self.offer(entry.value)
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()

    async def offer(self, value: bytes | None) -> bool:
        """Apply the user_config of this fp_apps value if it is new; True when applied."""
        config = config_update(value, self.deployment, self.version, self.applied)
        if config is _KEEP:
            return False
        try:
            await self.user.reconfigure(config)
        except Exception:
            self.failed_count += 1
            log.exception("reconfigure() refused the new user_config; health checks fail now")
            self.applied = config  # the same config again would fail again: wait for another
            return False
        self.applied = config
        self.applied_count += 1
        log.info("user_config applied without a restart (%d so far)", self.applied_count)
        return True

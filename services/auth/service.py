"""The auth callout's shell: answer the server's authorization requests on the bus.

It connects as one of the server's `auth_users` (those bypass the callout), subscribes to
`$SYS.REQ.USER.AUTH` in a queue group (several instances share the load and cover for each
other), and for each request: parse, decide (`core.authorize`), sign, reply. A request that
does not parse is counted and dropped unanswered: the server then refuses that client after its
auth timeout, as it does when no auth service runs at all.
"""

from __future__ import annotations

import asyncio
import logging

from shared.bus import Bus, Msg, RateLimiter
from shared.clock import SYSTEM_CLOCK, Clock
from shared.natsbus import NatsBus
from shared.natsjwt import TokenError
from shared.startup import retrying

from . import metrics
from .callout import CALLOUT_SUBJECT, parse_request, response, user_claims
from .config import AuthConfig
from .core import Granted, authorize

log = logging.getLogger(__name__)

QUEUE = "fleetpulse-auth"
REFUSAL_LOG_INTERVAL_S = 1.0


class AuthService:
    def __init__(self, cfg: AuthConfig, *, bus: Bus | None = None, clock: Clock = SYSTEM_CLOCK):
        self.cfg = cfg
        self.bus = bus
        self._given_bus = bus
        self.clock = clock
        self._stop = asyncio.Event()
        self._refusal_log = RateLimiter(REFUSAL_LOG_INTERVAL_S, clock)
        self._bad_log = RateLimiter(REFUSAL_LOG_INTERVAL_S, clock)
        self.ready = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        if self.bus is None:
            self.bus = await NatsBus.connect(self.cfg.nats_url, name="fleetpulse-auth")
        bus = self.bus
        try:
            sub = await retrying(
                "subscribe to authorization requests",
                lambda: bus.subscribe(CALLOUT_SUBJECT, self._on_request, queue=QUEUE),
                self._stop,
                log,
            )
            await bus.flush()
            log.info(
                "auth callout up: issuer %s, %d trusted replica key(s), roles %s, account %s",
                self.cfg.issuer.public_key,
                len(self.cfg.policy.trusted_replica_keys),
                ",".join(sorted(self.cfg.policy.role_passwords)) or "-",
                self.cfg.account,
            )
            self.ready.set()
            await self._stop.wait()
            await sub.unsubscribe()
        finally:
            if self._given_bus is None:
                await bus.close()

    async def _on_request(self, msg: Msg) -> None:
        started = self.clock.monotonic()
        now = self.clock.wall()
        if not msg.reply:
            metrics.BAD_REQUESTS.labels("no reply subject").inc()
            return
        try:
            req = parse_request(msg.data.decode("ascii", errors="replace"), now=now)
        except TokenError as exc:
            metrics.BAD_REQUESTS.labels(exc.reason).inc()
            if self._bad_log.allow():
                log.warning("dropped an authorization request: %s", exc)
            return
        decision = authorize(req.opts, self.cfg.policy, now)
        if isinstance(decision, Granted):
            claims = user_claims(
                req, decision.name, decision.permissions, account=self.cfg.account, now=now
            )
            answer = response(req, self.cfg.issuer, now=now, user=claims)
            metrics.DECISIONS.labels("granted", decision.role).inc()
            log.debug("granted %s (%s)", decision.name, req.opts.name)
        else:
            answer = response(req, self.cfg.issuer, now=now, error=decision.reason)
            metrics.DECISIONS.labels("refused", decision.reason).inc()
            if self._refusal_log.allow():
                log.warning(
                    "refused connection %r from %s: %s",
                    req.opts.name,
                    req.opts.host,
                    decision.detail,
                )
        assert self.bus is not None
        await self.bus.publish(msg.reply, answer)
        metrics.SECONDS.observe(self.clock.monotonic() - started)

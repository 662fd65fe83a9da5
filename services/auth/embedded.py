"""The auth callout on the embedded nats-server of `fleetpulse up --auth`.

How it works: fresh keys and passwords per run, nothing written but the server config (0600 in
the run's private directory). Two users bypass the callout: the auth service itself and the
stack `fleetpulse up` runs in its own process (controller, agent, proxy: trusted as before);
everything else is asked about: replicas with the credentials the local agent mints, and any
other client with a role password from `FP_{ROLE}_PASSWORD`.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path

from shared.natsauth import NatsAuth
from shared.natsbus import NatsBus
from shared.natsjwt import PREFIX_ACCOUNT, PREFIX_USER, KeyPair

from .config import AuthConfig, role_passwords
from .core import AuthPolicy
from .serverconf import callout_config
from .service import AuthService

AUTH_USER = "fleetpulse-auth"
STACK_USER = "fleetpulse-up"
READY_TIMEOUT_S = 10.0


class EmbeddedAuth:
    def __init__(self) -> None:
        self.issuer = KeyPair.generate(PREFIX_ACCOUNT)
        self.replica_key = KeyPair.generate(PREFIX_USER)
        self._passwords = {AUTH_USER: secrets.token_hex(16), STACK_USER: secrets.token_hex(16)}
        self.service: AuthService | None = None
        self._task: asyncio.Task[None] | None = None
        self._bus: NatsBus | None = None

    @property
    def stack_auth(self) -> NatsAuth:
        return NatsAuth(user=STACK_USER, password=self._passwords[STACK_USER])

    def write_server_config(self, directory: Path) -> Path:
        path = directory / "nats-auth.conf"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(callout_config(self.issuer.public_key, self._passwords))
        return path

    async def start(self, url: str) -> None:
        self._bus = await NatsBus.connect(
            url,
            name="fleetpulse-auth",
            auth=NatsAuth(user=AUTH_USER, password=self._passwords[AUTH_USER]),
        )
        cfg = AuthConfig(
            nats_url=url,
            issuer=self.issuer,
            policy=AuthPolicy(
                trusted_replica_keys=frozenset({self.replica_key.public_key}),
                role_passwords=role_passwords(os.environ),
            ),
        )
        self.service = AuthService(cfg, bus=self._bus)
        self._task = asyncio.create_task(self.service.run(), name="auth")
        await asyncio.wait_for(self.service.ready.wait(), READY_TIMEOUT_S)

    async def stop(self) -> None:
        if self.service is not None and self._task is not None:
            self.service.stop()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._bus is not None:
            await self._bus.close()

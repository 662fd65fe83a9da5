"""A nats-server with the auth callout configured, and `fleetpulse auth` answering it.

Shared by the auth integration tests: the server (free port, temporary store), an issuer key, one
agent replica key the service trusts, role passwords, and helpers to connect as a role or as a
replica with a credential. Two server configs: `global`, no accounts block (what `fleetpulse up
--auth` writes), and `accounts`, the very file compose runs (compose/nats/callout.conf: the auth
user in AUTH, connections landing in FLEETPULSE, the issuer from an included file).
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from services.auth.callout import GLOBAL_ACCOUNT
from services.auth.config import AuthConfig
from services.auth.core import PASSWORD_ROLES, AuthPolicy
from services.auth.keys import AUTH_USER_CONF, ISSUER_CONF, auth_user_conf
from services.auth.serverconf import callout_config
from services.auth.service import AuthService
from shared.natsauth import NatsAuth
from shared.natsbus import NatsBus
from shared.natsjwt import PREFIX_ACCOUNT, PREFIX_USER, KeyPair
from shared.natsserver import NatsServer
from shared.replicacred import inbox_prefix, mint, write_credential

AUTH_USER = "fleetpulse-auth"
"""The auth service's own user: compose/nats/callout.conf names it."""
COMPOSE_CALLOUT = Path(__file__).resolve().parents[2] / "compose" / "nats" / "callout.conf"
MODES = ("global", "accounts")
COMPOSE_ACCOUNT = "FLEETPULSE"


@dataclass
class Callout:
    server: NatsServer
    issuer: KeyPair
    replica_key: KeyPair
    auth_password: str
    passwords: dict[str, str]
    tmp: Path
    account: str = GLOBAL_ACCOUNT
    service: AuthService | None = None
    task: asyncio.Task[None] | None = None
    opened: list[NatsBus] = field(default_factory=list)

    def config(self) -> AuthConfig:
        return AuthConfig(
            nats_url=self.server.url,
            issuer=self.issuer,
            policy=AuthPolicy(
                trusted_replica_keys=frozenset({self.replica_key.public_key}),
                role_passwords=self.passwords,
            ),
            account=self.account,
        )

    async def start_service(self) -> None:
        bus = await NatsBus.connect(
            self.server.url, name="auth", auth=NatsAuth(user=AUTH_USER, password=self.auth_password)
        )
        self.service = AuthService(self.config(), bus=bus)
        self.task = asyncio.create_task(self.service.run())
        await asyncio.wait_for(self.service.ready.wait(), 10)
        self._service_bus = bus

    async def stop_service(self) -> None:
        if self.service is not None and self.task is not None:
            self.service.stop()
            await self.task
            await self._service_bus.close()
            self.service = self.task = None

    async def role(self, role: str, **kw: object) -> NatsBus:
        bus = await NatsBus.connect(
            self.server.url,
            name=role,
            auth=NatsAuth(user=role, password=self.passwords[role]),
            **kw,  # type: ignore[arg-type]
        )
        self.opened.append(bus)
        return bus

    def credential(
        self, app: str, dep: str, rid: str, *, ttl_s: float = 60.0, key: KeyPair | None = None
    ) -> str:
        return mint(key or self.replica_key, app, dep, rid, now=time.time(), ttl_s=ttl_s)

    def credential_file(self, rid: str, token: str) -> Path:
        path = self.tmp / f"{rid}.cred"
        write_credential(path, token)
        return path

    async def replica(
        self, app: str, dep: str, rid: str, *, token: str | None = None, **kw: object
    ) -> NatsBus:
        """Connected as the agent's replicas are: a credential file and its own inboxes."""
        path = self.credential_file(rid, token or self.credential(app, dep, rid))
        bus = await NatsBus.connect(
            self.server.url,
            name=f"replica-{rid}",
            auth=NatsAuth(token_file=str(path), inbox_prefix=inbox_prefix(rid)),
            **kw,  # type: ignore[arg-type]
        )
        self.opened.append(bus)
        return bus


def _server_config(tmp: Path, mode: str, issuer: KeyPair, auth_password: str) -> Path:
    if mode == "global":
        conf = tmp / "callout.conf"
        conf.write_text(callout_config(issuer.public_key, {AUTH_USER: auth_password}))
        return conf
    # compose's layout: /etc/nats/callout.conf includes ../nats-auth/issuer.conf
    (tmp / "nats").mkdir()
    shutil.copy(COMPOSE_CALLOUT, tmp / "nats" / "callout.conf")
    public = tmp / "nats-auth"
    public.mkdir()
    (public / ISSUER_CONF).write_text(f'issuer: "{issuer.public_key}"\n')
    (public / AUTH_USER_CONF).write_text(auth_user_conf(auth_password))  # as auth-init does
    conf = tmp / "nats" / "server.conf"
    conf.write_text("include callout.conf\n")
    return conf


async def callout_server(tmp: Path, mode: str = "global") -> AsyncIterator[Callout]:
    issuer = KeyPair.generate(PREFIX_ACCOUNT)
    auth_password = secrets.token_hex(16)
    conf = _server_config(tmp, mode, issuer, auth_password)
    server = NatsServer(config_file=conf)
    c = Callout(
        server=server,
        issuer=issuer,
        replica_key=KeyPair.generate(PREFIX_USER),
        auth_password=auth_password,
        passwords={r: secrets.token_hex(8) for r in PASSWORD_ROLES},
        tmp=tmp,
        account=GLOBAL_ACCOUNT if mode == "global" else COMPOSE_ACCOUNT,
    )
    try:
        server.start()
        await c.start_service()
        yield c
    finally:
        for bus in c.opened:
            await bus.close()
        await c.stop_service()
        server.stop()

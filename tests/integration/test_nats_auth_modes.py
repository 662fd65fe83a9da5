"""Token authentication and TLS (server-verified and mutual) on a real nats-server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from shared.errors import BusAuthError, BusError
from shared.natsauth import NatsAuth
from shared.natsbus import NatsBus
from shared.natsserver import NatsServer


def _server(tmp_path: Path, config: str) -> Iterator[NatsServer]:
    conf = tmp_path / "server.conf"
    conf.write_text(config)
    s = NatsServer(config_file=conf)
    try:
        s.start()
        yield s
    finally:
        s.stop()


@pytest.fixture
def token_server(tmp_path: Path) -> Iterator[NatsServer]:
    yield from _server(tmp_path, 'authorization { token: "s3cret-token" }\n')


async def test_token(token_server: NatsServer) -> None:
    bus = await NatsBus.connect(token_server.url, name="t", auth=NatsAuth(token="s3cret-token"))
    await (await bus.kv("fp_apps")).put("a", b"1")
    await bus.close()
    with pytest.raises(BusAuthError, match="refused the credentials \\(a token\\)"):
        await NatsBus.connect(token_server.url, name="t", auth=NatsAuth(token="wrong"))


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def pki(tmp_path: Path, ca: trustme.CA) -> dict[str, str]:
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("fleetpulse-client")
    files = {
        "ca": tmp_path / "ca.pem",
        "server_cert": tmp_path / "server.pem",
        "server_key": tmp_path / "server.key",
        "client_cert": tmp_path / "client.pem",
        "client_key": tmp_path / "client.key",
    }
    ca.cert_pem.write_to_path(str(files["ca"]))
    server.cert_chain_pems[0].write_to_path(str(files["server_cert"]))
    server.private_key_pem.write_to_path(str(files["server_key"]))
    client.cert_chain_pems[0].write_to_path(str(files["client_cert"]))
    client.private_key_pem.write_to_path(str(files["client_key"]))
    return {k: str(v) for k, v in files.items()}


@pytest.fixture
def mtls_server(tmp_path: Path, pki: dict[str, str]) -> Iterator[NatsServer]:
    yield from _server(
        tmp_path,
        f'tls {{ cert_file: "{pki["server_cert"]}", key_file: "{pki["server_key"]}", '
        f'ca_file: "{pki["ca"]}", verify: true, timeout: 2 }}\n',
    )


async def test_mutual_tls(mtls_server: NatsServer, pki: dict[str, str]) -> None:
    url = mtls_server.url.replace("nats://", "tls://")
    auth = NatsAuth(tls_ca=pki["ca"], tls_cert=pki["client_cert"], tls_key=pki["client_key"])
    bus = await NatsBus.connect(url, name="t", auth=auth)
    await (await bus.kv("fp_apps")).put("a", b"1")
    await bus.close()
    # no client certificate: the server refuses the handshake
    with pytest.raises(BusError):
        await NatsBus.connect(url, name="t", auth=NatsAuth(tls_ca=pki["ca"]), connect_timeout=2)
    # a server this CA did not sign is not trusted, and the error says so
    with pytest.raises(BusError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        await NatsBus.connect(
            url, name="t", auth=NatsAuth(tls_cert=pki["client_cert"],
                                         tls_key=pki["client_key"]), connect_timeout=2
        )  # fmt: skip

"""A monitoring port listens on loopback unless asked (compose's image asks for 0.0.0.0)."""

from __future__ import annotations

from pathlib import Path

from shared.metrics_catalog import ENV_METRICS_HOST, serve_metrics
from shared.natsserver import free_ports

ROOT = Path(__file__).resolve().parents[2]


def listening_address(port: int) -> str | None:
    """The local IPv4 address a socket listens on at `port` (from /proc/net/tcp), else None."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if int(hex_port, 16) == port and state == "0A":
            return ".".join(str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0))
    return None


def test_metrics_listen_on_loopback_by_default() -> None:
    (port,) = free_ports(1)
    serve_metrics(port, "test", env={})
    assert listening_address(port) == "127.0.0.1"


def test_metrics_listen_where_asked() -> None:
    (port,) = free_ports(1)
    serve_metrics(port, "test", env={ENV_METRICS_HOST: "0.0.0.0"})
    assert listening_address(port) == "0.0.0.0"


def test_the_compose_image_asks_for_every_interface() -> None:
    """Prometheus scrapes the services over the compose network; nothing publishes the port."""
    dockerfile = (ROOT / "compose" / "Dockerfile").read_text()
    assert f"{ENV_METRICS_HOST}=0.0.0.0" in dockerfile

"""`http_address`: where a replica serves HTTP itself, "host:port", one rule for every carrier.

A replica of an app's ingress deployment announces it on its "ready" `Lifecycle`; the controller
copies it into the replica's `Member` value (fp_membership), where the proxy's HAProxy reads it.
The host is whatever the replica advertises (a name, an IPv4 address, or an IPv6 address in
brackets, "[::1]:8080"); the port is a decimal 1..65535 without leading zeros. No scheme, no
path, no whitespace (schemas/v1 say the same with a pattern).
"""

from __future__ import annotations

import ipaddress
from typing import Final

MAX_HTTP_ADDRESS_LEN: Final = 300
"""A DNS name is at most 253 characters; the rest is the port and brackets."""


def http_address_problem(value: str) -> str | None:
    """What is wrong with `value` as an http_address, or None."""
    if not value:
        return "must not be empty"
    if len(value) > MAX_HTTP_ADDRESS_LEN:
        return f"longer than {MAX_HTTP_ADDRESS_LEN} characters"
    if any(c.isspace() or c in "/?#@" for c in value):
        return "must be host:port (no whitespace, scheme or path)"
    host, sep, port = value.rpartition(":")
    if not sep:
        return "must be host:port"
    if not host:
        return "host must not be empty"
    if host.startswith("["):
        if not host.endswith("]") or not _ipv6(host[1:-1]):
            return "an IPv6 host must be an IPv6 address in brackets, like [::1]:8080"
    elif ":" in host or "[" in host or "]" in host:
        return "an IPv6 host must be in brackets, like [::1]:8080"
    if not (port.isascii() and port.isdigit()) or len(port) > 5 or port.startswith("0"):
        return "port must be a decimal number 1..65535 (no leading zero)"
    if not 1 <= int(port) <= 65535:
        return f"port must be 1..65535, got {int(port)}"
    return None


def _ipv6(text: str) -> bool:
    address, _, zone = text.partition("%")  # fe80::1%eth0: a link-local address's interface
    try:
        ipaddress.IPv6Address(address)
    except ValueError:
        return False
    return "%" not in text or bool(zone)


def format_http_address(host: str, port: int) -> str:
    """ "host:port" (an IPv6 host in brackets); ValueError when the result would be refused."""
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    value = f"{shown}:{port}"
    problem = http_address_problem(value)
    if problem is not None:
        raise ValueError(f"http_address {value!r}: {problem}")
    return value

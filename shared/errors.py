"""Error types. Whose fault it is decides the type.

`WireError` is the peer's fault (it sent bad bytes): subscribers count it by `reason`, log it
rate-limited and drop the message. `ConfigError` and `UsageError` are the local user's fault and
say what to fix. Everything raised on purpose derives from `FleetpulseError`.
"""

from __future__ import annotations


class FleetpulseError(Exception):
    """Base of every error fleetpulse raises on purpose."""


class WireError(FleetpulseError):
    """A peer sent data that does not match the wire contract.

    `reason` is a short stable token (``bad_magic``, ``truncated``, ``wrong_type`` ...) used as a
    metric label; `detail` is the human explanation.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


class ConfigError(FleetpulseError):
    """A configuration value is wrong. Names the source, the field and the fix."""

    def __init__(self, message: str, *, source: str = "", field: str = "") -> None:
        self.source = source
        self.field = field
        where = ":".join(p for p in (source, field) if p)
        super().__init__(f"{where}: {message}" if where else message)


class UsageError(FleetpulseError):
    """The local caller misused an API or a command (bad name, bad argument)."""


class BusError(FleetpulseError):
    """The message bus failed an operation (not connected, timed out, server refused)."""


class BusAuthError(BusError):
    """The NATS server refused our credentials (wrong user, password, token or creds)."""


class BusTimeout(BusError):
    """A request or KV operation got no answer in time."""


class NoResponders(BusError):
    """A request was sent to a subject nobody listens on."""


class KVConflict(BusError):
    """A KV create/update lost a revision race: someone else wrote first."""

    def __init__(self, key: str, expected_revision: int | None, detail: str = "") -> None:
        self.key = key
        self.expected_revision = expected_revision
        msg = f"key {key!r}: expected revision {expected_revision}"
        super().__init__(f"{msg}; {detail}" if detail else msg)


class BucketNotFound(BusError):
    """A KV bucket does not exist (nobody created it yet, or it was deleted)."""

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket
        super().__init__(f"KV bucket {bucket!r} does not exist")


class KVNotFound(BusError):
    """A KV key does not exist (or was deleted)."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"key {key!r} not found")

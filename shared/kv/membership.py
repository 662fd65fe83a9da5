"""KV `fp_membership`: the replicas routers may send requests to, one value per member.

Key `{app}.{deployment}.{slot}` (the same slot as the replica's target). A router watches
`{app}.{deployment}.>` and applies each change as it comes: a put adds or replaces the member in
that slot, a delete empties it. Values are small and fixed in size, so a change to one replica
costs one small message whatever the size of the deployment.

`epoch` is the deployment's membership epoch when the value was written (it only grows); a
router's view epoch is the largest it applied, and handle reports carry it (the controller uses it
to know when a report's replica list may have changed). A KV watcher delivers values in revision
order and skips what it delivered before a reconnect, so a router never applies an older value.
`report_interval_s` carries the deployment's `metrics_interval_s` to its routers: they send
handle reports at that cadence (a change of the setting rewrites every member at a new epoch).
Writer: the owning controller (revision-checked, `owner_epoch`). Readers: routers, the proxy, the
controller on takeover.

`MembershipView` is the reader's side, pure: entries in, the member set out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from shared.errors import UsageError, WireError
from shared.kv import envelope as e
from shared.subjects import validate_name
from shared.wire import reasons
from shared.wire.address import http_address_problem


def member_key(app: str, deployment: str, slot: int) -> str:
    return f"{app}.{deployment}.{slot}"


def deployment_pattern(app: str, deployment: str) -> str:
    return f"{app}.{deployment}.>"


def parse_member_key(key: str) -> tuple[str, str, int]:
    parts = key.split(".")
    if len(parts) != 3 or not parts[2].isdigit():
        raise WireError(
            reasons.BAD_VALUE, f"not a member key ({{app}}.{{deployment}}.{{slot}}): {key!r}"
        )
    try:
        validate_name(parts[0], "app")
        validate_name(parts[1], "deployment")
    except UsageError as exc:
        raise WireError(reasons.BAD_VALUE, f"member key {key!r}: {exc}") from None
    return parts[0], parts[1], int(parts[2])


@dataclass(frozen=True, slots=True)
class Member:
    KIND: ClassVar[str] = "member"
    app: str
    deployment: str
    slot: int
    replica_id: str
    rpc_subject: str
    order: int
    """Start order within the deployment (older first)."""
    epoch: int
    owner_epoch: int = 0
    report_interval_s: float | None = None
    """The deployment's `metrics_interval_s`: how often routers send its handle reports (absent:
    the router's own default)."""
    max_queued_requests: int | None = None
    """The deployment's `max_queued_requests`: how many requests each router may queue for it
    (absent: the router's own bound)."""
    max_ongoing_requests: int | None = None
    """This replica's `max_ongoing_requests` (its version's): a router sends it no more at once
    than that and queues the rest itself, oldest first (absent: the router learns it is full from
    its refusals)."""
    http_address: str | None = None
    """"host:port" where this replica serves HTTP itself (a replica of its app's ingress
    deployment: the proxy's HAProxy sends it HTTP requests there; absent: it serves none).
    Rules: shared.wire.address."""

    def __post_init__(self) -> None:
        if self.report_interval_s is not None and not self.report_interval_s > 0:
            raise UsageError(f"report_interval_s must be > 0, got {self.report_interval_s}")
        if self.max_queued_requests is not None and self.max_queued_requests < 1:
            raise UsageError(f"max_queued_requests must be >= 1, got {self.max_queued_requests}")
        if self.max_ongoing_requests is not None and self.max_ongoing_requests < 1:
            raise UsageError(f"max_ongoing_requests must be >= 1, got {self.max_ongoing_requests}")
        if self.http_address is not None:
            problem = http_address_problem(self.http_address)
            if problem is not None:
                raise UsageError(f"http_address {self.http_address!r}: {problem}")

    @property
    def key(self) -> str:
        return member_key(self.app, self.deployment, self.slot)

    def to_doc(self) -> dict[str, Any]:
        return (
            {
                "app": self.app,
                "deployment": self.deployment,
                "slot": self.slot,
                "replica_id": self.replica_id,
                "rpc_subject": self.rpc_subject,
                "order": self.order,
                "epoch": self.epoch,
                "owner_epoch": self.owner_epoch,
            }
            | (
                {}
                if self.report_interval_s is None
                else {"report_interval_s": self.report_interval_s}
            )
            | (
                {}
                if self.max_queued_requests is None
                else {"max_queued_requests": self.max_queued_requests}
            )
            | (
                {}
                if self.max_ongoing_requests is None
                else {"max_ongoing_requests": self.max_ongoing_requests}
            )
            | ({} if self.http_address is None else {"http_address": self.http_address})
        )

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> Member:
        return cls(
            app=e.name(doc, "app"),
            deployment=e.name(doc, "deployment"),
            slot=e.count(doc, "slot"),
            replica_id=e.name(doc, "replica_id"),
            rpc_subject=e.string(doc, "rpc_subject"),
            order=e.count(doc, "order"),
            epoch=e.count(doc, "epoch"),
            owner_epoch=e.count(doc, "owner_epoch", 0),
            report_interval_s=e.optional_positive(doc, "report_interval_s"),
            max_queued_requests=_at_least_one(doc, "max_queued_requests"),
            max_ongoing_requests=_at_least_one(doc, "max_ongoing_requests"),
            http_address=_http_address(doc),
        )

    def check_key(self, key: str) -> None:
        """A value must sit under its own key (WireError otherwise)."""
        e.check_key(key, self.key, "member")


class MembershipView:
    """One deployment's members as a router sees them: slot -> Member.

    `put` and `delete` return whether the member set changed; `members()` lists them in start
    order. Each call is O(1) but `members()`, which the caller asks for once per batch of changes.
    `report_interval_s` is the one carried by the newest value (highest epoch) that had one: all
    members of a deployment carry the same, and a change rewrites them all at a new epoch."""

    __slots__ = ("_by_slot", "_interval_epoch", "_queue_epoch", "app", "deployment", "epoch",
                 "max_queued_requests", "report_interval_s")  # fmt: skip

    def __init__(self, app: str, deployment: str) -> None:
        self.app = app
        self.deployment = deployment
        self.epoch = 0
        self.report_interval_s: float | None = None
        self._interval_epoch = -1
        self.max_queued_requests: int | None = None
        """The newest value's (absent there: None, the router's own bound applies)."""
        self._queue_epoch = -1
        self._by_slot: dict[int, Member] = {}

    def put(self, key: str, member: Member) -> bool:
        """Apply a value read under `key` (WireError if it is not this deployment's)."""
        member.check_key(key)
        if (member.app, member.deployment) != (self.app, self.deployment):
            raise WireError(
                reasons.BAD_VALUE, f"{key!r} is not a member of {self.app}.{self.deployment}"
            )
        self.epoch = max(self.epoch, member.epoch)
        if member.report_interval_s is not None and member.epoch >= self._interval_epoch:
            self.report_interval_s, self._interval_epoch = member.report_interval_s, member.epoch
        if member.epoch >= self._queue_epoch:
            self.max_queued_requests, self._queue_epoch = member.max_queued_requests, member.epoch
        old = self._by_slot.get(member.slot)
        self._by_slot[member.slot] = member
        return old is None or (old.replica_id, old.rpc_subject, old.http_address) != (
            member.replica_id,
            member.rpc_subject,
            member.http_address,
        )

    def delete(self, key: str) -> bool:
        try:
            _, _, slot = parse_member_key(key)
        except WireError:
            return False
        return self._by_slot.pop(slot, None) is not None

    def clear(self) -> bool:
        had = bool(self._by_slot)
        self._by_slot.clear()
        return had

    def members(self) -> list[Member]:
        return sorted(self._by_slot.values(), key=_by_order)

    def __len__(self) -> int:
        return len(self._by_slot)


def _by_order(m: Member) -> tuple[int, int]:
    return m.order, m.slot


def _at_least_one(doc: dict[str, Any], field: str) -> int | None:
    if doc.get(field) is None:
        return None
    n = e.count(doc, field)
    if n < 1:
        raise WireError(reasons.BAD_VALUE, f"member.{field} must be >= 1")
    return n


def _http_address(doc: dict[str, Any]) -> str | None:
    value = e.optional_string(doc, "http_address")
    if value is None:
        return None
    problem = http_address_problem(value)
    if problem is not None:
        raise WireError(reasons.BAD_VALUE, f"member.http_address: {problem}")
    return value

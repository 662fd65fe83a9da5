"""Errors a router raises to its callers (docs/dataplane.md, "Error codes").

`retryable` tells the caller whether trying the same request again may succeed: the router already
retries transparently whatever was never admitted, so a retryable error here means the request may
have run (partly) on a replica that then died or shut down.
"""

from __future__ import annotations

from shared.errors import FleetpulseError


class RouterError(FleetpulseError):
    """Base of the errors a `DeploymentHandle` raises for one request."""

    retryable: bool = False


class BackPressureError(RouterError):
    """The router's queue of waiting requests is full; the request was not sent anywhere.
    `setting` names the bound: the deployment's `max_queued_requests`, or the router's own
    (`--max-queued`) when the deployment sets none."""

    retryable = True

    def __init__(self, queued: int, limit: int, *, deployment: str = "", setting: str = "") -> None:
        self.queued = queued
        self.limit = limit
        self.deployment = deployment
        self.setting = setting or "limit"
        where = f"{deployment}: " if deployment else ""
        super().__init__(
            f"{where}{queued} requests already queued at this router ({self.setting} {limit}); "
            "every replica is at max_ongoing_requests: retry later, or raise the bound"
        )


class DeadlineExceeded(RouterError):
    """The request's deadline passed (while queued, waiting for admission or for the result)."""

    def __init__(self, detail: str = "") -> None:
        self.detail = detail
        super().__init__(f"deadline exceeded{': ' + detail if detail else ''}")


class NoReplicasError(RouterError):
    """The deployment has no replica to send to and the request could not wait for one."""

    retryable = True


class RouterClosedError(RouterError):
    """The handle (its shared router) was closed while the request waited."""


class ReplicaLostError(RouterError):
    """The replica died after admitting the request: nothing more will come from it."""

    retryable = True

    def __init__(self, replica_id: str, detail: str = "") -> None:
        self.replica_id = replica_id
        self.detail = detail
        msg = f"replica {replica_id} was lost after admitting the request"
        super().__init__(f"{msg}: {detail}" if detail else msg)


class ResponseLostError(RouterError):
    """Part of the response was lost in transit (a NATS node restarted between the replica and
    us): a later part arrived, an earlier one never will. The replica ran the request, so
    `retryable` says a new try may succeed, not that the request did not run: trying again runs
    it again (docs/dataplane.md, "Lost in transit")."""

    retryable = True

    def __init__(self, replica_id: str, detail: str = "") -> None:
        self.replica_id = replica_id
        self.detail = detail
        msg = f"the response from replica {replica_id} was lost in transit"
        where = f" ({detail})" if detail else ""
        super().__init__(f"{msg}{where}: the request ran there, and trying again runs it again")


class RequestFailed(RouterError):
    """The replica ended the request with an `ErrorReply` (or sent a broken response stream)."""

    def __init__(self, code: str, message: str, retryable: bool, replica_id: str = "") -> None:
        self.code = code
        self.message = message
        self.retryable = retryable
        self.replica_id = replica_id
        super().__init__(f"{code}: {message}" if message else code)

"""The router: `DeploymentHandle` (an in-process router usable from any Python code) and the gateway
service that lets callers in any language reach a deployment over `fp.v1.call.{app}.{deployment}`.

The request protocol between a router and a replica is in docs/dataplane.md.
"""

from services.router.errors import (
    BackPressureError,
    DeadlineExceeded,
    NoReplicasError,
    ReplicaLostError,
    RequestFailed,
    ResponseLostError,
    RouterClosedError,
    RouterError,
)

__all__ = [
    "BackPressureError",
    "DeadlineExceeded",
    "NoReplicasError",
    "ReplicaLostError",
    "RequestFailed",
    "ResponseLostError",
    "RouterClosedError",
    "RouterError",
]

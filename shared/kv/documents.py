"""Every control-state document type by its `kind`, and the bucket each lives in.

For tools that handle any bucket (golden vectors, `nats kv get` decoders, the contract tests):
`decode_any(kind, data)` validates like the service that reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from shared.kv import buckets, envelope
from shared.kv.agents import AgentInfo
from shared.kv.apps import AppDoc
from shared.kv.audit import AuditRecord
from shared.kv.group import ControllerMember, PartitionLease
from shared.kv.membership import Member
from shared.kv.routes import RouteDoc
from shared.kv.status import AppStatusView
from shared.kv.targets import ReplicaTarget

DocumentType = (
    type[AppDoc]
    | type[ReplicaTarget]
    | type[Member]
    | type[AppStatusView]
    | type[AgentInfo]
    | type[PartitionLease]
    | type[ControllerMember]
    | type[RouteDoc]
    | type[AuditRecord]
)

BY_KIND: Final[Mapping[str, DocumentType]] = {
    cls.KIND: cls
    for cls in (
        AppDoc,
        ReplicaTarget,
        Member,
        AppStatusView,
        AgentInfo,
        PartitionLease,
        ControllerMember,
        RouteDoc,
        AuditRecord,
    )
}

BUCKET_OF: Final[Mapping[str, buckets.Bucket]] = {
    kind: bucket for bucket in buckets.ALL for kind in bucket.kinds
}


def decode_any(kind: str, data: object) -> envelope.Document:
    """Decode `data` as a `kind` document (WireError when it is not one)."""
    return envelope.decode(data, BY_KIND[kind])

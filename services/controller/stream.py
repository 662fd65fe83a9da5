"""The FP_REPORTS JetStream stream: every report, partitioned by {app}.{deployment}.

The stream captures `fp.v1.report.>` and a subject transform stores each message as
`fp.v1.part.{P}.{kind}.{app}.{deployment}[.{replica}]` (the replica token is there when a
replica names itself), where P = FNV-1a(app) mod partitions (the server's
`partition()` mapping function; `group.partition_of` computes the same). A controller member
consumes the partitions it owns; one application's reports always land in one partition, in order.
The partition key is the app, not app.deployment: an app's status (KV fp_status, one key per app)
then has exactly one writer. Memory storage: reports are
worth only as long as the look-back window, and retention covers it with room to spare.
"""

from __future__ import annotations

import logging

from nats.aio.msg import Msg
from nats.errors import NotJSMessageError
from nats.js import JetStreamContext
from nats.js.api import (
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    SubjectTransform,
)
from nats.js.errors import NotFoundError

from shared import settings
from shared.natskv import nats_errors
from shared.subjects import Subjects, partition_prefix, report_stream_name

log = logging.getLogger(__name__)

_V1_TOKENS = 9

DEFAULT_PARTITIONS: int = settings.CONTROLLER_PARTITIONS.default
DEFAULT_RETENTION_S: float = settings.CONTROLLER_RETENTION.default


def stream_config(
    subjects: Subjects, partitions: int, retention_s: float, *, replicas: int = 1
) -> StreamConfig:
    # `>`: the deployment, and the replica after it when the subject names one
    src = f"{subjects.prefix}.report.*.*.>"
    dest = (
        f"{partition_prefix(subjects)}.{{{{partition({partitions},2)}}}}"
        ".{{wildcard(1)}}.{{wildcard(2)}}.>"
    )
    return StreamConfig(
        name=report_stream_name(subjects),
        subjects=[subjects.reports_wildcard()],
        subject_transform=SubjectTransform(src=src, dest=dest),
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.MEMORY,
        discard=DiscardPolicy.OLD,
        max_age=retention_s,
        num_replicas=replicas,
    )


async def ensure_stream(
    js: JetStreamContext,
    subjects: Subjects,
    partitions: int = DEFAULT_PARTITIONS,
    retention_s: float = DEFAULT_RETENTION_S,
    *,
    replicas: int = 1,
) -> str:
    """Create the stream, or update it when its settings differ. Returns its name."""
    cfg = stream_config(subjects, partitions, retention_s, replicas=replicas)
    assert cfg.name is not None
    with nats_errors(f"stream {cfg.name}"):
        try:
            info = await js.stream_info(cfg.name)
        except NotFoundError:
            await js.add_stream(cfg)
            log.info(
                "created stream %s (%d partitions, %.0f s retention)",
                cfg.name,
                partitions,
                retention_s,
            )
            return cfg.name
        current = info.config
        if (
            current.subject_transform is None
            or current.subject_transform.dest != cfg.subject_transform.dest  # type: ignore[union-attr]
            or current.max_age != cfg.max_age
        ):
            await js.update_stream(cfg)
            log.info("updated stream %s", cfg.name)
    return cfg.name


def delivery_position(reply: str) -> tuple[int, float]:
    """(messages still pending behind it, stored-at unix seconds) of a delivered message, read
    from its JetStream ack subject: what nats-py's `Msg.metadata` gives, without the datetime and
    the dataclasses it builds per message (a few percent of a busy controller's CPU). Both
    layouts: `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>` and the one
    with domain and account hash in front (which may end in a random token)."""
    tokens = reply.split(".")
    n = len(tokens)
    if not (n == _V1_TOKENS or n >= Msg.Ack.NumPending + 1) or tokens[:2] != ["$JS", "ACK"]:
        raise NotJSMessageError
    at = 7 if len(tokens) == _V1_TOKENS else Msg.Ack.Timestamp
    return int(tokens[at + 1]), int(tokens[at]) / 1e9

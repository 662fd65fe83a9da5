"""FP_REPORTS on a real nats-server: both report subject forms land in their app's partition.

A replica names itself in its report subjects (`...{deployment}.{replica}`), agents and older
replicas do not; the stream's subject transform must put both in the partition of the app, and
a stream made by the previous transform (three tokens after `report`) must be updated in place.
"""

from __future__ import annotations

import dataclasses

import pytest
from nats.js.api import SubjectTransform

from services.controller.group import partition_of
from services.controller.stream import ensure_stream, stream_config
from shared.natsbus import NatsBus
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.subjects import ReportSubject, report_subject

pytestmark = pytest.mark.integration
PARTITIONS = 16


async def test_both_subject_forms_land_in_the_apps_partition(nats_bus: NatsBus) -> None:
    bus = nats_bus
    cfg = stream_config(S, PARTITIONS, 600.0)
    before = SubjectTransform(  # the transform of the tree before replica ids in subjects
        src="fp.v1.report.*.*.*",
        dest=f"fp.v1.part.{{{{partition({PARTITIONS},2)}}}}"
        ".{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}",
    )
    await bus.js.add_stream(dataclasses.replace(cfg, subject_transform=before))
    name = await ensure_stream(bus.js, S, PARTITIONS, 600.0)
    info = await bus.js.stream_info(name)
    assert info.config.subject_transform is not None
    assert info.config.subject_transform.src == "fp.v1.report.*.*.>"

    sent = [
        S.report("replica", "shop", "Cart", "r-1"),
        S.report("heartbeat", "shop", "Cart", "r-1"),
        S.report("lifecycle", "shop", "Cart"),  # an agent's: no replica token
        S.report("handle", "ml", "Model"),
    ]
    for subject in sent:
        await bus.js.publish(subject, b"x")  # waits for the ack: stored once it returns
    stored = [(await bus.js.get_msg(name, seq)).subject for seq in range(1, len(sent) + 1)]
    for subject, where in zip(sent, stored, strict=True):
        parsed = S.parse_report(subject)
        p = partition_of(parsed.app, PARTITIONS)
        assert where.startswith(f"fp.v1.part.{p}."), (subject, where)
        assert report_subject(S, where) == subject  # what the controller parses
    assert S.parse_report(sent[0]) == ReportSubject("replica", "shop", "Cart", "r-1")

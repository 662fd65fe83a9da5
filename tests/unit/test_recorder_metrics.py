"""The recorder's Prometheus metrics follow a recording's totals (files on disk, no bus)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import REGISTRY

from services.recorder.metrics import RecorderMetrics
from shared.recording import RecordingWriter, WriterConfig


def value(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


NAMES = (
    "fleetpulse_recorder_messages_total",
    "fleetpulse_recorder_payload_bytes_total",
    "fleetpulse_recorder_written_bytes_total",
    "fleetpulse_recorder_files_total",
)


def test_totals_move_by_their_difference_and_rotation_counts_files(tmp_path: Path) -> None:
    writer = RecordingWriter(WriterConfig(tmp_path, batch_rows=2, rotate_bytes=1))
    metrics = RecorderMetrics()
    before = [value(n) for n in NAMES]
    payload = b"x" * 100
    for i in range(3):
        writer.append(i, "fp.v1.report.handle.a.d", payload)
    metrics.update(3, 300, writer)
    assert value("fleetpulse_recorder_pending_rows") == 1  # a batch of two went out
    metrics.update(3, 300, writer)  # nothing new: nothing added
    writer.close()
    metrics.update(3, 300, writer)
    moved = [value(n) - b for n, b in zip(NAMES, before, strict=True)]
    assert moved[:2] == [3, 300]
    assert moved[2] == writer.bytes_written > 300
    assert moved[3] == len(writer.files) == 2  # every batch fills a 1-byte file: rotated
    assert value("fleetpulse_recorder_pending_rows") == 0

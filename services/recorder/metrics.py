"""Prometheus metrics of `fleetpulse record` (docs/metrics.md), on the default registry.

The recorder's loop moves its running totals here once per tick (`RecorderMetrics.update`), so
recording a message costs nothing extra.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from shared.recording import RecordingWriter

MESSAGES = Counter("fleetpulse_recorder_messages_total", "Messages received and recorded")
PAYLOAD_BYTES = Counter(
    "fleetpulse_recorder_payload_bytes_total", "Payload bytes of the messages recorded"
)
WRITTEN_BYTES = Counter(
    "fleetpulse_recorder_written_bytes_total", "Bytes written to recording files"
)
FILES = Counter(
    "fleetpulse_recorder_files_total",
    "Recording files started: the first one, then one per rotation",
)
WRITE_ERRORS = Counter(
    "fleetpulse_recorder_write_errors_total",
    "Writes that failed (disk full, I/O error); the recorder stops at the first",
)
PENDING = Gauge(
    "fleetpulse_recorder_pending_rows", "Messages buffered for the next batch, not yet written"
)


class RecorderMetrics:
    """Moves one recording's running totals into the counters (by the difference)."""

    def __init__(self) -> None:
        self._last = (0, 0, 0, 0)

    def update(self, messages: int, payload_bytes: int, writer: RecordingWriter) -> None:
        now = (messages, payload_bytes, writer.bytes_written, len(writer.files))
        for counter, before, after in zip(
            (MESSAGES, PAYLOAD_BYTES, WRITTEN_BYTES, FILES), self._last, now, strict=True
        ):
            if after > before:
                counter.inc(after - before)
        self._last = now
        PENDING.set(writer.pending)

"""Columnar report decoding on a worker thread, every message still applied in arrival order.

How it works: the controller's ingest callback hands each message to `DecodePipeline.submit`
with a function that applies it. A columnar part (FPC1) is decoded on the one worker thread
(pyarrow's IPC reader and validation release the GIL, so the event loop keeps running while it
decodes); any other message is decoded where it is applied, on the loop, since msgpack holds
the GIL and a thread would only add a hop. Messages wait in one FIFO: a message is applied only
when every message received before it has been, so a lifecycle event never overtakes the report
sent before it, and the order the core sees is exactly the order inline decoding gives. The
worker's result returns to the loop with `call_soon_threadsafe`.

With `threads=0` nothing is deferred: `submit` decodes and applies at once, as before.
Whether the thread pays off is measured (docs/benchmarks.md, "Decode off the event loop").
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from shared.errors import WireError
from shared.wire.columnar import ColumnarHandleReport, decode_handle_report_columnar

Decoded = ColumnarHandleReport | WireError | None
"""What the worker made of a columnar part (the part itself or why it is bad); None: decode it
where it is applied."""
Apply = Callable[[Decoded], None]
Pending = Future[ColumnarHandleReport | WireError]


def _decode(data: bytes) -> ColumnarHandleReport | WireError:
    try:
        return decode_handle_report_columnar(data)
    except WireError as exc:  # carried back to the loop and counted there, in order
        return exc


class DecodePipeline:
    __slots__ = ("_closed", "_loop", "_pool", "_queue", "applied_behind")

    def __init__(self, threads: int) -> None:
        self._pool = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="decode") if threads > 0 else None
        )
        self._queue: collections.deque[tuple[Pending | None, Apply]] = collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self.applied_behind = 0
        """Messages that waited for an earlier part's decode (the cost of keeping order)."""

    @property
    def pending(self) -> int:
        return len(self._queue)

    def submit(self, data: bytes, columnar: bool, apply: Apply) -> None:
        """Apply one message (from the event loop): now, or once those before it are applied.
        After `close` (the service stops) messages are dropped: the stream keeps them."""
        if self._closed:
            return
        if self._pool is None:
            apply(None)
            return
        if columnar:
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            fut = self._pool.submit(_decode, bytes(data))
            fut.add_done_callback(self._done)
            self._queue.append((fut, apply))
            return
        if not self._queue:
            apply(None)
            return
        self.applied_behind += 1
        self._queue.append((None, apply))

    def _done(self, _: Pending) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        q = self._queue
        while q:
            fut, apply = q[0]
            if fut is not None and not fut.done():
                return
            q.popleft()
            apply(None if fut is None else fut.result())

    def close(self) -> None:
        """Stop the worker; messages still waiting are dropped (the stream keeps them)."""
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._queue.clear()

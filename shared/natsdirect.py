"""nats-py with two shortcuts for the request path: inline delivery and a same-turn flush.

How it works: nats-py moves every message through two extra tasks. A received message is put on
its subscription's queue and a per-subscription task takes it off and awaits the callback; a
published one is appended to the write buffer and a flusher task, woken through another queue,
writes it out. Each hand-over is a turn of the event loop (a future, a queue, a task step), and
a request/reply crosses four of them (the replica's receive and send, the caller's send and
receive): about 50 us of a 0.35 ms round trip here (docs/benchmarks.md, `request`).
`DirectClient` is nats-py's `Client` with both shortcuts for the subscriptions and publishes
that ask for them, and nats-py's own path for everything else:

- `inline(sub, fn)`: messages of that subscription are handed to `fn(subject, reply, data)`
  straight from the reader task, in order, without the queue and its task. `fn` is plain code
  that must not block (it may start tasks). A message with headers (the server's "no
  responders" status, a user's headers) still takes nats-py's path, so the subscription's own
  callback sees those. What `fn` raises is counted and logged (rate-limited) and the reader
  goes on: one bad message never stops a connection.
- `publish_soon(subject, payload, reply)`: the first message of a loop turn, with nothing
  ahead of it in nats-py's write buffer, is written to the socket at once (a request or a
  reply does not wait for the turn to end); the others of that turn are appended to the
  buffer, as `publish` does, and written together at the end of the turn (`call_soon`), so a
  burst still leaves in one socket write. Order is kept: a message goes straight out only when
  nothing is buffered ahead of it. While the connection is down the buffer is kept and nats-py
  writes it after the reconnect, as for its own publishes. When the socket's send buffer is
  backed up, the write is left to nats-py's flusher, which waits for it to drain:
  back-pressure is kept.

- The reader parses the usual read, whole `MSG`s without headers and nothing left over from
  the read before, with a split of each control line instead of nats-py's regular expressions
  over a copy of the read, and hands an inline subscription's message over without a
  coroutine. Anything else (a message split across reads, `HMSG`, `PING`, `INFO`, `-ERR`, a
  line it does not read as a plain `MSG`) goes, from there on, to nats-py's own parser, which
  also raises on what is malformed.

Both use nats-py internals (`_process_msg`, `_ps`, `_pending`, `_flush_queue`, `_transport`)
that have been stable through the 2.x line; pyproject pins nats-py < 3, tests/unit/
test_natsdirect_parser.py holds the parser to nats-py's on split reads, and tests/integration/
test_natsdirect.py checks each shortcut against a real server, so an upgrade that moves them
fails there first.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Final

from nats.aio.client import Client
from nats.aio.subscription import Subscription
from nats.aio.transport import Transport
from nats.errors import ConnectionClosedError, ConnectionDrainingError, MaxPayloadError
from nats.protocol.command import pub_cmd
from nats.protocol.parser import AWAITING_CONTROL_LINE, MAX_CONTROL_LINE_SIZE, Parser

from shared.bus import RateLimiter

logger = logging.getLogger(__name__)

RawHandler = Callable[[str, str, bytes], None]
"""(subject, reply or "", payload) -> None; runs in the connection's reader."""

SEND_BUFFER_HIGH: Final = 4 * 1024 * 1024
"""Bytes waiting in the socket's send buffer above which the flusher (which drains) writes."""
ERROR_LOG_INTERVAL_S: Final = 1.0


class DirectClient(Client):
    """nats-py's Client with `inline` subscriptions and `publish_soon`."""

    def __init__(self) -> None:
        super().__init__()
        self._ps = DirectParser(self)
        self._inline: dict[int, RawHandler] = {}
        self._flush_due = False
        self.inline_errors = 0
        self._inline_log = RateLimiter(ERROR_LOG_INTERVAL_S)

    def inline(self, sub: Subscription, fn: RawHandler) -> None:
        """Hand `sub`'s messages without headers to `fn` from the reader task."""
        self._inline[sub._id] = fn

    def forget_inline(self, sub: Subscription) -> None:
        self._inline.pop(sub._id, None)

    async def _process_msg(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes
    ) -> None:
        if headers or not self.process_inline(sid, subject, reply, data):
            await super()._process_msg(sid, subject, reply, data, headers)

    def process_inline(self, sid: int, subject: bytes, reply: bytes, data: bytes) -> bool:
        """Hand a message without headers to its inline handler; False when `sid` has none."""
        fn = self._inline.get(sid)
        if fn is None:
            return False
        stats = self.stats
        stats["in_msgs"] += 1
        stats["in_bytes"] += len(data)
        try:
            fn(subject.decode(), reply.decode(), data)
        except Exception:
            self.inline_errors += 1
            if self._inline_log.allow():
                logger.exception(
                    "inline handler failed on %r (%d failures so far)",
                    subject.decode(errors="replace"),
                    self.inline_errors,
                )
        return True

    def publish_soon(self, subject: str, payload: bytes, reply: str = "") -> None:
        """Write a PUB now when nothing is ahead of it in this loop turn, else with the rest of
        the turn at its end (see the module header). Raises nats-py's ConnectionClosedError /
        ConnectionDrainingError / MaxPayloadError as `publish` would; subjects are the caller's
        to validate."""
        if self.is_closed:
            raise ConnectionClosedError
        if self.is_draining_pubs:
            raise ConnectionDrainingError
        if len(payload) > self._max_payload:
            raise MaxPayloadError
        cmd = pub_cmd(subject, reply, payload)
        stats = self.stats
        stats["out_msgs"] += 1
        stats["out_bytes"] += len(payload)
        transport = None if self._pending or self._flush_due else self._writable()
        if transport is not None:
            transport.write(cmd)  # the first of a turn leaves at once: nothing is ahead of it
        else:
            self._pending.append(cmd)
            self._pending_data_size += len(cmd)
        if not self._flush_due:  # the rest of this turn goes at its end, in one write
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._flush_now)

    def _writable(self) -> Transport | None:
        """The transport when connected, with nats-py's flusher running and the socket taking
        what it gets; else None (the flusher, which drains, or the reconnect writes)."""
        task, transport = self._flusher_task, self._transport
        if (
            self.is_connected
            and task is not None
            and not task.done()
            and transport is not None
            and _send_backlog(transport) <= SEND_BUFFER_HIGH
        ):
            return transport
        return None

    def _flush_now(self) -> None:
        self._flush_due = False
        if not self._pending or not self.is_connected:
            return  # nothing left, or the reconnect writes it
        transport = self._writable()
        if transport is None:
            self._kick_flusher()
            return
        try:
            transport.writelines(self._pending)
        except Exception:  # the reader notices a broken socket and reconnects
            logger.debug("direct write failed; left to nats-py", exc_info=True)
            self._kick_flusher()
            return
        self._pending = []
        self._pending_data_size = 0

    def _kick_flusher(self) -> None:
        queue = self._flush_queue
        if queue is not None and queue.empty():
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            queue.put_nowait(fut)


class DirectParser(Parser):
    """nats-py's parser with a quicker path for the usual read (the module header)."""

    nc: DirectClient

    async def parse(self, data: bytes = b"") -> None:
        if self.buf or self.state != AWAITING_CONTROL_LINE or type(data) is not bytes:
            await super().parse(data)  # a message split across reads is under way
            return
        nc, buf, pos, n = self.nc, self.buf, 0, len(data)
        while pos < n and data.startswith(b"MSG ", pos):
            eol = data.find(b"\r\n", pos, pos + MAX_CONTROL_LINE_SIZE)
            if eol < 0:
                break
            parts = data[pos + 4 : eol].split(b" ")
            if len(parts) == 3:
                subject, sid, size = parts
                reply = b""
            elif len(parts) == 4 and parts[2]:
                subject, sid, reply, size = parts
            else:
                break
            if not subject or not sid.isdigit() or not size.isdigit():
                break
            start = eol + 2
            end = start + int(size)
            if end + 2 > n:
                break  # the payload is not all here: nats-py's parser gathers it
            pos = end + 2  # as nats-py's parser: the two bytes after a payload are skipped
            payload, number = data[start:end], int(sid)
            if not nc.process_inline(number, subject, reply, payload):
                await nc._process_msg(number, subject, reply, payload, b"")
                if self.buf is not buf:
                    return  # reset meanwhile (a reconnect): the rest of the read is stale
        if pos < n:
            await super().parse(data[pos:] if pos else data)


def _send_backlog(transport: Any) -> int:
    """Bytes the socket has not taken yet (0 where the transport does not say)."""
    writer = getattr(transport, "_io_writer", None)
    inner = getattr(writer, "transport", None)
    size = getattr(inner, "get_write_buffer_size", None)
    return int(size()) if size is not None else 0

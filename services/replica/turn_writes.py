"""A response's head and body in one send on the replica's HTTP connections.

How it works: uvicorn writes a response's head and its body with two `transport.write` calls,
two sends on the socket. A replica killed between them (SIGKILL, OOM) leaves the load balancer
a started response it can neither finish nor retry: the client gets a truncated 200. And the two
sends cost two syscalls here and two wake-ups in HAProxy. `TurnWriteProtocol` is uvicorn's
httptools protocol with its transport wrapped in a `TurnWriteTransport`, which keeps a write
until the next one (then both leave at once, in one send) or until the end of the loop turn that
wrote it (one `call_soon`), whichever comes first. A unary response (head and body written back
to back by the app's task) leaves in one send, at once, which a kill cannot split. A streamed
response's head leaves with its first chunk when that is written in the same turn, else at the
turn's end; nothing waits longer than the turn that wrote it. (Sending at the turn's end alone
cost a sequential request one more loop iteration, 0.02-0.04 ms: scripts/bench/asgi_model.py.)
A kept bytearray or memoryview is copied: the writer may reuse its buffer once write returns.

`close()` sends what is kept first (uvicorn closes right after writing an error or a `Connection:
close` response); `abort()` drops it, as the transport's own abort does; a transport that is
already closing (the peer left) gets nothing more.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class TurnWriteTransport:
    """A transport that sends a write together with the next one, or at the end of its loop
    turn; the rest is the wrapped transport's own (reads, flow control, extra info,
    `set_protocol` for an upgrade)."""

    __slots__ = ("_held", "_loop", "_scheduled", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | bytearray | memoryview | None = None
        self._scheduled = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        held = self._held
        if held is None:  # kept for what the turn writes next, or for the turn's end
            self._held = data if isinstance(data, bytes) else bytes(data)
            if not self._scheduled:
                self._scheduled = True
                self._loop.call_soon(self.flush)
            return
        self._held = None  # a second write: both leave now, in one send
        if not self._transport.is_closing():
            self._transport.write(b"".join((held, data)))

    def writelines(self, chunks: Any) -> None:
        for data in chunks:
            self.write(data)

    def flush(self) -> None:
        """Send what is kept (at the end of the turn that wrote it; by `close`, at once)."""
        self._scheduled = False
        held = self._held
        if held is None:
            return
        self._held = None
        if not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + (len(self._held) if self._held else 0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class TurnWriteProtocol(HttpToolsProtocol):
    """uvicorn's httptools HTTP/1.1 protocol, writing through a `TurnWriteTransport`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        wrapped = TurnWriteTransport(transport, self.loop)
        super().connection_made(wrapped)  # type: ignore[arg-type]

"""shared/natsdirect.py's parser against nats-py's own: the same calls, in the same order, for
the same bytes however the reads split them; inline subscriptions skip `_process_msg`."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from nats.errors import ProtocolError
from nats.protocol.parser import Parser

from shared.natsdirect import DirectParser

PAYLOAD = bytes(range(256)) * 3
STREAM = b"".join(
    [
        b"MSG _INBOX.abc.1 7 416\r\n" + PAYLOAD[:416] + b"\r\n",
        b"MSG fp.v1.rpc.app.dep.r1 3 _INBOX.xyz.77 434\r\n" + PAYLOAD[:434] + b"\r\n",
        b"PING\r\n",
        b"MSG a.b 3 0\r\n\r\n",  # empty payload
        b"HMSG a.h 3 _INBOX.h 12 17\r\nNATS/1.0\r\n\r\nhello\r\n",
        b"+OK\r\n",
        b"MSG  two.spaces  7  5\r\nhello\r\n",  # legal, not the usual shape: nats-py's parser
        b"MSG tab\t7 3\r\nabc\r\n",
        b"MSG payload.with.crlf 7 6\r\nab\r\ncd\r\n",
        b"PONG\r\n",
        b"MSG last 3 reply.x 1\r\nz\r\n",
    ]
)


class _Conn:
    """What a parser calls on its client, recorded; sid 3 is an inline subscription."""

    def __init__(self, inline: bool) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.inline = inline

    def process_inline(self, sid: int, subject: bytes, reply: bytes, data: bytes) -> bool:
        if not self.inline or sid != 3:
            return False
        self.calls.append(("msg", sid, bytes(subject), bytes(reply), data, None))
        return True

    async def _process_msg(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None
    ) -> None:
        self.calls.append(("msg", sid, bytes(subject), bytes(reply), data, headers or None))

    async def _process_ping(self) -> None:
        self.calls.append(("ping",))

    async def _process_pong(self) -> None:
        self.calls.append(("pong",))

    async def _process_err(self, err: str) -> None:
        self.calls.append(("err", err))

    async def _process_info(self, info: dict[str, Any]) -> None:
        self.calls.append(("info", info))


async def _feed(parser: Parser, data: bytes, rnd: random.Random | None) -> None:
    i = 0
    while i < len(data):
        j = len(data) if rnd is None else min(len(data), i + rnd.randint(1, 600))
        await parser.parse(data[i:j])
        i = j


@pytest.mark.parametrize("inline", [False, True])
def test_same_calls_as_nats_py_whatever_the_reads(inline: bool) -> None:
    async def main() -> None:
        for trial in range(200):
            rnd = None if trial == 0 else random.Random(trial)
            theirs, ours = _Conn(inline), _Conn(inline)
            await _feed(Parser(theirs), STREAM, rnd and random.Random(trial))
            await _feed(DirectParser(ours), STREAM, rnd)
            assert ours.calls == theirs.calls, trial
            assert len(ours.calls) == 10  # +OK calls nothing

    asyncio.run(main())


def test_a_malformed_line_still_raises_nats_py_protocol_error() -> None:
    async def main() -> None:
        parser = DirectParser(_Conn(False))
        await parser.parse(b"MSG ok 3 1\r\nx\r\n")
        with pytest.raises(ProtocolError):
            await parser.parse(b"MSG bad 3 notanumber\r\nBOGUS\r\n")

    asyncio.run(main())


class _Resetting(_Conn):
    """Resets its parser while it handles a message, as a reconnect does."""

    parser: Parser | None = None

    async def _process_msg(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None
    ) -> None:
        self.calls.append(("msg", sid))
        assert self.parser is not None
        self.parser.reset()


def test_a_reset_while_a_message_is_handled_drops_the_rest_of_the_read() -> None:
    async def main() -> None:
        conn = _Resetting(False)
        parser = conn.parser = DirectParser(conn)
        await parser.parse(b"MSG a 1 1\r\nx\r\nMSG b 1 1\r\ny\r\n")
        assert conn.calls == [("msg", 1)]
        assert not parser.buf

    asyncio.run(main())

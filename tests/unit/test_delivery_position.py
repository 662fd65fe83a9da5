"""The controller reads a delivered message's pending count and stored time from its ack subject
itself (services/controller/stream.py): exactly what nats-py's `Msg.metadata` says, both layouts."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.msg import Msg
from nats.errors import NotJSMessageError

from services.controller.stream import delivery_position

counts = st.integers(min_value=0, max_value=2**63 - 1)
stamps = st.integers(min_value=0, max_value=4_102_444_800 * 10**9)  # until 2100, in ns
names = st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True)


@given(names, names, counts, counts, counts, stamps, counts)
def test_the_old_layout(stream: str, consumer: str, dl: int, sseq: int, cseq: int, ts: int,
                        pending: int) -> None:  # fmt: skip
    reply = f"$JS.ACK.{stream}.{consumer}.{dl}.{sseq}.{cseq}.{ts}.{pending}"
    meta = Msg.Metadata._from_reply(reply)
    assert delivery_position(reply) == (meta.num_pending, int(ts) / 1e9)
    assert delivery_position(reply)[1] == pytest.approx(meta.timestamp.timestamp(), abs=1e-5)


@given(names, names, names, counts, counts, counts, stamps, counts, st.booleans())
def test_the_layout_with_domain_and_account(
    domain: str, stream: str, consumer: str, dl: int, sseq: int, cseq: int, ts: int,
    pending: int, random_tail: bool,
) -> None:  # fmt: skip
    reply = f"$JS.ACK.{domain}.ACCHASH.{stream}.{consumer}.{dl}.{sseq}.{cseq}.{ts}.{pending}"
    if random_tail:
        reply += ".r4nd0m"
    meta = Msg.Metadata._from_reply(reply)
    assert delivery_position(reply) == (meta.num_pending, int(ts) / 1e9)


@pytest.mark.parametrize(
    "reply",
    ["", "_INBOX.abc", "$JS.ACK.s.c.1.2.3", "$JS.ACK.d.h.s.c.1.2.3.4", "$JS.NAK.s.c.1.2.3.4.5"],
)
def test_anything_else_is_not_a_jetstream_delivery(reply: str) -> None:
    with pytest.raises(NotJSMessageError):
        delivery_position(reply)

"""http_address: the rule (shared.wire.address), the Lifecycle field and the Member field."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.errors import UsageError, WireError
from shared.kv import envelope
from shared.kv.membership import Member, MembershipView
from shared.wire import codec, reasons
from shared.wire.address import format_http_address, http_address_problem
from shared.wire.messages import Lifecycle

READY = Lifecycle(
    "r-1", "agent-1", "ready", 1.0, "fp.v1.rpc.shop.api.r-1", "v1", None, "shop", "api", 5
)
MEMBER = Member("shop", "api", 0, "r-1", "fp.v1.rpc.shop.api.r-1", 0, 1)

GOOD = ["127.0.0.1:8080", "host:1", "h.example.com:65535", "[::1]:8080", "[fe80::1%eth0]:443"]
BAD = [
    "", "127.0.0.1", ":8080", "h:0", "h:65536", "h:080", "h:-1", "h:8o", "h: 80", "h :80",
    "::1:80", "[::1:80", "::1]:80", "http://h:80", "h:80/x", "user@h:80", "h:", "h:123456",
    "x" * 400 + ":80", "h:٣", "[h:80]:1", "[]:80", "[::1%]:80", "[1.2.3.4]:80",
]  # fmt: skip


@pytest.mark.parametrize("value", GOOD)
def test_good_addresses(value: str) -> None:
    assert http_address_problem(value) is None


@pytest.mark.parametrize("value", BAD)
def test_bad_addresses(value: str) -> None:
    assert http_address_problem(value) is not None


def test_format_brackets_an_ipv6_host_and_refuses_a_bad_port() -> None:
    assert format_http_address("::1", 80) == "[::1]:80"
    assert format_http_address("10.0.0.1", 41234) == "10.0.0.1:41234"
    with pytest.raises(ValueError, match="port"):
        format_http_address("h", 0)
    with pytest.raises(ValueError, match="host"):
        format_http_address("", 80)


_HOSTS = st.one_of(
    st.from_regex(r"[a-z0-9][a-z0-9.-]{0,40}", fullmatch=True),
    st.ip_addresses().map(str),
)


@given(_HOSTS, st.integers(1, 65535))
def test_format_gives_an_address_every_reader_takes(host: str, port: int) -> None:
    value = format_http_address(host, port)
    assert http_address_problem(value) is None
    assert value.rpartition(":")[2] == str(port)
    msg = dataclasses.replace(READY, http_address=value)
    assert codec.decode(codec.encode(msg)) == msg
    member = dataclasses.replace(MEMBER, http_address=value)
    assert envelope.decode(envelope.encode(member), Member) == member


@given(st.text(max_size=30))
def test_the_decoders_agree_with_the_rule(value: str) -> None:
    wire = msgpack.packb({**codec.to_wire_map(READY), "http_address": value})
    doc = envelope.encode(MEMBER)[:-1] + b',"http_address":' + _json(value) + b"}"
    if http_address_problem(value) is None:
        assert codec.decode(wire).http_address == value  # type: ignore[union-attr]
        assert envelope.decode(doc, Member).http_address == value
    else:
        with pytest.raises(WireError) as exc:
            codec.decode(wire)
        assert exc.value.reason == reasons.BAD_VALUE
        with pytest.raises(WireError) as exc:
            envelope.decode(doc, Member)
        assert exc.value.reason == reasons.BAD_VALUE


def _json(value: str) -> bytes:
    import json

    return json.dumps(value).encode()


def test_lifecycle_without_it_is_byte_for_byte_what_older_senders_wrote() -> None:
    assert "http_address" not in codec.to_wire_map(READY)
    with_it = dataclasses.replace(READY, http_address="10.0.0.7:41234")
    assert codec.to_wire_map(with_it)["http_address"] == "10.0.0.7:41234"
    assert codec.decode(codec.encode(READY)).http_address is None  # type: ignore[union-attr]
    nil = msgpack.packb({**codec.to_wire_map(READY), "http_address": None})
    assert codec.decode(nil) == READY


def test_lifecycle_http_address_of_the_wrong_type() -> None:
    wire = msgpack.packb({**codec.to_wire_map(READY), "http_address": 8080})
    with pytest.raises(WireError) as exc:
        codec.decode(wire)
    assert exc.value.reason == reasons.WRONG_TYPE
    assert "http_address" in exc.value.detail


def test_member_carries_it_and_old_values_still_decode() -> None:
    assert "http_address" not in MEMBER.to_doc()
    old = envelope.encode(MEMBER)
    assert envelope.decode(old, Member).http_address is None
    served = dataclasses.replace(MEMBER, http_address="[::1]:9000")
    assert served.to_doc()["http_address"] == "[::1]:9000"
    assert envelope.decode(envelope.encode(served), Member) == served


def test_member_refuses_a_bad_address_in_process() -> None:
    with pytest.raises(UsageError, match="http_address"):
        dataclasses.replace(MEMBER, http_address="nohost")


def test_member_http_address_of_the_wrong_type() -> None:
    doc = envelope.encode(MEMBER)[:-1] + b',"http_address":80}'
    with pytest.raises(WireError) as exc:
        envelope.decode(doc, Member)
    assert exc.value.reason == reasons.WRONG_TYPE


def test_a_router_view_sees_a_new_address_as_a_change() -> None:
    view = MembershipView("shop", "api")
    assert view.put(MEMBER.key, MEMBER)
    assert not view.put(MEMBER.key, dataclasses.replace(MEMBER, epoch=2))
    moved = dataclasses.replace(MEMBER, epoch=3, http_address="10.0.0.7:1234")
    assert view.put(MEMBER.key, moved)
    assert view.members()[0].http_address == "10.0.0.7:1234"

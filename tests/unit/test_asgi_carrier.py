"""The NATS carrier's translation (services/replica/asgi_carrier.py): HttpRequest <-> ASGI scope
and ASGI response events -> the chunks of a response stream, as properties and by example."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.requests import Request as StarletteRequest

from services.replica.asgi_carrier import (
    AsgiProtocolError,
    ResponseFrames,
    ScopeError,
    request_of,
    root_path_for,
    scope_of,
)
from shared.errors import WireError
from shared.wire import decode_as
from shared.wire.messages import HttpRequest, HttpResponse

TOKEN = st.text(alphabet="!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFXYZ", min_size=1, max_size=12)  # fmt: skip
LATIN1_VALUE = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"),
    max_size=30,
)
SEGMENT = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=8)
PATH = st.lists(SEGMENT, max_size=4).map(lambda parts: "/" + "/".join(quote(p) for p in parts))
QUERY = st.text(alphabet="abcxyz=&%20+0123456789", max_size=20)
HEADERS = st.lists(st.tuples(TOKEN, LATIN1_VALUE), max_size=6).map(tuple)

REQUESTS = st.builds(
    HttpRequest,
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "X-CUSTOM"]),
    path=PATH,
    query=QUERY,
    headers=HEADERS,
    body=st.binary(max_size=64),
)


@given(REQUESTS)
def test_a_request_round_trips_through_its_scope(req: HttpRequest) -> None:
    back = request_of(scope_of(req), req.body)
    lowered = tuple((k.lower(), v) for k, v in req.headers)
    assert back == HttpRequest(req.method, req.path, req.query, lowered, req.body)


@given(REQUESTS)
def test_starlette_reads_the_scope_as_the_request_said(req: HttpRequest) -> None:
    request = StarletteRequest(scope_of(req))
    assert request.method == req.method
    assert request.scope["raw_path"] == req.path.encode()
    assert request.url.query == req.query
    for name, value in req.headers:
        assert value in request.headers.getlist(name)


@given(st.text(max_size=20), PATH)
def test_a_bad_method_is_a_typed_error(method: str, path: str) -> None:
    req = HttpRequest(method, path, "", (), b"")
    try:
        scope_of(req)
    except ScopeError as exc:
        assert isinstance(exc, WireError) and exc.reason == "bad_http_request"
    else:
        assert method and all(
            c.isascii() and (c.isalnum() or c in "!#$%&'*+-.^_`|~") for c in method
        )


@pytest.mark.parametrize(
    "req",
    [
        HttpRequest("GET", "no-slash", "", (), b""),
        HttpRequest("GET", "/a\r\nb", "", (), b""),
        HttpRequest("GET", "/", "", (("bad name", "v"),), b""),
        HttpRequest("GET", "/", "", (("x", "a\nb"),), b""),
        HttpRequest("G T", "/", "", (), b""),
    ],
)
def test_malformed_requests_raise_scope_error(req: HttpRequest) -> None:
    with pytest.raises(ScopeError):
        scope_of(req)


def test_forwarded_headers_give_client_scheme_and_root_path() -> None:
    req = HttpRequest(
        "GET", "/shop/a%2Fb", "x=1",
        (("X-Forwarded-For", "10.0.0.1, 127.0.0.9"), ("X-Forwarded-Proto", "https"),
         ("X-Forwarded-Prefix", "/shop")),
        b"",
    )  # fmt: skip
    scope = scope_of(req)
    assert scope["client"] == ("127.0.0.9", 0) and scope["scheme"] == "https"
    assert scope["root_path"] == "/shop" and scope["path"] == "/shop/a/b"
    assert scope_of(req, route_prefix="/other")["root_path"] == ""
    assert StarletteRequest(scope).url.path == "/shop/a/b"


@pytest.mark.parametrize(
    ("path", "prefix", "root"),
    [("/a/b", "/a", "/a"), ("/a", "/a", "/a"), ("/ab", "/a", ""), ("/a/b", "/", ""),
     ("/a/b", None, ""), ("/a/b", "/a/", "/a")],
)  # fmt: skip
def test_root_path_only_for_paths_under_the_prefix(
    path: str, prefix: str | None, root: str
) -> None:
    assert root_path_for(path, prefix) == root


BODY_EVENTS = st.lists(st.tuples(st.binary(max_size=16), st.booleans()), max_size=6)


def events_of(status: int, parts: list[tuple[bytes, bool]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"type": "http.response.start", "status": status, "headers": [(b"x-k", b"v\xe9")]}
    ]
    out += [{"type": "http.response.body", "body": b, "more_body": True} for b, _ in parts]
    out.append({"type": "http.response.body", "body": b"end", "more_body": False})
    return out


@given(st.integers(100, 599), BODY_EVENTS, st.booleans())
def test_response_events_become_chunks_that_carry_the_whole_body(
    status: int, parts: list[tuple[bytes, bool]], collect: bool
) -> None:
    frames = ResponseFrames(collect)
    chunks: list[bytes] = []
    for event in events_of(status, parts):
        chunks += frames.feed(event)
    assert frames.complete
    head = decode_as(chunks[0], HttpResponse)
    assert head.status == status and head.headers == (("x-k", "vé"),)
    body = head.body + b"".join(chunks[1:])
    assert body == b"".join(b for b, _ in parts) + b"end"
    if collect or not parts:
        assert len(chunks) == 1  # unary callers (the gateway) read chunk 0 only
    assert all(chunks[1:])  # no empty chunk goes out


@pytest.mark.parametrize(
    "events",
    [
        [{"type": "http.response.body", "body": b"x"}],
        [{"type": "http.response.start", "status": 200}] * 2,
        [{"type": "http.response.start", "status": 99}],
        [{"type": "http.response.start", "status": 200, "headers": [("str", "str")]}],
        [{"type": "http.response.start", "status": 200},
         {"type": "http.response.body", "body": "text"}],
        [{"type": "http.response.start", "status": 200}, {"type": "http.response.body"},
         {"type": "http.response.body"}],
        [{"type": "websocket.send"}],
    ],
)  # fmt: skip
def test_events_out_of_order_are_protocol_errors(events: list[dict[str, Any]]) -> None:
    frames = ResponseFrames(False)
    with pytest.raises(AsgiProtocolError):
        for event in events:
            frames.feed(event)

"""The NATS carrier of HTTP requests, as ASGI: `HttpRequest` -> scope, ASGI send events -> chunks.

Requests held by the Python proxy and the gateway's HTTP-style calls reach a replica as one
`HttpRequest` (body kind `http`, docs/dataplane.md). The replica hands them to the same ASGI app
its HTTP server runs (asgi.py), so user code sees one request model whichever carrier brought
the request. This module is the pure translation, no I/O:

- `scope_of(req, root_path)`: the ASGI HTTP scope. `path` is the percent-decoded path, `raw_path`
  the path as sent, `root_path` the app's route prefix (the path keeps it, as Ray Serve and
  Starlette expect: routing strips it), header names lower-cased, `client` the last address of
  `X-Forwarded-For` (the proxy appends the client's), `scheme` from `X-Forwarded-Proto`. A request
  no HTTP server would have accepted (a method that is not a token, a path without a leading
  `/`, a header name that is not a token, CR/LF/NUL in a value) raises `ScopeError`.
- `request_of(scope, body)`: the inverse (tests, and callers that build scopes themselves).
- `ResponseFrames`: folds the app's `http.response.start` / `http.response.body` events into the
  chunk payloads the stream carries: one encoded `HttpResponse` when the body came in one event
  or when the caller wants it whole (`collect`: the gateway's unary calls); otherwise chunk 0 is
  the head (status, headers, the first body part) and every later non-empty body part is a
  chunk of raw bytes, sent as the app produces it. Events out of order raise `AsgiProtocolError`.

The wire messages are unchanged: the scope needs nothing `HttpRequest` does not carry.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import unquote

from shared.errors import WireError
from shared.wire import encode
from shared.wire.messages import HttpRequest, HttpResponse

ASGI_VERSION: Final = {"version": "3.0", "spec_version": "2.3"}
_TOKEN: Final = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_BAD_VALUE: Final = re.compile(r"[\r\n\x00]")


class ScopeError(WireError):
    """An `HttpRequest` that cannot become an ASGI scope (reason `bad_http_request`)."""

    def __init__(self, detail: str) -> None:
        super().__init__("bad_http_request", detail)


class AsgiProtocolError(RuntimeError):
    """The app sent ASGI events out of order or of the wrong shape."""


def _header_bytes(value: str) -> bytes:
    # HTTP header values are bytes; latin-1 keeps every byte a server received as it was. A
    # gateway caller's NATS header may hold other characters: those travel as UTF-8
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        return value.encode("utf-8")


def root_path_for(path: str, prefix: str | None) -> str:
    """The scope's root_path: the route prefix when the path is under it, else ""."""
    if not prefix or prefix == "/":
        return ""
    prefix = prefix.rstrip("/")
    if path == prefix or path.startswith(prefix + "/"):
        return prefix
    return ""


def _last_forwarded(headers: tuple[tuple[str, str], ...], name: str) -> str | None:
    found = None
    for key, value in headers:
        if key.lower() == name:
            found = value
    if found is None:
        return None
    last = found.rsplit(",", 1)[-1].strip()
    return last or None


def scope_of(req: HttpRequest, *, route_prefix: str | None = None) -> dict[str, Any]:
    """The ASGI HTTP scope for a carried request; `route_prefix` None: the request's own
    `X-Forwarded-Prefix` (the proxy sets it to the app's route prefix)."""
    if not _TOKEN.match(req.method):
        raise ScopeError(f"method {req.method[:40]!r} is not an HTTP token")
    if not req.path.startswith("/") and not (req.path == "*" and req.method == "OPTIONS"):
        raise ScopeError(f"path {req.path[:80]!r} does not start with '/'")
    if _BAD_VALUE.search(req.path) or _BAD_VALUE.search(req.query):
        raise ScopeError("CR, LF or NUL in the path or query")
    headers: list[tuple[bytes, bytes]] = []
    for name, value in req.headers:
        if not _TOKEN.match(name):
            raise ScopeError(f"header name {name[:40]!r} is not an HTTP token")
        if _BAD_VALUE.search(value):
            raise ScopeError(f"header {name!r}: CR, LF or NUL in the value")
        headers.append((name.lower().encode("ascii"), _header_bytes(value)))
    prefix = route_prefix
    if prefix is None:
        prefix = _last_forwarded(req.headers, "x-forwarded-prefix")
    client = _last_forwarded(req.headers, "x-forwarded-for")
    scheme = _last_forwarded(req.headers, "x-forwarded-proto") or "http"
    return {
        "type": "http",
        "asgi": dict(ASGI_VERSION),
        "http_version": "1.1",
        "method": req.method,
        "scheme": scheme if scheme in ("http", "https") else "http",
        "path": unquote(req.path),
        "raw_path": req.path.encode("utf-8"),
        "query_string": req.query.encode("utf-8"),
        "root_path": root_path_for(req.path, prefix),
        "headers": headers,
        "client": None if client is None else (client, 0),
        "server": None,
        "state": {},
    }


def request_of(scope: dict[str, Any], body: bytes) -> HttpRequest:
    """The `HttpRequest` a scope and its body stand for (header names as the scope has them)."""
    raw = scope.get("raw_path")
    path = raw.decode("utf-8") if isinstance(raw, bytes) else str(scope["path"])
    headers = tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"])
    query = scope.get("query_string", b"")
    return HttpRequest(str(scope["method"]), path, query.decode("utf-8"), headers, body)


def response_headers(raw: Any) -> tuple[tuple[str, str], ...]:
    try:
        return tuple((bytes(k).decode("latin-1"), bytes(v).decode("latin-1")) for k, v in raw)
    except (TypeError, ValueError) as exc:
        raise AsgiProtocolError(f"response headers must be (bytes, bytes) pairs: {exc}") from None


@dataclass(slots=True)
class ResponseFrames:
    """The app's response events -> the chunk payloads of the response stream (see top)."""

    collect: bool
    status: int | None = None
    headers: tuple[tuple[str, str], ...] = ()
    sent_head: bool = False
    complete: bool = False
    _parts: list[bytes] = field(default_factory=list)

    @property
    def started(self) -> bool:
        return self.status is not None

    def feed(self, message: Mapping[str, Any]) -> list[bytes]:
        kind = message.get("type")
        if self.complete:
            raise AsgiProtocolError(f"{kind!r} after the response was complete")
        if kind == "http.response.start":
            if self.started:
                raise AsgiProtocolError("http.response.start sent twice")
            status = message.get("status")
            if not isinstance(status, int) or not 100 <= status <= 599:
                raise AsgiProtocolError(f"bad response status {status!r}")
            self.status = status
            self.headers = response_headers(message.get("headers", ()))
            return []
        if kind != "http.response.body":
            raise AsgiProtocolError(f"unexpected ASGI message type {kind!r}")
        if self.status is None:
            raise AsgiProtocolError("http.response.body before http.response.start")
        body = message.get("body", b"")
        if not isinstance(body, bytes | bytearray | memoryview):
            raise AsgiProtocolError(f"response body must be bytes, not {type(body).__name__}")
        more = bool(message.get("more_body", False))
        if self.collect or (not self.sent_head and not more):
            if body:
                self._parts.append(bytes(body))
            if more:
                return []
            self.complete = True
            whole = b"".join(self._parts)
            self._parts.clear()
            return [encode(HttpResponse(self.status, self.headers, whole))]
        self.complete = not more
        if not self.sent_head:
            self.sent_head = True
            # more: the proxy sends this part at once rather than read on to see if it is all
            return [encode(HttpResponse(self.status, self.headers, bytes(body), more))]
        return [bytes(body)] if body else []

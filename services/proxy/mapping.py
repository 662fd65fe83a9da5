"""How an HTTP request becomes the deployment's `HttpRequest`, and its `HttpResponse` the
client's response headers (docs/proxy.md, "What the deployment receives").

- Request: the method; the raw, still percent-encoded path (the route prefix is not stripped)
  and query string; every header in order with repeats, except the hop-by-hop ones, which are
  about one connection and not the request (RFC 9110, 7.6.1); `X-Forwarded-For` gets the client
  address appended, `X-Forwarded-Proto` keeps an outer proxy's value (else the scheme), and
  `X-Forwarded-Prefix` is set to the app's route prefix; the body as read.
- Response headers: in order with repeats, minus those that cannot be carried, the hop-by-hop
  ones and the framing ones (the proxy frames what it sends).
"""

from __future__ import annotations

from typing import Final

from aiohttp import web
from multidict import CIMultiDict

from services.proxy.registry import Route
from services.router.http import response_header_items
from shared.wire.messages import HttpRequest, HttpResponse

HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
"""Headers about one connection, not the request: never passed on (RFC 9110, 7.6.1)."""
SET_BY_SERVER: Final = frozenset({"content-length", "transfer-encoding"})
"""Response framing: the proxy frames the response it sends, whatever the user code said."""
X_FORWARDED_FOR: Final = "X-Forwarded-For"
X_FORWARDED_PROTO: Final = "X-Forwarded-Proto"
X_FORWARDED_PREFIX: Final = "X-Forwarded-Prefix"


def to_http_request(
    request: web.Request, route: Route, body: bytes, *, behind_front: bool = False
) -> HttpRequest:
    """The `HttpRequest` the deployment gets: method, the raw (still percent-encoded) path and
    query, the headers in order with repeats (hop-by-hop ones dropped, X-Forwarded-* set), and
    the body. `behind_front`: the request came through the HAProxy front door, which already
    appended the client's address to X-Forwarded-For (ours would be the front door's)."""
    headers: list[tuple[str, str]] = []
    forwarded_for: list[str] = []
    proto = request.scheme
    for name, value in request.headers.items():
        lower = name.lower()
        if lower in HOP_BY_HOP or lower == "x-forwarded-prefix":
            continue
        if lower == "x-forwarded-for":
            forwarded_for.append(value)
            continue
        if lower == "x-forwarded-proto":
            proto = value  # an outer proxy knows the client's scheme better than we do
            continue
        headers.append((name, value))
    if request.remote and not behind_front:
        forwarded_for.append(request.remote)
    if forwarded_for:
        headers.append((X_FORWARDED_FOR, ", ".join(forwarded_for)))
    headers.append((X_FORWARDED_PROTO, proto))
    headers.append((X_FORWARDED_PREFIX, route.route_prefix or "/"))
    url = request.rel_url
    return HttpRequest(request.method, url.raw_path, url.raw_query_string, tuple(headers), body)


def to_response_headers(response: HttpResponse) -> CIMultiDict[str]:
    """The deployment's response headers, repeats kept; framing and hop-by-hop ones dropped."""
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in response_header_items(response):
        lower = name.lower()
        if lower not in HOP_BY_HOP and lower not in SET_BY_SERVER:
            out.add(name, value)
    return out

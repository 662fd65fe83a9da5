"""The multiplexed model an HTTP request names: Ray Serve's `serve_multiplexed_model_id` header.

Shared by the replica (user code reads it with `serve.get_multiplexed_model_id()`) and the
routers that forward HTTP (the Python proxy and the gateway route a model's requests to a
replica holding it). Ray's proxy and replica match the name in any case and with `-` for `_`;
so do we. ASGI servers hand header names over lowercased, so the usual look costs one length
compare per header.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

MULTIPLEXED_MODEL_ID_HEADER: Final = "serve_multiplexed_model_id"
_LEN: Final = len(MULTIPLEXED_MODEL_ID_HEADER)


def _is_model_header(name: str | bytes) -> bool:
    if len(name) != _LEN:  # the cheap test first: nearly every header stops here
        return False
    text = name.decode("latin-1") if isinstance(name, bytes) else name
    return text.lower().replace("-", "_") == MULTIPLEXED_MODEL_ID_HEADER


def model_id_from_headers(headers: Iterable[tuple[str | bytes, str | bytes]]) -> str | None:
    """The model id named by the `serve_multiplexed_model_id` header (any case, `-` or `_`);
    None when absent or empty. Takes ASGI scope headers (bytes pairs) or str pairs."""
    for name, value in headers:
        if len(name) == _LEN and _is_model_header(name):  # inlined: nearly every header stops
            text = value.decode("latin-1") if isinstance(value, bytes) else value
            return text.strip() or None
    return None

"""User values on the wire: call arguments and results (docs/wire.md "User values").

Anything msgpack holds natively, plus numpy, which Ray Serve apps pass and return freely (its
batching guide returns `np.array(batch) * 2` through a handle):

- a numpy array is ext type 1: a msgpack array `[dtype, shape, data]`, where `dtype` is numpy's
  `dtype.str` (`"<i8"`, `"|b1"`, ...; object dtypes refused), `shape` an array of ints and `data`
  the C-order bytes. It decodes as a writable numpy array of that dtype and shape.
- a numpy scalar (`np.int64(3)`) is written as the Python number it holds.

numpy is imported only where an array is met (replicas that never see one do not load it), and
nothing else is guessed at: any other type is refused by name, as before.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Final

import msgpack

NDARRAY_EXT: Final = 1


def _default(value: Any) -> Any:
    np = sys.modules.get("numpy")  # an array exists only if numpy is loaded already
    if np is not None:
        if isinstance(value, np.ndarray):
            if value.dtype.hasobject:
                raise TypeError("a numpy array of Python objects cannot be sent; use a list")
            # tobytes is C order whatever the layout (ascontiguousarray would make 0-d 1-d)
            body = msgpack.packb([value.dtype.str, list(value.shape), value.tobytes()])
            return msgpack.ExtType(NDARRAY_EXT, body)
        if isinstance(value, np.generic):
            return value.item()
    raise TypeError(f"can not serialize {type(value).__module__}.{type(value).__qualname__}")


def _ext_hook(code: int, data: bytes) -> Any:
    if code != NDARRAY_EXT:
        return msgpack.ExtType(code, data)  # as before: an opaque value
    import numpy as np

    try:
        dtype, shape, body = msgpack.unpackb(data)
        dt = np.dtype(dtype)
        if dt.hasobject:
            raise ValueError("object dtype")
        return np.frombuffer(body, dtype=dt).reshape(tuple(shape)).copy()
    except Exception as exc:  # a malformed array is malformed input, whatever numpy says
        raise ValueError(f"ext type 1 is not a numpy array: {exc}") from None


class _Packers(threading.local):
    packer: msgpack.Packer | None = None


_PACKERS = _Packers()
KEEP_PACKER_BYTES: Final = 256 * 1024
"""msgpack's own starting buffer: a packer is kept only while it never grew past that (a grown
buffer stays allocated: one 50 MB result would keep 50 MB per thread)."""


def pack(value: Any) -> bytes:
    """A user value as msgpack (TypeError names what cannot be sent). Also packs whole wire
    maps for codec.encode (the same options).

    A packer is kept per thread: `msgpack.packb` builds one, and its buffer, on every call,
    half the cost of packing a request. It is taken while it packs, so a pack that runs Python
    meanwhile (the `default` hook, a finalizer) and packs again makes one of its own; it is
    dropped when it raised or grew."""
    local = _PACKERS
    packer = local.packer
    if packer is None:
        packer = msgpack.Packer(use_bin_type=True, default=_default)
    else:
        local.packer = None
    data: bytes = packer.pack(value)
    if len(data) <= KEEP_PACKER_BYTES:
        local.packer = packer
    return data


def unpack(data: bytes) -> Any:
    """A user value from msgpack (map keys need not be strings)."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_ext_hook)


PACK_DEFAULT: Final = _default
"""For encoders of whole messages that carry user values (CallArgs)."""
EXT_HOOK: Final = _ext_hook

"""User values (shared/wire/uservalues.py): numpy arrays as ext type 1, numpy scalars as
numbers, everything else as msgpack has it; malformed arrays are malformed input."""

from __future__ import annotations

import subprocess
import sys

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from shared.errors import WireError
from shared.wire import decode, encode, reasons, uservalues
from shared.wire.messages import CallArgs

DTYPES = st.one_of(
    hnp.integer_dtypes(), hnp.unsigned_integer_dtypes(), hnp.floating_dtypes(),
    hnp.boolean_dtypes(), hnp.complex_number_dtypes(),
)  # fmt: skip


@given(hnp.arrays(DTYPES, hnp.array_shapes(min_dims=0, max_dims=3, max_side=4)))
def test_an_array_comes_back_with_its_dtype_shape_and_values(arr: np.ndarray) -> None:
    back = uservalues.unpack(uservalues.pack({"x": [arr]}))["x"][0]
    assert back.dtype == arr.dtype and back.shape == arr.shape
    assert back.tobytes() == arr.tobytes() and back.flags.writeable


def test_views_go_in_c_order_and_scalars_as_numbers() -> None:
    arr = np.arange(12).reshape(3, 4).T  # not contiguous
    assert (uservalues.unpack(uservalues.pack(arr)) == arr).all()
    assert uservalues.unpack(uservalues.pack([np.int64(3), np.float32(0.5), np.bool_(True)])) == [
        3,
        0.5,
        True,
    ]


def test_what_cannot_be_sent_is_named() -> None:
    with pytest.raises(TypeError, match="Python objects"):
        uservalues.pack(np.array([object()]))
    with pytest.raises(TypeError, match="Graph"):

        class Graph:
            pass

        uservalues.pack(Graph())


def test_call_arguments_carry_arrays_and_a_malformed_array_is_malformed_input() -> None:
    call = decode(encode(CallArgs((np.array([1, 2]),), {"w": np.ones(2, np.float32)})))
    assert isinstance(call, CallArgs) and (call.args[0] == [1, 2]).all()
    assert call.kwargs["w"].dtype == np.float32
    bad = msgpack.ExtType(uservalues.NDARRAY_EXT, msgpack.packb(["<i8", [3], b"\x00"]))
    data = msgpack.packb({"v": 1, "kind": "args", "args": [bad], "kwargs": {}})
    with pytest.raises(WireError) as exc:
        decode(data)
    assert exc.value.reason == reasons.MALFORMED
    other = msgpack.ExtType(5, b"x")  # other ext types stay opaque, as before
    data = msgpack.packb({"v": 1, "kind": "args", "args": [other], "kwargs": {}})
    assert decode(data) == CallArgs((other,), {})


def test_numpy_is_not_loaded_until_an_array_arrives() -> None:
    code = (
        "import sys; from shared.wire import uservalues as u; "
        "assert u.unpack(u.pack({'a': [1, b'x']})) == {'a': [1, b'x']}; "
        "assert 'numpy' not in sys.modules, 'numpy loaded'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)

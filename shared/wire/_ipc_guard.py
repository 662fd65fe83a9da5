"""Shape check of an Arrow IPC stream before pyarrow materialises any batch from it.

Why: pyarrow reads uncompressed IPC zero-copy from the payload, so nothing it allocates can
outgrow the payload, with one exception: a compressed body declares its uncompressed length in
the body itself, and the reader allocates that much before it finds out the data is short. A
60-byte hostile payload could ask for terabytes. So before reading batches we walk the messages
and peek into the RecordBatch table for the `compression` field, refusing any compressed body.
The same walk enforces the FPC1 shape: one schema message, then dictionary batches, then exactly
one record batch.

How: the walk frames messages itself, with the rules of Arrow's stream reader (arrow/ipc
message.cc, `DecodeMessage`): a 0xFFFFFFFF continuation then an int32 metadata length, or a
positive legacy length alone; a length of 0 is end-of-stream (so is no byte at all where a
message would start); a negative one, or fewer bytes than a length or a body declares, is an
error. It reads the flatbuffer fields it needs with bounds-checked `struct` reads and does not
verify the rest: pyarrow verifies every flatbuffer before it uses it, reading the same messages
in the same order, so a message it accepts is one whose fields this walk read correctly, and one
it rejects stops it before its body is touched. (pyarrow's own MessageReader did the same walk at
about twice the cost, most of a narrow report's fixed decode cost.)

Flatbuffer layout used here (Arrow format/Message.fbs): the root uoffset at byte 0 points at the
Message table; a table starts with an soffset to its vtable; vtable = [u16 vtable size, u16
table size, u16 offset of field 0, field 1, ...], offset 0 meaning absent. Message fields:
1 header_type (u8: 1 Schema, 2 DictionaryBatch, 3 RecordBatch), 2 header (uoffset),
3 bodyLength (i64). RecordBatch field 3 is `compression`; DictionaryBatch field 1 is its
RecordBatch `data`.
"""

from __future__ import annotations

import struct

import pyarrow as pa

from shared.errors import WireError
from shared.wire import reasons
from shared.wire.limits import MAX_IPC_MESSAGES

_SCHEMA, _DICTIONARY_BATCH, _RECORD_BATCH = 1, 2, 3
_MSG_HEADER_TYPE, _MSG_HEADER, _MSG_BODY_LENGTH = 1, 2, 3
_RB_COMPRESSION = 3
_DB_DATA = 1
_CONTINUATION = -1

_I32 = struct.Struct("<i").unpack_from
_U32 = struct.Struct("<I").unpack_from
_U16 = struct.Struct("<H").unpack_from
_U8 = struct.Struct("<B").unpack_from
_I64 = struct.Struct("<q").unpack_from
_U16X3 = struct.Struct("<3H").unpack_from
_MSG_SLOTS_START = 4 + 2 * _MSG_HEADER_TYPE
_MSG_SLOTS_END = 4 + 2 * (_MSG_BODY_LENGTH + 1)
"""vtable bytes of Message fields header_type, header and bodyLength (consecutive)."""


def _vtable(fb: memoryview, table: int) -> tuple[int, int]:
    """(position, size in bytes) of a table's vtable."""
    (soffset,) = _I32(fb, table)
    vtable = table - soffset
    if vtable < 0:  # struct would count a negative offset from the end
        raise ValueError("IPC flatbuffer vtable before its buffer")
    size: int = _U16(fb, vtable)[0]
    return vtable, size


def _field_pos(fb: memoryview, table: int, index: int) -> int | None:
    vtable, vtable_size = _vtable(fb, table)
    slot = 4 + 2 * index
    if slot + 2 > vtable_size:
        return None
    offset: int = _U16(fb, vtable + slot)[0]
    return table + offset if offset else None


def _deref(fb: memoryview, pos: int) -> int:
    uoffset: int = _U32(fb, pos)[0]
    return pos + uoffset


def _message(fb: memoryview) -> tuple[int, int | None, int]:
    """(header type, position of the header table, body length) of one Message flatbuffer."""
    root = _deref(fb, 0)
    vtable, vtable_size = _vtable(fb, root)
    if vtable_size >= _MSG_SLOTS_END:  # the usual vtable: the three slots in one read
        type_off, header_off, body_off = _U16X3(fb, vtable + _MSG_SLOTS_START)
    else:
        type_off, header_off, body_off = (
            _U16(fb, vtable + slot)[0] if slot + 2 <= vtable_size else 0
            for slot in range(_MSG_SLOTS_START, _MSG_SLOTS_END, 2)
        )
    header_type: int = _U8(fb, root + type_off)[0] if type_off else 0
    body_length: int = _I64(fb, root + body_off)[0] if body_off else 0
    return header_type, _deref(fb, root + header_off) if header_off else None, body_length


def _is_compressed(fb: memoryview, header_type: int, header: int | None) -> bool:
    if header is None:
        raise WireError(reasons.BAD_SCHEMA, "IPC batch message without a header")
    record_batch = header
    if header_type == _DICTIONARY_BATCH:
        data_pos = _field_pos(fb, header, _DB_DATA)
        if data_pos is None:
            raise WireError(reasons.BAD_SCHEMA, "IPC dictionary batch without data")
        record_batch = _deref(fb, data_pos)
    return _field_pos(fb, record_batch, _RB_COMPRESSION) is not None


def _check_message(
    count: int, fb: memoryview, header_type: int, header: int | None, record_batches: int
) -> int:
    """The shape rules for the `count`-th message; returns the record batches seen so far."""
    if count > MAX_IPC_MESSAGES:
        raise WireError(reasons.BAD_SCHEMA, f"more than {MAX_IPC_MESSAGES} IPC messages")
    if count == 1:
        if header_type != _SCHEMA:
            raise WireError(reasons.BAD_SCHEMA, "IPC stream does not start with a schema")
        return record_batches
    if header_type not in (_DICTIONARY_BATCH, _RECORD_BATCH):
        raise WireError(reasons.BAD_SCHEMA, f"unexpected IPC message type {header_type}")
    if record_batches:
        raise WireError(reasons.BAD_SCHEMA, "IPC stream continues after its record batch")
    if _is_compressed(fb, header_type, header):
        raise WireError(reasons.BAD_SCHEMA, "compressed IPC bodies are not accepted")
    return record_batches + (header_type == _RECORD_BATCH)


def _check_end(count: int, record_batches: int) -> None:
    if count == 0:
        raise WireError(reasons.BAD_SCHEMA, "empty IPC stream")
    if record_batches != 1:
        raise WireError(reasons.BAD_SCHEMA, "IPC stream holds no record batch")


def check_stream_shape(buf: pa.Buffer) -> None:
    """Walk the IPC messages in `buf`, framed as Arrow's stream reader frames them. Raises
    WireError when the stream is not: schema, dictionary batches, exactly one record batch, none
    compressed. pyarrow, ValueError and struct errors (a stream Arrow would not read either:
    truncated, a negative length, a corrupt flatbuffer) propagate for the caller to report as
    malformed.

    A stream this walk rejects is walked again by pyarrow's verifying MessageReader, which
    decides the error: a corrupt flatbuffer is reported as malformed, as it always was, and not
    by whatever its unverified fields happened to say. Only rejected payloads pay for it."""
    try:
        _walk(buf)
    except (WireError, ValueError, struct.error):
        _walk_verified(buf)
        raise


def _walk(buf: pa.Buffer) -> None:
    data = memoryview(buf)
    end = len(data)
    pos = count = record_batches = 0
    while pos < end:
        if end - pos < 4:
            raise ValueError(f"IPC message at {pos}: only {end - pos} bytes")
        (length,) = _I32(data, pos)
        pos += 4
        if length == _CONTINUATION:
            if end - pos < 4:
                raise ValueError(f"IPC metadata length at {pos}: only {end - pos} bytes")
            (length,) = _I32(data, pos)
            pos += 4
        if length == 0:
            break  # end-of-stream marker (what follows it is never read)
        if length < 0 or end - pos < length:
            raise ValueError(f"IPC metadata of {length} bytes at {pos}, {end - pos} left")
        count += 1
        fb = data[pos : pos + length]
        pos += length
        header_type, header, body_length = _message(fb)
        if body_length < 0 or end - pos < body_length:
            raise ValueError(f"IPC body of {body_length} bytes at {pos}, {end - pos} left")
        pos += body_length
        record_batches = _check_message(count, fb, header_type, header, record_batches)
    _check_end(count, record_batches)


def _walk_verified(buf: pa.Buffer) -> None:
    """The same checks over pyarrow's MessageReader, which verifies each flatbuffer."""
    reader = pa.ipc.MessageReader.open_stream(buf)
    record_batches = 0
    count = 0
    for count, msg in enumerate(reader, start=1):
        fb = memoryview(msg.metadata.to_pybytes())
        header_type, header, _ = _message(fb)
        record_batches = _check_message(count, fb, header_type, header, record_batches)
    _check_end(count, record_batches)

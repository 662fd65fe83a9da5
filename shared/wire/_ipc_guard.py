"""Shape check of an Arrow IPC stream before pyarrow materialises any batch from it.

Why: pyarrow reads uncompressed IPC zero-copy from the payload, so nothing it allocates can
outgrow the payload, with one exception: a compressed body declares its uncompressed length in
the body itself, and the reader allocates that much before it finds out the data is short. A
60-byte hostile payload could ask for terabytes. So before reading batches we walk the messages
(pyarrow verifies each flatbuffer) and peek into the RecordBatch table for the `compression`
field, refusing any compressed body. The same walk enforces the FPC1 shape: one schema message,
then dictionary batches, then exactly one record batch.

Flatbuffer layout used here (Arrow format/Message.fbs): the root uoffset at byte 0 points at the
Message table; a table starts with an soffset to its vtable; vtable = [u16 vtable size, u16
table size, u16 offset of field 0, field 1, ...], offset 0 meaning absent. Message fields:
1 header_type (u8: 1 Schema, 2 DictionaryBatch, 3 RecordBatch), 2 header (uoffset).
RecordBatch field 3 is `compression`; DictionaryBatch field 1 is its RecordBatch `data`.
"""

from __future__ import annotations

import struct

import pyarrow as pa

from shared.errors import WireError
from shared.wire import reasons
from shared.wire.limits import MAX_IPC_MESSAGES

_SCHEMA, _DICTIONARY_BATCH, _RECORD_BATCH = 1, 2, 3
_MSG_HEADER_TYPE, _MSG_HEADER = 1, 2
_RB_COMPRESSION = 3
_DB_DATA = 1


def _field_pos(fb: bytes, table: int, index: int) -> int | None:
    (soffset,) = struct.unpack_from("<i", fb, table)
    vtable = table - soffset
    (vtable_size,) = struct.unpack_from("<H", fb, vtable)
    slot = 4 + 2 * index
    if slot + 2 > vtable_size:
        return None
    offset: int = struct.unpack_from("<H", fb, vtable + slot)[0]
    return table + offset if offset else None


def _deref(fb: bytes, pos: int) -> int:
    uoffset: int = struct.unpack_from("<I", fb, pos)[0]
    return pos + uoffset


def _header(fb: bytes) -> tuple[int, int | None]:
    """(header type, position of the header table) of one Message flatbuffer."""
    root = _deref(fb, 0)
    type_pos = _field_pos(fb, root, _MSG_HEADER_TYPE)
    header_type = fb[type_pos] if type_pos is not None else 0
    header_pos = _field_pos(fb, root, _MSG_HEADER)
    return header_type, None if header_pos is None else _deref(fb, header_pos)


def _is_compressed(fb: bytes, header_type: int, header: int | None) -> bool:
    if header is None:
        raise WireError(reasons.BAD_SCHEMA, "IPC batch message without a header")
    record_batch = header
    if header_type == _DICTIONARY_BATCH:
        data_pos = _field_pos(fb, header, _DB_DATA)
        if data_pos is None:
            raise WireError(reasons.BAD_SCHEMA, "IPC dictionary batch without data")
        record_batch = _deref(fb, data_pos)
    return _field_pos(fb, record_batch, _RB_COMPRESSION) is not None


def check_stream_shape(buf: pa.Buffer) -> pa.Message:
    """Walk the IPC messages in `buf`; return the schema message. Raises WireError when the
    stream is not: schema, dictionary batches, exactly one record batch, none compressed.
    pyarrow and struct errors propagate for the caller to report as malformed."""
    reader = pa.ipc.MessageReader.open_stream(buf)
    schema_msg: pa.Message | None = None
    record_batches = 0
    for count, msg in enumerate(reader, start=1):
        if count > MAX_IPC_MESSAGES:
            raise WireError(reasons.BAD_SCHEMA, f"more than {MAX_IPC_MESSAGES} IPC messages")
        fb = msg.metadata.to_pybytes()
        header_type, header = _header(fb)
        if count == 1:
            if header_type != _SCHEMA:
                raise WireError(reasons.BAD_SCHEMA, "IPC stream does not start with a schema")
            schema_msg = msg
            continue
        if header_type not in (_DICTIONARY_BATCH, _RECORD_BATCH):
            raise WireError(reasons.BAD_SCHEMA, f"unexpected IPC message type {header_type}")
        if record_batches:
            raise WireError(reasons.BAD_SCHEMA, "IPC stream continues after its record batch")
        if _is_compressed(fb, header_type, header):
            raise WireError(reasons.BAD_SCHEMA, "compressed IPC bodies are not accepted")
        if header_type == _RECORD_BATCH:
            record_batches += 1
    if schema_msg is None:
        raise WireError(reasons.BAD_SCHEMA, "empty IPC stream")
    if record_batches != 1:
        raise WireError(reasons.BAD_SCHEMA, "IPC stream holds no record batch")
    return schema_msg

"""Fuzz every decoder with mutated and random payloads: only WireError may escape.

Seeds are the golden vectors (schemas/vectors) plus a few wide columnar reports. The families
below feed, in total, more than 100,000 payloads to `decode`, `decode_as` and
`decode_handle_report_columnar` each, with a seeded `random.Random` so any failure reproduces:
the assertion message carries the family, the iteration and the payload in hex.
Anything a decoder accepts is checked too: messages re-encode canonically, columnar parts keep
their invariants.
"""

from __future__ import annotations

import copy
import math
import random
import resource
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from shared.errors import WireError
from shared.wire import codec
from shared.wire.columnar import (
    COLUMNAR_MAGIC,
    ColumnarHandleReport,
    columnar_to_handle_report,
    decode_handle_report_columnar,
    encode_handle_report_columnar,
)
from shared.wire.messages import MESSAGE_TYPES, WireMessage

VECTORS = Path(__file__).resolve().parents[2] / "schemas" / "vectors"
MSGPACK_SEEDS = [p.read_bytes() for p in sorted(VECTORS.glob("*.msgpack"))]
COLUMNAR_SEEDS = [p.read_bytes() for p in sorted(VECTORS.glob("*.fpc1"))]

BYTE_MUTATIONS = 45_000
STRUCTURED_MUTATIONS = 25_000
RANDOM_PAYLOADS = 8_000
COLUMNAR_MUTATIONS = 25_000

# msgpack headers that declare 4 GiB (or 2^32-1 items) of content.
HUGE_HEADERS = [
    b"\xdb\xff\xff\xff\xff",  # str32
    b"\xc6\xff\xff\xff\xff",  # bin32
    b"\xdd\xff\xff\xff\xff",  # array32
    b"\xdf\xff\xff\xff\xff",  # map32
    b"\xc9\xff\xff\xff\xff\x05",  # ext32
    b"\xda\xff\xff",  # str16
    b"\xde\xff\xff",  # map16
]
INTERESTING_BYTES = [0x00, 0x01, 0x7F, 0x80, 0x8F, 0x90, 0xC0, 0xC1, 0xC2, 0xC3, 0xCB, 0xFF]
INTERESTING_INTS = [0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 2**63 - 1]
VALUE_POOL: list[Any] = [
    None, True, False, 0, -1, -(2**63), 2**64 - 1, 0.0, -0.0, 1.5, math.nan, math.inf, -math.inf,
    "", "x" * 300, "ready", b"", b"\x00" * 40, [], [1, 2], [["a", "b"]], {}, {"a": 1.0},
    {"replica_id": "r", "healthy": True, "checked_at": 1.0, "consecutive_failures": 0},
    msgpack.ExtType(5, b"ext"), msgpack.Timestamp(1, 0),
]  # fmt: skip


class Feeder:
    """Feeds one payload to every decoder and checks what they accept."""

    def __init__(self, family: str) -> None:
        self.family = family
        self.count = 0

    def __call__(self, data: bytes) -> None:
        self.count += 1
        cls = MESSAGE_TYPES[self.count % len(MESSAGE_TYPES)]
        for name, fn in (
            ("decode", codec.decode),
            ("decode_as", lambda d: codec.decode_as(d, cls)),
            ("columnar", decode_handle_report_columnar),
        ):
            try:
                out = fn(data)
            except WireError:
                continue
            except BaseException as exc:
                pytest.fail(
                    f"{self.family}#{self.count} {name} raised {type(exc).__name__}: {exc}\n"
                    f"payload={data.hex()}"
                )
            if isinstance(out, ColumnarHandleReport):
                check_columnar(out)
            else:
                check_message(out)


def check_message(msg: WireMessage) -> None:
    again = codec.decode(codec.encode(msg))
    assert type(again) is type(msg)
    assert codec.encode(again) == codec.encode(msg)


def check_columnar(c: ColumnarHandleReport) -> None:
    assert 0 <= c.part < c.parts
    r = c.running
    assert r.shape == (c.num_rows,) and bool(np.all(np.isfinite(r) & (r >= 0)))
    assert len(set(c.replica_id_list())) == c.num_rows
    valid = c.health_valid
    assert np.all(np.isfinite(c.health_checked_at[valid])) and np.all(c.health_failures >= 0)
    for name in c.custom_names:
        assert not np.any(np.isinf(c.custom(name)))
    codec.encode(columnar_to_handle_report(c))


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        pos = rng.randrange(len(b) + 1)
        if op == 0 and b:  # bit flip
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1:  # insertion
            b[pos:pos] = rng.randbytes(rng.randint(1, 8))
        elif op == 2 and b:  # deletion
            del b[pos : pos + rng.randint(1, 8)]
        elif op == 3 and b:  # interesting byte
            b[rng.randrange(len(b))] = rng.choice(INTERESTING_BYTES)
        elif op == 4:  # huge declared length spliced in
            b[pos:pos] = rng.choice(HUGE_HEADERS)
        elif op == 5:  # truncation
            del b[pos:]
        else:  # duplicate a slice (repeats fields, nests maps)
            a = rng.randrange(len(b) + 1)
            b[pos:pos] = b[a : a + rng.randint(1, 16)]
    return bytes(b)


def _slots(obj: Any) -> Iterator[tuple[Any, Any]]:
    """Every (container, key/index) in a decoded msgpack tree."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield obj, k
            yield from _slots(v)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield obj, i
            yield from _slots(v)


def mutate_structure(rng: random.Random, data: bytes) -> bytes:
    tree = msgpack.unpackb(data, raw=False, strict_map_key=False)
    slots = list(_slots(tree))
    for _ in range(rng.randint(1, 3)):
        if not slots:
            break
        container, key = rng.choice(slots)
        op = rng.randrange(5)
        if op == 0 and isinstance(container, dict):
            container.pop(key, None)
            slots = list(_slots(tree))
        elif op == 1 and isinstance(container, dict):
            container[rng.choice(["zz", "v", "kind", 7, b"k"])] = copy.deepcopy(
                rng.choice(VALUE_POOL)
            )
        elif op == 2:
            container[key] = [container[key]]
        else:
            container[key] = copy.deepcopy(rng.choice(VALUE_POOL))
        slots = list(_slots(tree))
    return bytes(msgpack.packb(tree, use_bin_type=True))


def run(family: str, n: int, make: Callable[[random.Random, int], bytes], seed: int) -> None:
    rng = random.Random(seed)
    feed = Feeder(family)
    for i in range(n):
        feed(make(rng, i))
    assert feed.count == n


@pytest.mark.timeout(60)
def test_msgpack_truncations_at_every_offset() -> None:
    feed = Feeder("truncation")
    for seed in MSGPACK_SEEDS:
        for k in range(len(seed)):
            feed(seed[:k])
    assert feed.count == sum(map(len, MSGPACK_SEEDS)) > 1000


@pytest.mark.timeout(60)
def test_msgpack_byte_mutations() -> None:
    run("bytes", BYTE_MUTATIONS, lambda rng, i: mutate_bytes(rng, rng.choice(MSGPACK_SEEDS)), 1)


@pytest.mark.timeout(60)
def test_wrong_types_in_valid_maps() -> None:
    run(
        "structure",
        STRUCTURED_MUTATIONS,
        lambda rng, i: mutate_structure(rng, rng.choice(MSGPACK_SEEDS)),
        2,
    )


def _random_payload(rng: random.Random, i: int) -> bytes:
    body = rng.randbytes(rng.randint(0, 96))
    prefix = [b"", b"", COLUMNAR_MAGIC, b"\x82\xa1v\x01\xa4kind", b"\x81", b"\xdf"][i % 6]
    return prefix + body


@pytest.mark.timeout(60)
def test_random_bytes() -> None:
    run("random", RANDOM_PAYLOADS, _random_payload, 3)


def _wide_seed() -> list[bytes]:
    rng = np.random.default_rng(7)
    n = 300
    return encode_handle_report_columnar(
        handle_id="h", app="a", deployment="d", sent_at=1.0, seq=1, queued_requests=0.0,
        membership_epoch=1, replica_ids=[f"r{i}" for i in range(n)], running=rng.random(n),
        health_healthy=rng.random(n) < 0.5, health_checked_at=rng.random(n),
        health_failures=rng.integers(0, 5, n), health_valid=rng.random(n) < 0.5,
        custom={"m": rng.random(n), "n": np.where(rng.random(n) < 0.5, np.nan, 1.0)},
        max_payload=6000,
    )  # fmt: skip


def mutate_columnar(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    op = rng.randrange(4)
    if op == 0:  # overwrite a little-endian int (lengths, offsets, counts) with an extreme value
        width = rng.choice([2, 4, 8])
        pos = rng.randrange(4, max(5, len(b) - width))
        value = rng.choice(INTERESTING_INTS) % (1 << (8 * width))
        if rng.random() < 0.3:
            value = (1 << (8 * width)) - 1 - value  # negative when read as signed
        b[pos : pos + width] = value.to_bytes(width, "little")
        return bytes(b)
    if op == 1:  # flip bits in the IPC part only, so the magic survives
        for _ in range(rng.randint(1, 6)):
            i = rng.randrange(4, len(b))
            b[i] ^= 1 << rng.randrange(8)
        return bytes(b)
    if op == 2:  # truncate
        return bytes(b[: rng.randrange(len(b))])
    return COLUMNAR_MAGIC + mutate_bytes(rng, bytes(b[4:]))


@pytest.mark.timeout(60)
def test_columnar_mutations() -> None:
    seeds = COLUMNAR_SEEDS + _wide_seed()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    run("columnar", COLUMNAR_MUTATIONS, lambda rng, i: mutate_columnar(rng, rng.choice(seeds)), 4)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 256 * 1024, f"peak RSS grew by {grown_kib} KiB while fuzzing"


def test_seeds_decode() -> None:
    """The fuzz seeds are valid, so the mutations start from inputs that reach deep code."""
    assert len(MSGPACK_SEEDS) >= 15 and len(COLUMNAR_SEEDS) >= 2
    for data in MSGPACK_SEEDS:
        codec.decode(data)
    for data in [*COLUMNAR_SEEDS, *_wide_seed()]:
        decode_handle_report_columnar(data)

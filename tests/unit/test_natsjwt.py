"""NATS nkeys and JWTs (shared/natsjwt.py), checked against the reference `nkeys` package."""

from __future__ import annotations

import base64
import json

import nkeys
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.errors import ConfigError
from shared.natsjwt import (
    PREFIX_ACCOUNT,
    PREFIX_SERVER,
    PREFIX_USER,
    KeyPair,
    TokenError,
    crc16,
    decode,
    decode_public,
    encode,
    read_seed,
    verify,
)

PREFIXES = st.sampled_from([PREFIX_ACCOUNT, PREFIX_USER, PREFIX_SERVER])
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
CLAIMS = st.dictionaries(
    st.text(min_size=1, max_size=10).filter(lambda k: k not in {"iss", "jti", "exp", "nbf"}),
    JSONISH,
    max_size=6,
)


@given(st.binary(max_size=64))
def test_crc16_is_the_reference_one(data: bytes) -> None:
    assert crc16(data) == nkeys.crc16(bytearray(data))


@given(PREFIXES)
def test_seeds_and_public_keys_match_the_reference(prefix: int) -> None:
    key = KeyPair.generate(prefix)
    ref = nkeys.from_seed(bytearray(key.seed.encode()))
    assert ref.public_key.decode() == key.public_key
    assert KeyPair.from_seed(key.seed).public_key == key.public_key
    assert bytes(ref.sign(b"msg")) == key.sign(b"msg")


def test_public_keys_of_the_wrong_kind_or_damaged_are_refused() -> None:
    user = KeyPair.generate(PREFIX_USER).public_key
    assert len(decode_public(user, PREFIX_USER)) == 32
    with pytest.raises(TokenError):
        decode_public(user, PREFIX_ACCOUNT)
    damaged = user[:10] + ("A" if user[10] != "A" else "B") + user[11:]
    with pytest.raises(TokenError, match="checksum"):
        decode_public(damaged)
    with pytest.raises(TokenError):
        decode_public(KeyPair.generate(PREFIX_USER).seed)  # a seed is not a public key


@given(CLAIMS)
def test_jwt_round_trip(claims: dict[str, object]) -> None:
    issuer = KeyPair.generate(PREFIX_ACCOUNT)
    token = encode(claims, issuer)
    got = decode(token, now=0)
    assert got["iss"] == issuer.public_key and got["jti"]
    assert {k: v for k, v in got.items() if k not in {"iss", "jti"}} == claims
    header = json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))
    assert header == {"typ": "JWT", "alg": "ed25519-nkey"}


@given(st.integers(min_value=0, max_value=10_000), st.data())
def test_any_changed_character_is_refused(pos: int, data: st.DataObject) -> None:
    token = encode({"sub": "r-1", "exp": 2_000_000_000}, KeyPair.generate(PREFIX_USER))
    i = pos % len(token)
    if token[i] == ".":
        return
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    c = data.draw(st.sampled_from([a for a in alphabet if a != token[i]]))
    tampered = token[:i] + c + token[i + 1 :]
    try:
        claims = decode(tampered, now=0)
    except TokenError:
        return
    # base64 slack bits: a last character may change without changing a byte
    assert claims == decode(token, now=0)


def test_signature_by_another_key_and_expiry() -> None:
    a, b = KeyPair.generate(PREFIX_USER), KeyPair.generate(PREFIX_USER)
    head, body, _ = encode({"exp": 100, "nbf": 50}, a).split(".")
    _, _, sig_b = encode({"exp": 100, "nbf": 50}, b).split(".")
    with pytest.raises(TokenError, match="bad signature"):
        decode(f"{head}.{body}.{sig_b}")
    token = encode({"exp": 100, "nbf": 50}, a)
    assert decode(token, now=99)["exp"] == 100
    with pytest.raises(TokenError, match="expired"):
        decode(token, now=100)
    with pytest.raises(TokenError, match="not yet valid"):
        decode(token, now=49)
    assert not verify(a.public_key, b"x", b.sign(b"x"))


@pytest.mark.parametrize("bad", ["", "a.b", "a.b.c", "x" * 20_000, "e30.e30.AAAA"])
def test_garbage_is_a_token_error(bad: str) -> None:
    with pytest.raises(TokenError):
        decode(bad)


def test_read_seed_says_what_is_wrong(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "seed"
    with pytest.raises(ConfigError, match="cannot read"):
        read_seed(str(path), "--issuer-seed")
    path.write_text("not a seed\n")
    with pytest.raises(ConfigError, match="no nkey seed"):
        read_seed(str(path), "--issuer-seed")
    key = KeyPair.generate(PREFIX_ACCOUNT)
    path.write_text(key.seed + "\n")
    assert read_seed(str(path), "x").public_key == key.public_key

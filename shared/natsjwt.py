"""NATS nkeys and JWTs: the encodings the auth callout speaks, on Ed25519 (PyNaCl).

How it works: an nkey is an Ed25519 key in NATS' text form: base32 (no padding) of one prefix
byte (what the key is for: `A` account, `U` user, `N` server ...), the 32 key bytes and a
CRC-16/XMODEM of both, little endian. A seed (`S...`) packs two prefix bits more. A NATS JWT is
`base64url(header).base64url(claims).base64url(signature)`, header `{"typ":"JWT","alg":
"ed25519-nkey"}`, signed with the issuer's key and verified against the public key in `iss`, so
a token names the key that checks it. `jti` is a hash of the claims, as the Go library makes it.

Pure but for `read_seed`: no clock (callers pass `now`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nacl.exceptions
import nacl.signing

from shared.errors import ConfigError, FleetpulseError

PREFIX_SEED = 18 << 3
PREFIX_ACCOUNT = 0
PREFIX_USER = 20 << 3
PREFIX_SERVER = 13 << 3
PREFIX_OPERATOR = 14 << 3
PUBLIC_PREFIXES = frozenset({PREFIX_ACCOUNT, PREFIX_USER, PREFIX_SERVER, PREFIX_OPERATOR})
HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
_ALGS = frozenset({"ed25519-nkey", "ed25519"})
MAX_TOKEN_CHARS = 16_384
"""Far above any JWT this system makes or gets; a longer one is refused before decoding."""


class TokenError(FleetpulseError):
    """A key or token that does not decode or verify; `reason` is short and stable (a metric
    label), the message says what was wrong."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def crc16(data: bytes) -> int:
    """CRC-16/XMODEM (poly 0x1021, init 0), the checksum of every nkey."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def _b32(raw: bytes) -> str:
    return base64.b32encode(raw + crc16(raw).to_bytes(2, "little")).decode().rstrip("=")


def _unb32(text: str) -> bytes:
    try:
        raw = base64.b32decode(text + "=" * (-len(text) % 8))
    except (binascii.Error, ValueError) as exc:
        raise TokenError("bad nkey", "not base32") from exc
    if len(raw) < 3 or int.from_bytes(raw[-2:], "little") != crc16(raw[:-2]):
        raise TokenError("bad nkey", "checksum mismatch")
    return raw[:-2]


def encode_public(prefix: int, key: bytes) -> str:
    return _b32(bytes([prefix]) + key)


def decode_public(text: str, prefix: int | None = None) -> bytes:
    """The 32 raw key bytes of a public nkey; TokenError if it is not one (of `prefix`)."""
    raw = _unb32(text)
    if len(raw) != 33 or raw[0] not in PUBLIC_PREFIXES:
        raise TokenError("bad nkey", f"{text[:8]}... is not a public key")
    if prefix is not None and raw[0] != prefix:
        raise TokenError("bad nkey", f"{text[:8]}... is a public key of another kind")
    return raw[1:]


@dataclass(frozen=True, slots=True)
class KeyPair:
    """An Ed25519 signing key and what it is for (its nkey prefix)."""

    prefix: int
    signing: nacl.signing.SigningKey

    @classmethod
    def generate(cls, prefix: int) -> KeyPair:
        return cls(prefix, nacl.signing.SigningKey.generate())

    @classmethod
    def from_seed(cls, seed: str) -> KeyPair:
        raw = _unb32(seed.strip())
        if len(raw) != 34 or raw[0] & 0xF8 != PREFIX_SEED:
            raise TokenError("bad seed", "not an nkey seed (S...)")
        prefix = ((raw[0] & 0x07) << 5) | ((raw[1] & 0xF8) >> 3)
        if prefix not in PUBLIC_PREFIXES:
            raise TokenError("bad seed", "unknown key kind")
        return cls(prefix, nacl.signing.SigningKey(raw[2:]))

    @property
    def seed(self) -> str:
        head = bytes([PREFIX_SEED | self.prefix >> 5, (self.prefix & 0x1F) << 3])
        return _b32(head + bytes(self.signing))

    @property
    def public_key(self) -> str:
        return encode_public(self.prefix, bytes(self.signing.verify_key))

    def sign(self, data: bytes) -> bytes:
        return bytes(self.signing.sign(data).signature)


def verify(public_key: str, data: bytes, signature: bytes) -> bool:
    try:
        nacl.signing.VerifyKey(decode_public(public_key)).verify(data, signature)
    except (nacl.exceptions.BadSignatureError, ValueError, TypeError):
        return False
    return True


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise TokenError("bad token", "not base64url") from exc


def _json(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def encode(claims: Mapping[str, Any], issuer: KeyPair) -> str:
    """A signed JWT of `claims` with `iss` set to the issuer's public key and `jti` to their hash."""
    body = {**claims, "iss": issuer.public_key, "jti": ""}
    body["jti"] = base64.b32encode(hashlib.sha256(_json(body)).digest()).decode().rstrip("=")
    signing_input = f"{_b64(_json(HEADER))}.{_b64(_json(body))}"
    return f"{signing_input}.{_b64(issuer.sign(signing_input.encode()))}"


def decode(token: str, *, now: float | None = None) -> dict[str, Any]:
    """The claims of a JWT whose signature verifies against its own `iss`; with `now`, also
    refused when expired or not yet valid. Whether that issuer is trusted is the caller's
    question."""
    if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS:
        raise TokenError("bad token", "missing or too long")
    parts = token.split(".")
    if len(parts) != 3:
        raise TokenError("bad token", "not three dot-separated parts")
    try:
        header = json.loads(_unb64(parts[0]))
        claims = json.loads(_unb64(parts[1]))
    except (ValueError, UnicodeDecodeError) as exc:
        raise TokenError("bad token", "header or claims are not JSON") from exc
    if not isinstance(header, dict) or header.get("alg") not in _ALGS:
        raise TokenError("bad token", "not an ed25519-nkey JWT")
    if not isinstance(claims, dict) or not isinstance(claims.get("iss"), str):
        raise TokenError("bad token", "claims without an issuer")
    if not verify(claims["iss"], f"{parts[0]}.{parts[1]}".encode(), _unb64(parts[2])):
        raise TokenError("bad signature", "the signature does not match the issuer's key")
    if now is not None:
        exp, nbf = claims.get("exp"), claims.get("nbf")
        if isinstance(exp, int | float) and now >= exp:
            raise TokenError("expired", f"expired {now - exp:.0f} s ago")
        if isinstance(nbf, int | float) and now < nbf:
            raise TokenError("not yet valid", f"valid in {nbf - now:.0f} s")
    return claims


def read_seed(path: str, what: str) -> KeyPair:
    try:
        return KeyPair.from_seed(Path(path).read_text(encoding="ascii"))
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}", field=what) from exc
    except TokenError as exc:
        raise ConfigError(f"{path} holds no nkey seed ({exc})", field=what) from exc

"""Replica credentials (shared/replicacred.py): bound to one replica, one signer, one window."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.natsjwt import PREFIX_USER, KeyPair, TokenError, encode
from shared.replicacred import (
    CREDENTIAL_TYPE,
    inbox_prefix,
    mint,
    renew_at,
    verify,
    write_credential,
)
from shared.subjects import TOKEN_PATTERN

NAMES = st.from_regex(f"\\A{TOKEN_PATTERN}\\Z", fullmatch=True)
KEY = KeyPair.generate(PREFIX_USER)
TRUSTED = frozenset({KEY.public_key})
NOW = 1_700_000_000.0


@given(NAMES, NAMES, NAMES, st.floats(min_value=1, max_value=86_400))
def test_round_trip(app: str, dep: str, rid: str, ttl: float) -> None:
    who = verify(mint(KEY, app, dep, rid, now=NOW, ttl_s=ttl), TRUSTED, now=NOW + ttl - 0.01)
    assert (who.app, who.deployment, who.replica_id, who.signer) == (app, dep, rid, KEY.public_key)
    assert who.expires_at >= NOW + ttl


def test_refused_after_its_window() -> None:
    token = mint(KEY, "a", "d", "r", now=NOW, ttl_s=60)
    with pytest.raises(TokenError, match="expired"):
        verify(token, TRUSTED, now=NOW + 62)


def test_refused_when_signed_by_a_key_not_trusted() -> None:
    other = KeyPair.generate(PREFIX_USER)
    with pytest.raises(TokenError, match="untrusted signer"):
        verify(mint(other, "a", "d", "r", now=NOW, ttl_s=60), TRUSTED, now=NOW)
    # rotation: trusting both keys accepts both
    both = TRUSTED | {other.public_key}
    assert verify(mint(other, "a", "d", "r", now=NOW, ttl_s=60), both, now=NOW).replica_id == "r"


@pytest.mark.parametrize(
    "claims",
    [
        {"sub": "r", "iat": NOW, "exp": NOW + 60},  # no fp part: some other JWT by that key
        {"sub": "r", "iat": NOW, "exp": NOW + 60, "fp": {"type": "x", "app": "a", "deployment": "d"}},
        {"sub": "r", "iat": NOW, "fp": {"type": CREDENTIAL_TYPE, "app": "a", "deployment": "d"}},
        {"sub": "a.>", "iat": NOW, "exp": NOW + 60,
         "fp": {"type": CREDENTIAL_TYPE, "app": "a", "deployment": "d"}},  # a wildcard id
        {"sub": "r", "iat": NOW, "exp": NOW + 60, "fp": {"type": CREDENTIAL_TYPE, "app": 1}},
    ],
)  # fmt: skip
def test_refused_when_not_a_well_formed_credential(claims: dict[str, object]) -> None:
    with pytest.raises(TokenError):
        verify(encode(claims, KEY), TRUSTED, now=NOW)


def test_mint_refuses_names_that_are_not_subject_tokens() -> None:
    with pytest.raises(Exception, match="invalid replica id"):
        mint(KEY, "a", "d", "r.*", now=NOW, ttl_s=60)
    with pytest.raises(ValueError):
        mint(KEY, "a", "d", "r", now=NOW, ttl_s=0)


def test_refresh_at_a_third_left() -> None:
    assert renew_at(NOW, 600) == NOW + 400


def test_inbox_prefix_is_a_token_of_its_own() -> None:
    assert inbox_prefix("r-1") == "_INBOX_r-1"
    with pytest.raises(Exception, match="invalid replica id"):
        inbox_prefix("r.1")


def test_credential_file_is_private_and_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / "r.cred"
    write_credential(path, "one")
    write_credential(path, "two")
    assert path.read_text() == "two"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["r.cred"]

"""NATS credentials from env and flags, their validation, and what replicas inherit."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from services.agent.config import replica_auth
from services.agent.procs import child_env
from shared.cliargs import add_nats_flag, apply_nats_flags
from shared.errors import UsageError
from shared.natsauth import (
    REPLICA_ENV_PREFIX,
    NatsAuth,
    process_auth,
    set_process_auth,
)


def test_env_then_flags_override() -> None:
    env = {"FLEETPULSE_NATS_USER": "agent", "FLEETPULSE_NATS_PASSWORD": "p1", "OTHER": "x"}
    auth = NatsAuth.from_env(env)
    assert (auth.user, auth.password, auth.token) == ("agent", "p1", None)
    over = auth.overridden(password="p2", token=None)
    assert (over.user, over.password) == ("agent", "p2")
    assert NatsAuth.from_env(over.to_env()) == over


@pytest.mark.parametrize(
    ("auth", "message"),
    [
        (NatsAuth(user="u"), "has no password"),
        (NatsAuth(password="p"), "needs a user"),
        (NatsAuth(user="u", password="p", token="t"), "not several"),
        (NatsAuth(tls_cert="/x"), "go together"),
        (NatsAuth(creds="/no/such/file.creds"), "creds file not found"),
    ],
)
def test_invalid_settings_say_what_is_wrong(auth: NatsAuth, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        auth.validate()


def test_describe_never_shows_a_secret(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    text = NatsAuth(user="u", password="hunter2", tls_ca=str(ca)).validate().describe()
    assert "hunter2" not in text and "'u'" in text and "TLS" in text
    assert "s3cr3t" not in NatsAuth(token="s3cr3t").describe()


def test_cli_flags_become_the_process_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETPULSE_NATS_USER", "from-env")
    monkeypatch.setenv("FLEETPULSE_NATS_PASSWORD", "env-secret")
    p = argparse.ArgumentParser()
    add_nats_flag(p)
    try:
        apply_nats_flags(p.parse_args(["--nats-password", "flag-secret"]))
        assert (process_auth().user, process_auth().password) == ("from-env", "flag-secret")
        with pytest.raises(UsageError, match="not several"):
            apply_nats_flags(p.parse_args(["--nats-token", "t"]))
    finally:
        set_process_auth(NatsAuth())


def test_replicas_get_their_own_identity_never_the_agents() -> None:
    agent = NatsAuth(user="agent", password="agent-secret")
    own = NatsAuth.from_env(
        {REPLICA_ENV_PREFIX + "USER": "replica", REPLICA_ENV_PREFIX + "PASSWORD": "r"},
        REPLICA_ENV_PREFIX,
    )
    env = child_env(
        {"FLEETPULSE_NATS_USER": "agent", "FLEETPULSE_NATS_PASSWORD": "agent-secret",
         REPLICA_ENV_PREFIX + "PASSWORD": "r", "PATH": "/bin"},
        (),
        replica_auth(own, agent),
    )  # fmt: skip
    assert env["FLEETPULSE_NATS_USER"] == "replica"
    assert env["FLEETPULSE_NATS_PASSWORD"] == "r"
    assert "agent-secret" not in env.values()
    assert not any(k.startswith(REPLICA_ENV_PREFIX) for k in env)
    assert env["PATH"] == "/bin"


def test_replicas_fall_back_to_the_agents_identity_and_tls(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    agent = NatsAuth(token="t", tls_ca=str(ca))
    assert replica_auth(NatsAuth(), agent) == agent
    mine = replica_auth(NatsAuth(user="replica", password="r"), agent)
    assert (mine.user, mine.token, mine.tls_ca) == ("replica", None, str(ca))

"""First start makes every secret; placeholders and empty passwords are refused where given.

`fleetpulse auth-init` as compose runs it (services/auth/keys.py), the password checks every
login goes through (shared/passwords.py), a service's password from a file (shared/natsauth.py)
and the auth service's role table from the files auth-init wrote (services/auth/config.py).
"""

from __future__ import annotations

import argparse
import stat
from pathlib import Path

import bcrypt
import pytest

from services.auth.config import add_auth_arguments, config_from_args
from services.auth.core import PASSWORD_ROLES
from services.auth.keys import (
    AUTH_USER_CONF,
    ISSUER_CONF,
    add_credentials_arguments,
    add_init_arguments,
    run_credentials,
    run_init,
)
from shared.errors import ConfigError, UsageError
from shared.natsauth import NatsAuth
from shared.passwords import checked_password, is_placeholder, new_password


def init_args(tmp: Path, *extra: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_init_arguments(p)
    return p.parse_args(
        [
            "--issuer-seed", str(tmp / "issuer" / "issuer.seed"),
            "--replica-seed", str(tmp / "agent" / "replica.seed"),
            "--public-dir", str(tmp / "public"),
            "--role-passwords-dir", str(tmp / "issuer" / "roles"),
            "--role-copy", "operator", str(tmp / "operator" / "password"),
            "--role-copy", "controller", str(tmp / "controller" / "password"),
            "--auth-password", str(tmp / "issuer" / "auth.password"),
            "--shared-secret", str(tmp / "grafana" / "admin-password"),
            *extra,
        ]
    )  # fmt: skip


def secrets_of(tmp: Path) -> dict[str, str]:
    files = [*(tmp / "issuer" / "roles").iterdir(), tmp / "issuer" / "auth.password"]
    files.append(tmp / "grafana" / "admin-password")
    return {f.name: f.read_text().strip() for f in files}


@pytest.mark.parametrize(
    "value", ["", "   ", "operator-change-me", "CHANGEME", "change_me_please", "password"]
)
def test_placeholders_and_empty_passwords_are_refused_naming_their_source(value: str) -> None:
    assert is_placeholder(value)
    with pytest.raises(ConfigError, match=r"FP_OPERATOR_PASSWORD.*openssl rand"):
        checked_password(value, "FP_OPERATOR_PASSWORD")


def test_a_made_password_is_long_random_and_no_placeholder() -> None:
    made = {new_password() for _ in range(50)}
    assert len(made) == 50
    assert all(len(p) >= 32 and not is_placeholder(p) for p in made)


def test_first_start_makes_every_secret_and_a_second_start_keeps_them(tmp_path: Path) -> None:
    assert run_init(init_args(tmp_path), env={}) == 0
    first = secrets_of(tmp_path)
    assert set(first) >= {*PASSWORD_ROLES, "auth.password", "admin-password"}
    assert len(set(first.values())) == len(first)  # no two roles share one
    assert run_init(init_args(tmp_path), env={}) == 0
    assert secrets_of(tmp_path) == first
    # the role's services get their own password, and only theirs
    assert (tmp_path / "operator" / "password").read_text().strip() == first["operator"]
    for f in [*(tmp_path / "issuer" / "roles").iterdir(), tmp_path / "operator" / "password"]:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    # the servers get a hash of the auth service's password, never the password
    conf = (tmp_path / "public" / AUTH_USER_CONF).read_text()
    assert first["auth.password"] not in conf
    digest = conf.split('password: "')[1].split('"')[0]
    assert bcrypt.checkpw(first["auth.password"].encode(), digest.encode())
    assert (tmp_path / "public" / ISSUER_CONF).exists()


def test_two_fresh_deployments_get_different_secrets(tmp_path: Path) -> None:
    run_init(init_args(tmp_path / "a"), env={})
    run_init(init_args(tmp_path / "b"), env={})
    a, b = secrets_of(tmp_path / "a"), secrets_of(tmp_path / "b")
    assert not set(a.values()) & set(b.values())


def test_an_operators_own_password_is_used_and_an_empty_variable_counts_as_unset(
    tmp_path: Path,
) -> None:
    own = "a-long-secret-of-my-own-42"
    run_init(init_args(tmp_path), env={"FP_OPERATOR_PASSWORD": own, "FP_AGENT_PASSWORD": ""})
    got = secrets_of(tmp_path)
    assert got["operator"] == own
    assert got["agent"] and not is_placeholder(got["agent"])


def test_a_placeholder_given_to_first_start_refuses_and_writes_nothing_for_it(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError, match="FP_OPERATOR_PASSWORD"):
        run_init(init_args(tmp_path), env={"FP_OPERATOR_PASSWORD": "operator-change-me"})
    assert not (tmp_path / "issuer").exists()


def test_a_role_copy_for_an_unknown_role_is_a_clear_error(tmp_path: Path) -> None:
    args = init_args(tmp_path, "--role-copy", "nobody", str(tmp_path / "x"))
    with pytest.raises(ConfigError, match=r"--role-copy.*ROLE FILE"):
        run_init(args, env={})


def test_the_auth_service_reads_the_role_table_auth_init_wrote(tmp_path: Path) -> None:
    run_init(init_args(tmp_path), env={})
    p = argparse.ArgumentParser()
    p.add_argument("--nats", default="nats://127.0.0.1:1")
    add_auth_arguments(p)
    roles = tmp_path / "issuer" / "roles"
    args = p.parse_args(
        ["--issuer-seed", str(tmp_path / "issuer" / "issuer.seed"),
         "--role-passwords-dir", str(roles)]
    )  # fmt: skip
    policy = config_from_args(args, env={}).policy
    assert dict(policy.role_passwords) == {f.name: f.read_text().strip() for f in roles.iterdir()}
    (roles / "router").write_text("router-change-me\n")
    with pytest.raises(ConfigError, match="router"):
        config_from_args(args, env={})


def test_a_service_reads_its_password_from_a_file_and_refuses_a_placeholder(
    tmp_path: Path,
) -> None:
    file = tmp_path / "password"
    file.write_text("s3cret-from-first-start\n")
    auth = NatsAuth(user="controller", password_file=str(file)).validate()
    assert auth.secret_password() == "s3cret-from-first-start"
    file.write_text("controller-change-me\n")
    with pytest.raises(UsageError, match="FLEETPULSE_NATS_PASSWORD_FILE"):
        auth.validate()
    with pytest.raises(UsageError, match="FLEETPULSE_NATS_PASSWORD"):
        NatsAuth(user="controller", password="").validate()
    with pytest.raises(UsageError, match="not both"):
        NatsAuth(user="c", password="x-long-enough", password_file=str(file)).validate()
    env = NatsAuth.from_env({"FLEETPULSE_NATS_USER": "u", "FLEETPULSE_NATS_PASSWORD_FILE": "f"})
    assert env.password_file == "f"


def test_credentials_print_shell_exports_for_the_role(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_init(init_args(tmp_path), env={})
    capsys.readouterr()
    p = argparse.ArgumentParser()
    add_credentials_arguments(p)
    roles = tmp_path / "issuer" / "roles"
    args = p.parse_args(
        ["operator", "--role-passwords-dir", str(roles), "--nats-url", "nats://h:1"]
    )
    assert run_credentials(args) == 0
    out = capsys.readouterr().out.splitlines()
    password = (roles / "operator").read_text().strip()
    assert out == [
        "export FLEETPULSE_NATS_USER=operator",
        f"export FLEETPULSE_NATS_PASSWORD={password}",
        "export FLEETPULSE_NATS_URL=nats://h:1",
    ]

"""`fleetpulse auth` settings and the agent's replica credentials, without a server."""

from __future__ import annotations

import argparse
import stat
from pathlib import Path

import pytest

from services.agent.config import replica_auth
from services.agent.credentials import ReplicaCredentials
from services.auth.config import add_auth_arguments, config_from_args
from services.auth.keys import add_init_arguments, add_keygen_arguments, run_init, run_keygen
from shared.appconfig import DeploymentConfig
from shared.errors import ConfigError
from shared.kv.targets import ReplicaTarget
from shared.natsauth import NatsAuth
from shared.natsjwt import PREFIX_USER, KeyPair
from shared.replicacred import verify

NOW = 1_700_000_000.0


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_auth_arguments(p)
    args = p.parse_args(argv)
    args.nats = "nats://127.0.0.1:1"
    return args


def seed_file(tmp_path: Path, kind: str) -> tuple[Path, str]:
    path = tmp_path / f"{kind}.seed"
    p = argparse.ArgumentParser()
    add_keygen_arguments(p)
    run_keygen(p.parse_args([kind, str(path)]))
    return path, KeyPair.from_seed(path.read_text()).public_key


def test_config_from_flags_and_env(tmp_path: Path) -> None:
    issuer, issuer_pub = seed_file(tmp_path, "issuer")
    assert issuer_pub.startswith("A") and stat.S_IMODE(issuer.stat().st_mode) == 0o600
    u1, u2 = KeyPair.generate(PREFIX_USER).public_key, KeyPair.generate(PREFIX_USER).public_key
    env = {
        "FLEETPULSE_AUTH_REPLICA_KEYS": u1,
        "FP_CONTROLLER_PASSWORD": "s3cr3t-c",
        "FP_REPLICA_PASSWORD": "r",
    }
    cfg = config_from_args(parse(["--issuer-seed", str(issuer), "--replica-key", u2]), env)
    assert cfg.issuer.public_key == issuer_pub
    assert cfg.policy.trusted_replica_keys == {u1, u2}
    assert dict(cfg.policy.role_passwords) == {"controller": "s3cr3t-c"}  # no shared replica login
    assert "s3cr3t" not in repr(cfg) and issuer.read_text().strip() not in repr(cfg)


def test_config_errors_name_the_setting(tmp_path: Path) -> None:
    issuer, _ = seed_file(tmp_path, "issuer")
    replica, _ = seed_file(tmp_path, "replica")
    with pytest.raises(ConfigError, match="--issuer-seed"):
        config_from_args(parse([]), {})
    with pytest.raises(ConfigError, match="not a user public key"):
        config_from_args(parse(["--issuer-seed", str(issuer), "--replica-key", "Ubogus"]), {})
    with pytest.raises(ConfigError, match="account key"):
        config_from_args(parse(["--issuer-seed", str(replica)]), {"FP_AGENT_PASSWORD": "a"})
    with pytest.raises(ConfigError, match="nobody could log in"):
        config_from_args(parse(["--issuer-seed", str(issuer)]), {})
    with pytest.raises(FileExistsError):  # a key is never overwritten
        seed_file(tmp_path, "issuer")


def init(tmp_path: Path) -> int:
    p = argparse.ArgumentParser()
    add_init_arguments(p)
    seeds = tmp_path / "seeds"
    return run_init(p.parse_args([
        "--issuer-seed", str(seeds / "issuer.seed"), "--replica-seed", str(seeds / "replica.seed"),
        "--public-dir", str(tmp_path / "public"),
    ]))  # fmt: skip


def test_auth_init_makes_missing_keys_once_and_keeps_added_ones(tmp_path: Path) -> None:
    assert init(tmp_path) == 0
    issuer = KeyPair.from_seed((tmp_path / "seeds" / "issuer.seed").read_text())
    replica = KeyPair.from_seed((tmp_path / "seeds" / "replica.seed").read_text())
    for seed in ("issuer.seed", "replica.seed"):
        assert stat.S_IMODE((tmp_path / "seeds" / seed).stat().st_mode) == 0o600
    public = tmp_path / "public"
    assert (public / "issuer.conf").read_text() == f'issuer: "{issuer.public_key}"\n'
    assert (public / "replica-keys").read_text() == f"{replica.public_key}\n"
    rotated = KeyPair.generate(PREFIX_USER).public_key  # an operator adds a second agent key
    with (public / "replica-keys").open("a") as f:
        f.write(rotated + "\n")
    assert init(tmp_path) == 0  # a restart of the job: same keys, nothing dropped
    assert KeyPair.from_seed((tmp_path / "seeds" / "issuer.seed").read_text()) == issuer
    keys = tmp_path / "public" / "replica-keys"
    assert keys.read_text().split() == [replica.public_key, rotated]
    cfg = config_from_args(
        parse(["--issuer-seed", str(tmp_path / "seeds" / "issuer.seed"),
               "--replica-keys-file", str(keys)]), {},
    )  # fmt: skip
    assert cfg.policy.trusted_replica_keys == {replica.public_key, rotated}
    keys.write_text("not-a-key\n")
    with pytest.raises(ConfigError, match="--replica-keys-file"):
        config_from_args(parse(["--issuer-seed", str(tmp_path / "seeds" / "issuer.seed"),
                                "--replica-keys-file", str(keys)]), {})  # fmt: skip
    (tmp_path / "seeds" / "replica.seed").write_text(issuer.seed)  # the wrong kind of key
    with pytest.raises(ConfigError, match="no replica key"):
        init(tmp_path)


def target(rid: str) -> ReplicaTarget:
    spec = DeploymentConfig(name="d", import_path="m:X").replica_spec()
    return ReplicaTarget("a", "d", rid, "ag", 0, 1, "v1", "", spec, 1)


def test_agent_issues_renews_and_drops_credentials() -> None:
    key = KeyPair.generate(PREFIX_USER)
    trusted = {key.public_key}
    creds = ReplicaCredentials(key, ttl_s=60)
    try:
        env = creds.issue(target("r1"), NOW)
        path = Path(env["FLEETPULSE_NATS_TOKEN_FILE"])
        assert env["FLEETPULSE_NATS_INBOX_PREFIX"] == "_INBOX_r1"
        assert stat.S_IMODE(creds.dir.stat().st_mode) == 0o700
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        first = path.read_text()
        assert verify(first, trusted, now=NOW + 59).replica_id == "r1"
        creds.renew(NOW + 39)
        assert path.read_text() == first  # two thirds of the window left: not yet
        creds.renew(NOW + 40)
        renewed = path.read_text()
        assert renewed != first and verify(renewed, trusted, now=NOW + 99).replica_id == "r1"
        creds.drop("r1")
        assert not path.exists()
        creds.renew(NOW + 1000)  # nothing left to renew, nothing rewritten
        assert not path.exists()
    finally:
        creds.close()
    assert not creds.dir.exists()


def test_agent_keeps_replica_nats_identity_out_when_it_mints(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("")
    own = NatsAuth(user="replica", password="pw", tls_ca=str(ca))
    got = replica_auth(own, NatsAuth(user="agent", password="x"), minted=True)
    assert not got.has_identity and got.tls_ca == str(ca)

"""compose/docker-compose.yml, proven without a Docker engine.

Every service's command runs as a local process with its compose environment (from `.env`),
against a 3-node loopback cluster started from the compose NATS config with the same accounts,
auth callout and permissions. Only what a container changes is rewritten: host names and ports
(nats-N:4222, 9100, 8000) become free loopback ports, and mounted paths (/apps, /recordings, the
named volumes) local directories; a named volume is one directory shared by the services that
mount it, as in compose. In compose's order: the auth-keys job makes the keys, the nodes start,
the auth services answer, then the rest. Then the deploy service's command deploys the example
app, the proxy answers over HTTP, each healthcheck passes, no role was refused anything, and
every metric the Grafana dashboard plots exists on a running service's /metrics.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from services.proxy.config import ProxyConfig
from shared.natsserver import NatsCluster, free_ports

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose"
METRICS_PORT = "9100"
PROXY_PORT = "8000"
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
            "gauge": ("",), "summary": ("", "_count", "_sum"), "info": ("_info",)}  # fmt: skip


def dotenv() -> dict[str, str]:
    out = {}
    for line in (COMPOSE / ".env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def interpolate(value: Any, env: dict[str, str]) -> str:
    """Compose's ${VAR} and ${VAR:-default}; an unset variable without default is an error."""

    def sub(m: re.Match[str]) -> str:
        name, _, default = m.group(1).partition(":-")
        if name in env:
            return env[name]
        assert default or ":-" in m.group(1), f"${{{name}}} is not set in compose/.env"
        return default

    return re.sub(r"\$\{([^}]+)\}", sub, str(value))


@dataclass
class Service:
    name: str
    index: int
    argv: list[str]
    env: dict[str, str]
    metrics_port: int
    http_port: int | None
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None


def load_compose() -> dict[str, Any]:
    doc = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())
    assert isinstance(doc, dict)
    return doc


def is_fleetpulse(spec: dict[str, Any]) -> bool:
    """Built from compose/Dockerfile (the image name is a variable: ${FLEETPULSE_IMAGE:-...})."""
    return (spec.get("build") or {}).get("dockerfile") == "compose/Dockerfile"


ONE_SHOT = ("auth-keys", "deploy")
FIRST = "auth"
"""Started (and healthy) before the other long-running services, which depend on it."""


def plan(doc: dict[str, Any], env: dict[str, str], tmp: Path) -> list[Service]:
    """The fleetpulse services; their FLEETPULSE_NATS_URL is set once the cluster runs."""
    out = []
    for name, spec in doc["services"].items():
        if not is_fleetpulse(spec):
            continue
        replicas = int(interpolate((spec.get("deploy") or {}).get("replicas", 1), env))
        for i in range(replicas):
            metrics, http = free_ports(2)
            mounts = volume_mounts(spec, tmp / "volumes")
            argv = []
            for arg in spec["command"]:
                arg = mounted(interpolate(arg, env), mounts)
                argv.append(str(http) if argv[-1:] == ["--port"] and arg == PROXY_PORT else arg)
            service_env = {
                k: interpolate(v, env) for k, v in (spec.get("environment") or {}).items()
            }
            for k, v in service_env.items():
                service_env[k] = mounted(v, mounts)  # e.g. the agents' replica key file
            if name not in ONE_SHOT or "FLEETPULSE_NATS_URL" in service_env:
                assert "nats-1:4222" in service_env["FLEETPULSE_NATS_URL"]
                service_env["FLEETPULSE_METRICS_PORT"] = str(metrics)
            out.append(
                Service(name, i, argv, service_env, metrics, http if "--port" in argv else None)
            )
    return out


def volume_mounts(spec: dict[str, Any], volumes: Path) -> dict[str, Path]:
    """Container path -> local directory: bind mounts (./apps) as they are, named volumes as
    one directory each under `volumes`, shared by every service that mounts them."""
    out = {}
    for entry in spec.get("volumes") or []:
        source, target = str(entry).split(":")[:2]
        if source.startswith("."):
            out[target] = (COMPOSE / source).resolve()
        else:
            out[target] = volumes / source
            out[target].mkdir(parents=True, exist_ok=True)
    return out


def mounted(arg: str, mounts: dict[str, Path]) -> str:
    for target, local in mounts.items():
        if arg == target or arg.startswith(target + "/"):
            return str(local) + arg[len(target) :]
    return arg


def node_config(doc: dict[str, Any], volumes: Path, root: Path) -> Path:
    """What a NATS node container sees at its mounts, under `root`: bind mounts copied, named
    volumes linked (its store excepted: the cluster's own), so that the config's includes
    (../nats-auth/issuer.conf) resolve as in the container. Returns the config's path."""
    for entry in doc["services"]["nats-1"]["volumes"]:
        source, target = str(entry).split(":")[:2]
        if target == "/data":
            continue
        place = root / target.lstrip("/")
        place.parent.mkdir(parents=True, exist_ok=True)
        if source.startswith("."):
            shutil.copytree(COMPOSE / source, place)
        else:
            (volumes / source).mkdir(parents=True, exist_ok=True)
            place.symlink_to(volumes / source, target_is_directory=True)
    return root / "etc" / "nats" / "nats.conf"


def wait_healthy(svc: Service, within_s: float = 60.0) -> None:
    deadline = time.monotonic() + within_s
    while True:
        assert svc.proc is not None and svc.proc.poll() is None, f"{svc.name} exited"
        try:
            if get(f"http://127.0.0.1:{svc.metrics_port}/metrics")[0] == 200:
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"{svc.name}-{svc.index} not healthy in {within_s} s"
        time.sleep(0.2)


def start(svc: Service, tmp: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETPULSE_")}
    env.update(svc.env, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    cwd = tmp / f"{svc.name}-{svc.index}"
    cwd.mkdir(exist_ok=True)
    svc.log = tmp / f"{svc.name}-{svc.index}.log"
    # the image's entrypoint is `fleetpulse`, i.e. services.cli:main
    svc.proc = subprocess.Popen(
        [sys.executable, "-m", "services.cli", *svc.argv], cwd=cwd, env=env,
        stdout=svc.log.open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip


def get(url: str, timeout: float = 3.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def healthcheck_url(test: list[str], svc_ports: dict[str, int]) -> str:
    """The URL a compose healthcheck fetches, with the container's port made this process's."""
    (url,) = re.findall(r"http://127\.0\.0\.1:\d+[^'\" ]*", " ".join(test))
    for container, local in svc_ports.items():
        url = url.replace(f"127.0.0.1:{container}/", f"127.0.0.1:{local}/")
    return url


@dataclass
class Stack:
    doc: dict[str, Any]
    services: list[Service]

    @property
    def running(self) -> list[Service]:
        return [s for s in self.services if s.name not in ONE_SHOT]

    def only(self, name: str) -> Service:
        (svc,) = [s for s in self.services if s.name == name]
        return svc

    def logs(self, tail: int | None = 25) -> str:
        parts = []
        for svc in self.services:
            if svc.log is not None and svc.log.exists():
                lines = svc.log.read_text(errors="replace").splitlines()
                parts.append(
                    f"--- {svc.name}-{svc.index}\n" + "\n".join(lines[-tail if tail else 0 :])
                )
        return "\n".join(parts)

    def stop(self, timeout: float = 20.0) -> dict[str, int | None]:
        for svc in self.services:
            if svc.proc is not None and svc.proc.poll() is None:
                svc.proc.send_signal(signal.SIGTERM)
        codes: dict[str, int | None] = {}
        for svc in self.services:
            if svc.proc is not None:
                try:
                    codes[f"{svc.name}-{svc.index}"] = svc.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    codes[f"{svc.name}-{svc.index}"] = None
                    svc.proc.kill()
                    svc.proc.wait()
        return codes


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The whole compose stack as local processes, the example app deployed, the proxy answering."""
    env = dotenv()
    mp = pytest.MonkeyPatch()
    for key, value in env.items():  # what compose passes the NATS nodes (their passwords)
        mp.setenv(key, value)
    doc = load_compose()
    for i in (1, 2, 3):
        command = doc["services"][f"nats-{i}"]["command"]
        # NatsCluster passes the same, with a temporary store and its own name per node
        assert command == [
            "-c", "/etc/nats/nats.conf", "--server_name", f"nats-{i}", "-sd", "/data/jetstream"
        ]  # fmt: skip
    tmp = tmp_path_factory.mktemp("compose")
    st = Stack(doc, plan(doc, env, tmp))
    cluster = NatsCluster(3, config_file=node_config(doc, tmp / "volumes", tmp / "node"))
    try:
        keys = st.only("auth-keys")
        start(keys, tmp)
        assert keys.proc is not None and keys.proc.wait(60) == 0, st.logs()
        cluster.start()
        for svc in st.services:
            if "FLEETPULSE_NATS_URL" in svc.env:
                svc.env["FLEETPULSE_NATS_URL"] = cluster.url
        first = [s for s in st.running if s.name == FIRST]
        for svc in first:
            start(svc, tmp)
        for svc in first:
            wait_healthy(svc)
        for svc in st.running:
            if svc.name != FIRST:
                start(svc, tmp)
        deploy = st.only("deploy")
        start(deploy, tmp)
        assert deploy.proc is not None and deploy.proc.wait(60) == 0, st.logs()
        yield st
    finally:
        st.stop()
        cluster.stop()
        mp.undo()


def test_the_stack_is_what_the_compose_file_says(stack: Stack) -> None:
    names = sorted({s.name for s in stack.services})
    assert names == ["agent", "auth", "auth-keys", "controller", "deploy", "proxy", "recorder",
                     "router"]  # fmt: skip
    assert [s.name for s in stack.services].count("controller") == 2
    assert [s.name for s in stack.services].count("auth") == 2
    assert stack.only("auth-keys").proc.returncode == 0  # type: ignore[union-attr]
    assert [s.name for s in stack.services].count("agent") == 2
    assert stack.only("deploy").proc.returncode == 0  # type: ignore[union-attr]


def test_the_proxy_answers_for_the_deployed_app(stack: Stack) -> None:
    url = f"http://127.0.0.1:{stack.only('proxy').http_port}/greet?name=compose"
    deadline, last = time.monotonic() + 90, (0, b"")
    while time.monotonic() < deadline:
        for svc in stack.running:
            assert svc.proc is not None and svc.proc.poll() is None, stack.logs()
        try:
            last = get(url)
        except OSError as exc:
            last = (0, str(exc).encode())
        if last[0] == 200:
            break
        time.sleep(0.5)
    assert last[0] == 200, f"proxy answered {last}\n" + stack.logs()
    assert json.loads(last[1])["message"] == "hello, compose"


def test_every_healthcheck_passes(stack: Stack) -> None:
    for svc in stack.running:  # each service's compose healthcheck, against this process
        test = (stack.doc["services"][svc.name].get("healthcheck") or {}).get("test")
        assert test, f"{svc.name} has no healthcheck"
        ports = {METRICS_PORT: svc.metrics_port, PROXY_PORT: svc.http_port or 0}
        status, _ = get(healthcheck_url(test, ports))
        assert status == 200, f"{svc.name} healthcheck failed"


def test_every_dashboard_metric_is_exposed(stack: Stack) -> None:
    _check_dashboard_metrics(stack.running)


def test_no_role_was_refused_anything(stack: Stack) -> None:
    # NATS' own words for a publish/subscribe or login it refused, and the auth callout's line
    # for a login it refused (services/auth/service.py). Not every "refused" in the logs: the
    # controller counts a late "starting" after "ready" as a refused transition by design
    # (services/controller/lifecycle.py), which a failover's replay can show here.
    words = ("permissions violation", "authorization violation", "refused connection")
    lines = stack.logs(tail=None).splitlines()
    assert [line for line in lines if any(w in line.lower() for w in words)] == []


def test_replicas_log_in_with_their_own_credentials(stack: Stack) -> None:
    granted: dict[str, float] = {}
    for svc in (s for s in stack.running if s.name == FIRST):
        _, body = get(f"http://127.0.0.1:{svc.metrics_port}/metrics")
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                if sample.name == "fleetpulse_auth_decisions_total":
                    why = sample.labels["why"]
                    granted[why] = granted.get(why, 0.0) + sample.value
    assert granted.get("replica", 0) >= 1, granted  # the example app's replica, as itself
    assert {"controller", "agent", "router", "recorder", "operator"} <= set(granted), granted


def test_every_service_stops_cleanly_on_sigterm(stack: Stack) -> None:
    codes = stack.stop()
    assert codes and all(code == 0 for code in codes.values()), f"{codes}\n{stack.logs()}"


def _check_dashboard_metrics(running: list[Service]) -> None:
    exposed: set[str] = set()
    for svc in running:
        port = svc.http_port if svc.name == "proxy" else svc.metrics_port
        status, body = get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200, svc.name
        for family in text_string_to_metric_families(body.decode()):
            exposed.update(family.name + s for s in SUFFIXES.get(family.type, ("",)))
            exposed.update(sample.name for sample in family.samples)
    used = dashboard_metric_names()
    assert len(used) >= 10, used
    missing = sorted(used - exposed)
    assert not missing, f"dashboard metrics no service exposes: {missing}"


def dashboard_metric_names() -> set[str]:
    names: set[str] = set()
    for path in (COMPOSE / "grafana" / "dashboards").glob("*.json"):
        for expr in _exprs(json.loads(path.read_text())):
            names.update(re.findall(r"\b(fleetpulse_[a-z0-9_]+)", expr))
    return names


def _exprs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from _exprs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _exprs(item)


def dockerfile_env() -> dict[str, str]:
    """The ENV of compose/Dockerfile (`ENV A=1 \\` continuation lines, no quoting)."""
    text = (COMPOSE / "Dockerfile").read_text().replace("\\\n", " ")
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            out.update(item.split("=", 1) for item in line[4:].split())  # type: ignore[misc]
    return out


def test_the_proxy_listens_beyond_the_containers_loopback() -> None:
    """Inside a container 127.0.0.1 is the container's own: a published port reaches only a
    service listening on the container's other interfaces (the README's curl was reset)."""
    from services.cli import build_parser

    spec = load_compose()["services"]["proxy"]
    env = {
        **dockerfile_env(),
        **{k: interpolate(v, dotenv()) for k, v in spec["environment"].items()},
    }
    args = build_parser().parse_args(spec["command"])
    host = ProxyConfig.from_args(args, env).host
    assert host not in ("127.0.0.1", "localhost", "::1"), f"the proxy in compose listens on {host}"

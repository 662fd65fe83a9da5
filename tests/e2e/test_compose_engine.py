"""compose/ on a real Docker engine, the way the README runs it (`scripts/compose-check`).

`docker compose build` and `docker compose up -d` in compose/, with the published ports moved to
free loopback ports and a project name of this run's own, through the `.env` variables (set in
the environment; no file is edited). Images: whatever the environment names (scripts/standin-images
sets BASE_IMAGE, NATS_IMAGE, PROMETHEUS_IMAGE and GRAFANA_IMAGE to stand-ins built from Debian
packages where no registry is reachable), else the public defaults of compose/.env.

The tests run in order on one stack: answers, status, healthchecks, scrapes, recordings, faults
and an upgrade under load, the dashboard's queries, `docker compose down` under load, and last
the logs of every container. `docker compose down -v` always runs at the end. Deselected unless
pytest is given `--engine`; with it, a missing engine is a failure, never a skip.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shlex
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trustme

from shared.errors import BusAuthError
from shared.natsauth import NatsAuth
from shared.natsbus import NatsBus
from shared.natsserver import free_ports
from tests.e2e.engine import (
    COMPOSE_DIR,
    ROOT,
    Compose,
    Load,
    Report,
    container_metric,
    docker,
    http_json,
    sh,
    summary,
    wait_for,
)
from tests.runtimeenv_fixtures import write_app

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

APP, DEPLOYMENT = "greeter", "Greeter"
SCRAPED = {"controller": 2, "auth": 2, "agent": 2, "proxy": 1, "router": 1, "recorder": 1}
"""Prometheus jobs (compose/prometheus/prometheus.yml) and how many targets each has."""
OWN_FAMILIES = {  # job -> metric prefixes its processes may export (shared/metrics_catalog.py)
    "controller": ("fleetpulse_controller_",),
    "auth": ("fleetpulse_auth_",),
    "agent": ("fleetpulse_agent_",),
    "proxy": ("fleetpulse_proxy_", "fleetpulse_router_"),
    "router": ("fleetpulse_gateway_", "fleetpulse_router_"),
    "recorder": ("fleetpulse_recorder_",),
}
PARTITIONS = 16
ONE_SHOT = ("auth-keys", "deploy")
"""Jobs that must have exited 0; every other service runs and is healthy."""
UNHEALTHY_LOG = re.compile(r"Traceback|permissions? violation|Permission denied|PermissionError")


class _LineReader:
    """A child's output read on a thread, so a test can wait for a line while it runs."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_for(self, done: Any, within_s: float) -> None:
        deadline = time.monotonic() + within_s
        while not done(list(self.lines)):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"not in {within_s:g} s: {len(self.lines)} lines read")
            time.sleep(0.05)

    def rest(self, within_s: float) -> str:
        """Everything, once the child has ended (after `within_s`, it is stopped)."""
        try:
            self.proc.wait(within_s)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait(10)
        self._thread.join(10)
        return "".join(self.lines)


@dataclass
class Stack:
    compose: Compose
    ports: dict[str, int]
    report: Report
    tmp: Path
    load: Load | None = None
    logs: list[str] = field(default_factory=list)
    """Log snapshots: containers replaced by scaling or the upgrade take their logs with them."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports['FP_HTTP_PORT']}"

    def prometheus(self, query: str) -> list[dict[str, Any]]:
        q = urllib.parse.urlencode({"query": query})
        doc = http_json(f"http://127.0.0.1:{self.ports['FP_PROMETHEUS_PORT']}/api/v1/query?{q}")
        return doc["data"]["result"]  # type: ignore[no-any-return]

    def snapshot_logs(self) -> None:
        self.logs.append(self.compose.logs())

    def all_healthy(self) -> list[str]:
        """Names of containers not (yet) healthy; the deploy job must have exited 0."""
        bad = []
        for c in self.compose.containers():
            if c["Service"] in ONE_SHOT:
                if c["State"] != "exited" or c["ExitCode"] != 0:
                    bad.append(f"{c['Name']} {c['State']} {c['ExitCode']}")
            elif c["State"] != "running" or c["Health"] != "healthy":
                bad.append(f"{c['Name']} {c['State']} {c['Health']}")
        return bad


def _engine_or_fail() -> None:
    for argv in (["docker", "info"], ["docker", "compose", "version"]):
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            pytest.fail(f"no Docker engine: `{' '.join(argv)}`: {exc} (run scripts/engine-up)")
        if proc.returncode != 0:
            pytest.fail(
                f"no Docker engine: `{' '.join(argv)}` exited {proc.returncode}: "
                f"{proc.stderr.strip()[-500:]} (run scripts/engine-up)"
            )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    _engine_or_fail()
    tmp = tmp_path_factory.mktemp("engine")
    names = ("FP_HTTP_PORT", "FP_NATS_PORT", "FP_PROMETHEUS_PORT", "FP_GRAFANA_PORT")
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    assert not {4222, 8000} & set(ports.values())
    # as compose/.env publishes them: the ingress on every interface, the rest on loopback
    # (FP_PUBLISH_ADDRESS); this test sends traffic to 127.0.0.1 only
    env = {k: str(v) for k, v in ports.items()}
    env["FLEETPULSE_IMAGE"] = "fleetpulse-compose-check:latest"  # not the user's fleetpulse:latest
    compose = Compose(f"fpcheck{os.getpid()}", env)
    report = Report(Path(os.environ.get("FP_ENGINE_REPORT", tmp / "report.txt")))
    images = {k: os.environ.get(k, "(compose/.env)") for k in
              ("BASE_IMAGE", "NATS_IMAGE", "PROMETHEUS_IMAGE", "GRAFANA_IMAGE")}  # fmt: skip
    report.add(f"project {compose.project}, ports {ports}, images {images}")
    st = Stack(compose, ports, report, tmp)
    try:
        with report.check("docker compose build"):
            compose("build", timeout=900)
        with report.check("docker compose up -d"):
            compose("up", "-d", timeout=600)
        yield st
    finally:
        if st.load is not None:
            st.load.stop()
        with report.check("docker compose down -v (cleanup)"):
            compose("down", "-v", "--remove-orphans", "--timeout", "40", timeout=300, check=False)
        left = docker(
            "ps", "-aq", "--filter", f"label=com.docker.compose.project={compose.project}"
        )
        assert not left.strip(), f"containers left behind: {left}"
        report.add(f"total {time.monotonic() - report.t0:.1f} s; report in {report.path}")


# -- answers, status, health ------------------------------------------------------------------


def test_the_readme_curl_answers_through_the_published_port(stack: Stack) -> None:
    port = stack.ports["FP_HTTP_PORT"]
    curl = ("curl", "-sS", "--fail", "--max-time", "5", f"localhost:{port}/greet?name=you")

    with stack.report.check("README curl 'localhost:PORT/greet?name=you' answers") as d:
        proc = wait_for(
            lambda: (p := sh(*curl, check=False)).returncode == 0 and p, 180,
            "curl through the published port",
        )  # fmt: skip
        assert json.loads(proc.stdout)["message"] == "hello, you"
        d["answer"] = proc.stdout.strip()


def test_fleetpulse_status_from_compose_run_shows_the_app_running(stack: Stack) -> None:
    def running() -> dict[str, Any] | None:
        out = stack.compose("run", "--rm", "-T", "deploy", "status", "--json", timeout=120)
        app = json.loads(out)["applications"][APP]
        return app if app["status"] == "RUNNING" else None

    with stack.report.check("fleetpulse status (docker compose run) shows the app RUNNING") as d:
        app = wait_for(running, 120, f"{APP} RUNNING in `fleetpulse status`", every_s=2)
        d["replicas"] = app["deployments"][DEPLOYMENT]["running_replicas"]


def test_every_service_is_healthy_by_its_own_healthcheck(stack: Stack) -> None:
    with stack.report.check("every service healthy by its own healthcheck") as d:
        wait_for(lambda: not stack.all_healthy(), 180, "every container healthy", every_s=1)
        d["containers"] = len(stack.compose.containers())


def test_prometheus_scrapes_every_fleetpulse_target(stack: Stack) -> None:
    port = stack.ports["FP_PROMETHEUS_PORT"]

    def all_up() -> dict[str, int] | None:
        targets = http_json(f"http://127.0.0.1:{port}/api/v1/targets")["data"]["activeTargets"]
        up: dict[str, int] = {}
        for t in targets:
            if t["health"] != "up":
                return None
            up[t["labels"]["job"]] = up.get(t["labels"]["job"], 0) + 1
        return up if up == SCRAPED else None

    with stack.report.check("Prometheus scrapes every fleetpulse target up") as d:
        d["targets"] = wait_for(all_up, 120, f"targets up: {SCRAPED}", every_s=1)


def test_each_target_exports_only_its_own_metric_families(stack: Stack) -> None:
    with stack.report.check("each target exports only its own service's metric families") as d:
        rows = stack.prometheus('group by (job, __name__) ({__name__=~"fleetpulse_.+"})')
        foreign = sorted(
            f"{r['metric']['job']}: {r['metric']['__name__']}"
            for r in rows
            if not r["metric"]["__name__"].startswith(OWN_FAMILIES[r["metric"]["job"]])
        )
        assert not foreign, f"families exported by a service they do not belong to: {foreign}"
        d["families"] = len(rows)


def test_each_replica_logs_in_with_its_own_credential(stack: Stack) -> None:
    """The auth callout is on by default: replicas get in with the credentials their agents
    mint, and the shared `replica` user of the static config no longer exists."""
    granted = 'sum(fleetpulse_auth_decisions_total{result="granted", why="replica"})'
    with stack.report.check("auth callout: replicas log in as themselves, no shared user") as d:
        rows = wait_for(
            lambda: [r for r in stack.prometheus(granted) if float(r["value"][1]) > 0], 60,
            "the auth services granting replicas their own credentials",
        )  # fmt: skip
        d["replica_logins"] = int(float(rows[0]["value"][1]))
        url = f"nats://127.0.0.1:{stack.ports['FP_NATS_PORT']}"
        shared = NatsAuth(user="replica", password=secrets.token_urlsafe(16))
        with pytest.raises(BusAuthError):
            asyncio.run(NatsBus.connect(url, name="shared-replica", auth=shared))
        d["shared_replica_user"] = "refused"


# -- secure by default ------------------------------------------------------------------------


def test_only_the_ingress_is_published_beyond_loopback(stack: Stack) -> None:
    with stack.report.check(
        "published: the ingress on every interface, the rest on 127.0.0.1"
    ) as d:
        bindings: dict[str, list[str]] = {}
        for c in stack.compose.containers():
            ports = json.loads(docker("inspect", "--format", "{{json .HostConfig.PortBindings}}",
                                      c["Name"]))  # fmt: skip
            for port, binds in (ports or {}).items():
                for b in binds or []:
                    bindings.setdefault(c["Service"], []).append(f"{b['HostIp'] or '*'}->{port}")
        d["bindings"] = bindings
        wide = {svc for svc, bs in bindings.items() for b in bs if not b.startswith("127.0.0.1")}
        assert wide == {"proxy"}, bindings
        assert set(bindings) == {"proxy", "nats-1", "prometheus", "grafana"}, bindings
        assert "FP_ADMIN_PASSWORD" not in (COMPOSE_DIR / ".env").read_text()
        assert "change-me" not in (COMPOSE_DIR / ".env").read_text()


def _login(stack: Stack, role: str) -> dict[str, str]:
    """The documented step: `eval "$(docker compose run --rm -T credentials [ROLE])"`."""
    out = stack.compose("run", "--rm", "-T", "credentials", role, timeout=180)
    env = dict(re.findall(r"^export (\w+)=(.*)$", out, re.M))
    env = {k: shlex.split(v)[0] for k, v in env.items()}
    assert env["FLEETPULSE_NATS_USER"] == role, out
    assert env["FLEETPULSE_NATS_URL"] == f"nats://127.0.0.1:{stack.ports['FP_NATS_PORT']}"
    return env


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("FLEETPULSE_NATS_")}
    return sh(sys.executable, "-m", "services.cli", *args, env={**full, **env,
              "PYTHONPATH": str(ROOT)}, cwd=ROOT, check=False, timeout=120)  # fmt: skip


def test_the_operator_deploys_with_its_made_credentials_and_other_roles_cannot(
    stack: Stack,
) -> None:
    app = stack.tmp / "audited.yaml"
    app.write_text((COMPOSE_DIR / "apps" / "app.yaml").read_text()
                   .replace("name: greeter", "name: audited")
                   .replace("route_prefix: /greet", "route_prefix: /audited"))  # fmt: skip
    with stack.report.check("operator deploys from the host; other roles refused; recorded") as d:
        operator = _login(stack, "operator")
        ok = _cli(operator, "deploy", str(app))
        assert ok.returncode == 0, ok.stdout + ok.stderr
        intruder = stack.tmp / "intruder.yaml"  # a new app: an unchanged one writes nothing
        intruder.write_text(app.read_text().replace("audited", "intruder"))
        for role in ("recorder", "controller"):
            refused = _cli(_login(stack, role), "deploy", str(intruder))
            assert refused.returncode != 0, f"{role} could deploy: {refused.stdout}"
        ok = _cli(operator, "delete", "audited")
        assert ok.returncode == 0, ok.stdout + ok.stderr
        shown = _cli(operator, "audit", "--app", "audited", "--json")
        assert shown.returncode == 0, shown.stderr
        records = [json.loads(line) for line in shown.stdout.splitlines()]
        assert [(r["action"], r["user"]) for r in records] == [
            ("deploy", "operator"), ("delete", "operator")], records  # fmt: skip
        d["records"] = len(records)


def test_an_app_whose_code_exists_only_in_its_uploaded_working_dir(stack: Stack) -> None:
    """Issue 33 through compose: `fleetpulse deploy` from the host (the operator's login) uploads
    the working_dir into fp_packages; an agent container (which never saw the code) fetches,
    verifies and unpacks it and the replica answers through the published proxy port."""
    wd = write_app(stack.tmp / "shipped-wd", "compose-v1", pkg="fp_absent")
    app = stack.tmp / "shipped.yaml"
    app.write_text(
        "applications:\n  - name: shipped\n    route_prefix: /shipped\n"
        f"    import_path: shipped_app:app\n    runtime_env:\n      working_dir: {wd}\n"
    )
    url = f"http://127.0.0.1:{stack.ports['FP_HTTP_PORT']}/shipped"
    with stack.report.check("runtime env: code only in the uploaded working_dir answers") as d:
        operator = _login(stack, "operator")
        t0 = time.monotonic()
        ok = _cli(operator, "deploy", str(app))
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert "1 uploaded" in ok.stdout, ok.stdout
        body = wait_for(lambda: _json_200(url), 180, "the shipped app through the proxy")
        d["deploy_to_answer_s"] = round(time.monotonic() - t0, 1)
        assert body["helper"] == "compose-v1" and body["pkg"] is None, body
        assert "/packages/" in body["cwd"], body  # the agent's unpacked package, not /apps
        d["cwd"] = body["cwd"]
        gone = _cli(operator, "delete", "shipped")
        assert gone.returncode == 0, gone.stdout + gone.stderr
        stack.snapshot_logs()  # the fetch and start, for the traceback check (in a -k subset too)


def _json_200(url: str) -> Any:
    try:
        return http_json(url, timeout=5)
    except (OSError, ValueError):
        return None


def test_fresh_stacks_make_their_own_secrets_and_a_placeholder_is_refused(stack: Stack) -> None:
    with stack.report.check("two fresh stacks: different secrets; a placeholder refused") as d:
        other = Compose(f"{stack.compose.project}b", stack.compose.env)
        try:
            theirs = other("run", "--rm", "-T", "credentials", timeout=300)
            mine = stack.compose("run", "--rm", "-T", "credentials", timeout=180)
            password = re.compile(r"FLEETPULSE_NATS_PASSWORD=(\S+)")
            assert password.search(theirs) and password.search(mine), (theirs, mine)
            assert password.search(theirs)[1] != password.search(mine)[1]  # type: ignore[index]
            bad = sh("docker", "compose", "run", "--rm", "-T", "-e",
                     "FP_OPERATOR_PASSWORD=operator-change-me", "auth-keys", check=False,
                     env={**os.environ, **other.env, "COMPOSE_PROJECT_NAME": other.project})  # fmt: skip
            assert bad.returncode != 0
            assert "FP_OPERATOR_PASSWORD" in bad.stdout + bad.stderr, bad.stdout + bad.stderr
            d["refused"] = (bad.stdout + bad.stderr).strip().splitlines()[-1][:200]
        finally:
            other("down", "-v", "--remove-orphans", timeout=180, check=False)


# -- recordings -------------------------------------------------------------------------------


def test_the_recorder_writes_as_the_non_root_user_and_replay_reads_it(stack: Stack) -> None:
    list_files = (
        "import os, json; print(json.dumps([[f, os.stat('/recordings/' + f).st_uid,"
        " os.stat('/recordings/' + f).st_size] for f in sorted(os.listdir('/recordings'))]))"
    )
    with stack.report.check("recorder writes to its volume as uid 10001; replay reads it") as d:
        assert stack.compose("exec", "-T", "recorder", "id", "-u").strip() == "10001"
        files = wait_for(
            lambda: [f for f in json.loads(stack.compose(
                "exec", "-T", "recorder", "python", "-c", list_files)) if f[2] > 0],
            60, "a non-empty recording in /recordings",
        )  # fmt: skip
        assert all(uid == 10001 for _, uid, _ in files), files

        def replayed() -> str | None:
            out = stack.tmp / f"recordings-{time.monotonic_ns()}"
            stack.compose("cp", "recorder:/recordings", str(out))
            proc = sh(
                sys.executable, "-m", "services.cli", "replay", str(out),
                "--what-if", str(COMPOSE_DIR / "apps" / "app.yaml"), "--model", "open",
                cwd=ROOT,
            )  # fmt: skip
            found = re.search(r"(\d+) reports", proc.stdout)
            return proc.stdout.strip() if found and int(found.group(1)) > 0 else None

        summary_line = wait_for(replayed, 60, "a replay of the recordings reading reports", 2)
        d["files"] = len(files)
        d["bytes"] = sum(size for _, _, size in files)
        d["replay"] = summary_line.splitlines()[-1].strip()[:120]


# -- faults under load ------------------------------------------------------------------------


def _load(stack: Stack) -> Load:
    if stack.load is None:
        stack.load = Load(f"{stack.url}/greet?name=").start()
    return stack.load


def _no_failures(stack: Stack, since: float, what: str) -> dict[str, Any]:
    results = _load(stack).since(since)
    s = summary(results)
    when = [f"{r.start - stack.report.t0:.1f}-{r.end - stack.report.t0:.1f} s" for r in results
            if not r.ok][:10]  # fmt: skip
    assert s["failed"] == 0, f"{what}: {s}; failed requests ran at {when} (report clock)"
    assert s["requests"] > 0, f"{what}: no request completed"
    return s


def _partitions(container: str) -> float:
    return container_metric(container, "fleetpulse_controller_partitions_owned")


def test_controller_member_killed_under_load(stack: Stack) -> None:
    load, t0 = _load(stack), time.monotonic()
    members = [c["Name"] for c in stack.compose.running("controller")]
    assert len(members) == 2, members
    victim, survivor = members
    with stack.report.check(f"SIGKILL controller member {victim} under load") as d:
        wait_for(lambda: _partitions(survivor) > 0, 60, f"{survivor} owns partitions")
        kill = time.monotonic()
        docker("kill", victim)
        wait_for(lambda: _partitions(survivor) == PARTITIONS, 60, f"{survivor} owns all")
        d["takeover_s"] = round(time.monotonic() - kill, 1)
        back = time.monotonic()
        stack.compose("start", "controller")
        wait_for(
            lambda: _partitions(victim) > 0 and _partitions(survivor) < PARTITIONS,
            90, f"{victim} back and sharing the partitions",
        )  # fmt: skip
        d["rejoin_s"] = round(time.monotonic() - back, 1)
        d["load"] = _no_failures(stack, t0, "controller kill")
    assert load.results


def test_nats_node_restarted_under_load(stack: Stack) -> None:
    t0 = time.monotonic()
    (node,) = [c["Name"] for c in stack.compose.running("nats-2")]
    healthz = ["wget", "-q", "-O", "-", "http://127.0.0.1:8222/healthz?js-enabled-only=true"]
    with stack.report.check(f"docker restart NATS node {node} under load") as d:
        _load(stack)
        start = time.monotonic()
        docker("restart", node, timeout=120)
        wait_for(lambda: docker("exec", node, *healthz, check=False), 120, f"{node} JS healthy")
        d["jetstream_healthy_s"] = round(time.monotonic() - start, 1)
        wait_for(lambda: not stack.all_healthy(), 120, "every container healthy", every_s=1)
        d["load"] = _no_failures(stack, t0, "NATS restart")


def test_the_agent_hosting_replicas_killed_under_load(stack: Stack) -> None:
    load, t0 = _load(stack), time.monotonic()
    agents = {c["ID"][:12]: c["Name"] for c in stack.compose.running("agent")}
    with stack.report.check("SIGKILL the agent hosting replicas under load") as d:
        recent = time.monotonic() - 3
        hosts = wait_for(lambda: load.hosts_since(recent) & set(agents), 30, "serving hosts")
        victim_id = sorted(hosts)[0]
        victim = agents[victim_id]
        others = [name for cid, name in agents.items() if cid != victim_id]
        on_victim = container_metric(victim, "fleetpulse_agent_replicas_running")
        before = sum(container_metric(o, "fleetpulse_agent_replicas_running") for o in others)
        kill = time.monotonic()
        docker("kill", victim)
        wait_for(
            lambda: sum(container_metric(o, "fleetpulse_agent_replicas_running") for o in others)
            >= before + on_victim,
            120, f"{on_victim:g} replica(s) of {victim} placed on {others}",
        )  # fmt: skip
        d["replaced_s"] = round(time.monotonic() - kill, 1)
        settled = time.monotonic()
        wait_for(lambda: load.hosts_since(settled + 1), 30, "answers after the replacement")
        assert victim_id not in load.hosts_since(settled), "answers still from the killed agent"
        d["replicas_moved"] = int(on_victim)
        stack.compose("start", "agent")
        wait_for(lambda: not stack.all_healthy(), 120, "every container healthy", every_s=1)
        d["load"] = _no_failures(stack, t0, "agent kill")


def test_scale_agents_to_three_under_load(stack: Stack) -> None:
    t0 = time.monotonic()
    with stack.report.check("docker compose up -d --scale agent=3 under load") as d:
        _load(stack)
        stack.snapshot_logs()
        stack.compose("up", "-d", "--scale", "agent=3", timeout=300)
        wait_for(lambda: len(stack.compose.running("agent")) == 3, 60, "3 agents running")
        wait_for(lambda: not stack.all_healthy(), 120, "every container healthy", every_s=1)
        d["healthy_s"] = round(time.monotonic() - t0, 1)
        wait_for(
            lambda: len(stack.prometheus('up{job="agent"} == 1')) == 3, 60,
            "Prometheus scraping all 3 agents (found by DNS)",
        )  # fmt: skip
        d["scraped_s"] = round(time.monotonic() - t0, 1)
        d["load"] = _no_failures(stack, t0, "scale agents")


def test_no_app_was_deregistered(stack: Stack) -> None:
    with stack.report.check("no app deregistered by the proxy") as d:
        logs = stack.compose("logs", "--no-color", "proxy")
        deleted = [
            f"app {a} deregistered (the app is being deleted)" for a in ("audited", "shipped")
        ]
        bad = [  # those two are deleted on purpose, above
            line
            for line in logs.splitlines()
            if " deregistered (" in line and not any(x in line for x in deleted)
        ]
        assert not bad, bad
        d["registered"] = sum(" registered (" in line for line in logs.splitlines())


# -- the dashboard ------------------------------------------------------------------------------


def dashboard_queries() -> list[tuple[str, str]]:
    doc = json.loads((COMPOSE_DIR / "grafana" / "dashboards" / "fleetpulse.json").read_text())
    return [
        (panel["title"], target["expr"])
        for panel in doc["panels"]
        for target in panel.get("targets", [])
    ]


def test_every_dashboard_panel_query_returns_data(stack: Stack) -> None:
    base = f"http://127.0.0.1:{stack.ports['FP_GRAFANA_PORT']}/api/datasources/proxy/uid/prometheus"

    missing: list[str] = []

    def every_query_has_data() -> bool:
        missing.clear()
        for title, expr in dashboard_queries():
            q = urllib.parse.urlencode({"query": expr.replace("$__rate_interval", "1m")})
            if not http_json(f"{base}/api/v1/query?{q}")["data"]["result"]:
                missing.append(f"{title}: {expr}")
        return not missing

    with stack.report.check("every Grafana panel query returns data (via its datasource)") as d:
        d["queries"] = len(dashboard_queries())
        # HTTP requests go from HAProxy straight to the replicas and cross no router; the router
        # panels show handles and the gateway, so some calls go through the gateway meanwhile
        calls = _GatewayCalls(_login(stack, "operator")).start()
        try:
            wait_for(every_query_has_data, 60, "every panel query answered", every_s=5)
        except AssertionError as exc:
            raise AssertionError(f"panel queries without data: {missing}") from exc
        finally:
            d["gateway_calls"] = calls.stop()


class _GatewayCalls:
    """A gateway caller (`fp.v1.call.{app}.{deployment}`, the operator's login) in a thread."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.answered = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def start(self) -> _GatewayCalls:
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(30)
        return self.answered

    async def _main(self) -> None:
        auth = NatsAuth.from_env(self.env)
        bus = await NatsBus.connect(
            self.env["FLEETPULSE_NATS_URL"], name="gateway-calls", auth=auth
        )
        headers = {"Fp-Http-Method": "GET", "Fp-Path": "/greet", "Fp-Query": "name=gateway"}
        try:
            while not self._stop.is_set():
                try:
                    reply = await bus.request(
                        f"fp.v1.call.{APP}.{DEPLOYMENT}", b"", timeout=5, headers=headers
                    )
                    if (reply.headers or {}).get("Fp-Status", "200") == "200":
                        self.answered += 1
                except Exception:  # counted by what answered; the panels say the rest
                    pass
                await asyncio.sleep(0.2)
        finally:
            await bus.close()


# -- upgrade --------------------------------------------------------------------------------


def _image_id(ref: str) -> str:
    return docker("image", "inspect", "--format", "{{.Id}}", ref).strip()


def _roll(stack: Stack, service: str, new_image: str, grace_s: int) -> None:
    """Replace every container of `service` one at a time: start one on the new image, wait for
    it to be healthy, stop (SIGTERM) and remove one old one, wait until all is healthy again."""
    old = [c for c in stack.compose.containers(service) if c["State"] == "running"]
    for c in old:
        count = len(stack.compose.running(service))
        stack.compose("up", "-d", "--no-deps", "--no-recreate", "--scale", f"{service}={count + 1}",
                      service, timeout=300)  # fmt: skip
        wait_for(lambda: not stack.all_healthy(), 120, f"new {service} healthy", every_s=1)
        docker("stop", "-t", str(grace_s), c["Name"], timeout=grace_s + 60)
        code = docker("inspect", "--format", "{{.State.ExitCode}}", c["Name"]).strip()
        assert code == "0", f"{c['Name']} exited {code} on SIGTERM (137: killed at the timeout)"
        docker("rm", c["Name"])
    current = {c["Image"] for c in stack.compose.running(service)}
    assert all(_image_id(i) == new_image for i in current), (service, current)


def test_upgrade_one_service_at_a_time_under_load(stack: Stack) -> None:
    t0 = time.monotonic()
    with stack.report.check("upgrade: rebuild, recreate one at a time under load") as d:
        _load(stack)
        before = _image_id("fleetpulse-compose-check:latest")
        stack.compose.env["FLEETPULSE_VERSION"] = f"upgrade-{os.getpid()}"
        stack.compose("build", timeout=900)
        new = _image_id("fleetpulse-compose-check:latest")
        assert new != before, "the rebuild made no new image"
        stack.snapshot_logs()
        # docs/operations.md, Upgrade: NATS nodes one at a time, controllers, agents, then the
        # proxy and the gateway (and the recorder)
        for node in ("nats-1", "nats-2", "nats-3"):
            stack.report.add(f"     upgrade: recreating {node}")
            stack.compose("up", "-d", "--no-deps", "--force-recreate", node, timeout=300)
            wait_for(lambda: not stack.all_healthy(), 120, f"{node} healthy", every_s=1)
        for service, grace_s in (("auth", 10), ("controller", 10), ("agent", 30)):
            stack.report.add(f"     upgrade: rolling {service}")
            _roll(stack, service, new, grace_s)
        for service in ("proxy", "router", "recorder"):
            stack.report.add(f"     upgrade: recreating {service}")
            stack.compose("up", "-d", "--no-deps", "--force-recreate", service, timeout=300)
            wait_for(lambda: not stack.all_healthy(), 120, f"{service} healthy", every_s=1)
        d["load"] = _no_failures(stack, t0, "upgrade")
        d["took_s"] = round(time.monotonic() - t0, 1)


# -- down under load, logs ------------------------------------------------------------------------


def test_compose_down_under_load_drains(stack: Stack) -> None:
    assert stack.load is not None
    with stack.report.check("every request of the fault and upgrade load") as d:
        d.update(everything := summary(stack.load.stop()))
        assert everything["failed"] == 0, everything
    stack.snapshot_logs()
    with stack.report.check("docker compose down under load: drained, nothing killed") as d:
        load = Load(f"{stack.url}/greet?name=", retry=False).start()
        events = subprocess.Popen(
            ["docker", "events", "--format", "{{json .}}",
             "--filter", f"label=com.docker.compose.project={stack.compose.project}"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        follow = subprocess.Popen(
            ["docker", "compose", "logs", "--no-color", "--timestamps", "-f"],
            cwd=COMPOSE_DIR, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, **stack.compose.env, "COMPOSE_PROJECT_NAME": stack.compose.project},
        )  # fmt: skip
        followed = _LineReader(follow)
        # the agents' drain lines are what this checks: down starts once the follower printed
        # every running agent's start line (it replays the history first, then follows); a
        # fixed second was not always enough on a busy machine (the follower missed them)
        agents = len(stack.compose.running("agent"))
        followed.wait_for(lambda lines: sum("up: capacity" in x for x in lines) >= agents, 60)
        time.sleep(0.5)  # `docker events` gets the same head start (it only watches)
        start = time.monotonic()
        stack.compose("down", timeout=300)
        d["down_s"] = round(time.monotonic() - start, 1)
        results = load.stop()
        events.terminate()
        ev_out, _ = events.communicate(timeout=30)
        logs = followed.rest(60)
        stack.logs.append(logs)
        killed = []
        for line in ev_out.splitlines():
            e = json.loads(line)
            attrs = e.get("Actor", {}).get("Attributes", {})
            if e.get("Action") == "kill" and attrs.get("signal") == "9":
                killed.append(attrs.get("name"))
            if e.get("Action") == "die" and attrs.get("exitCode") not in ("0", None):
                killed.append(f"{attrs.get('name')} exit {attrs.get('exitCode')}")
        assert not killed, f"stopped by force or failed on the way down: {killed}"
        outcomes: dict[str, int] = {}
        for r in results:
            outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
        bad = {k: v for k, v in outcomes.items() if k.startswith("failed")}
        assert not bad, f"requests that neither completed nor got a retryable error: {outcomes}"
        d["requests"] = outcomes
        drained = [
            line for line in logs.splitlines() if "stopping" in line and "replica(s)" in line
        ]
        assert drained, "no agent drained its replicas"
        assert "did not exit in time" not in logs and "still running after the drain" not in logs
        d["agents_drained"] = len(drained)


def test_no_traceback_or_permission_violation_in_any_log(stack: Stack) -> None:
    with stack.report.check("no traceback or permission violation in any container's log") as d:
        lines = {line for snapshot in stack.logs for line in snapshot.splitlines()}
        saved = stack.report.path.with_name(stack.report.path.stem + "-logs.txt")
        saved.write_text("\n".join(sorted(lines)) + "\n")
        d["saved"] = saved
        ordered = sorted(lines)  # by container, then docker's timestamp
        bad = [i for i, line in enumerate(ordered) if UNHEALTHY_LOG.search(line)]
        # each hit with the lines after it (the traceback itself), so a failure in CI says why
        shown = sorted({j for i in bad[:10] for j in range(i, min(i + 30, len(ordered)))})
        assert not bad, f"{len(bad)} line(s); saved in {saved}:\n" + "\n".join(
            ordered[j] for j in shown
        )
        d["lines"] = len(lines)


# -- TLS for a published NATS port (compose/tls.yml), on the stack brought back up ---------------


def test_the_tls_overlay_serves_nats_over_tls_only(stack: Stack) -> None:
    """After `down` (volumes kept): `up -d` with tls.yml and a throwaway CA. The published NATS
    port refuses plaintext and serves a client that verifies it; every service came back over
    TLS (the README curl answers), with the secrets first start made."""
    ca = trustme.CA()
    tls_dir = stack.tmp / "tls"
    tls_dir.mkdir()
    ca.cert_pem.write_to_path(str(tls_dir / "ca.pem"))
    cert = ca.issue_cert("nats-1", "nats-2", "nats-3", "localhost", "127.0.0.1")
    cert.private_key_pem.write_to_path(str(tls_dir / "server-key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(tls_dir / "server.pem"))
    for f in tls_dir.iterdir():
        f.chmod(0o644)  # the node runs under its own uid
    tls = Compose(stack.compose.project, {**stack.compose.env, "FP_TLS_DIR": str(tls_dir)})
    files = ("-f", "docker-compose.yml", "-f", "tls.yml")
    with stack.report.check("tls.yml: NATS over TLS only; the stack serves through it") as d:
        tls(*files, "up", "-d", timeout=600)
        port = stack.ports["FP_HTTP_PORT"]
        curl = ("curl", "-sS", "--fail", "--max-time", "5", f"localhost:{port}/greet?name=tls")
        proc = wait_for(lambda: (p := sh(*curl, check=False)).returncode == 0 and p, 180,
                        "curl through the stack on TLS")  # fmt: skip
        d["answer"] = proc.stdout.strip()
        out = tls(*files, "run", "--rm", "-T", "credentials", timeout=180)
        login = {k: shlex.split(v)[0] for k, v in re.findall(r"^export (\w+)=(.*)$", out, re.M)}
        nats_port = stack.ports["FP_NATS_PORT"]
        assert login["FLEETPULSE_NATS_URL"] == f"tls://127.0.0.1:{nats_port}", out
        # the front door answers from the replicas it knows before JetStream has its leaders
        # back after the restart: wait for the KV too, not only for the curl
        env = {**login, "FLEETPULSE_NATS_TLS_CA": str(tls_dir / "ca.pem")}

        def status_ok() -> subprocess.CompletedProcess[str]:
            p = _cli(env, "status", "--json")
            assert p.returncode == 0, p.stdout + p.stderr  # the last one is in the failure
            return p

        status = wait_for(status_ok, 180, "fleetpulse status over TLS")
        d["apps"] = sorted(json.loads(status.stdout)["applications"])
        with socket.create_connection(("127.0.0.1", nats_port), timeout=10) as sock:
            info = json.loads(sock.recv(65536).decode().split(" ", 1)[1])
        assert info.get("tls_required") is True, info
        plain = {**login, "FLEETPULSE_NATS_URL": f"nats://127.0.0.1:{nats_port}"}
        refused = _cli(plain, "status", "--connect-timeout", "5")
        assert refused.returncode != 0, refused.stdout
        unverified = _cli(login, "status", "--connect-timeout", "5")  # no CA: not trusted
        assert unverified.returncode != 0, unverified.stdout
        d["plaintext"] = "refused"

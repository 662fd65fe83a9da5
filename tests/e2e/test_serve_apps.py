"""Apps written in Ray Serve's style (examples/serve), deployed from Ray Serve config files with
`fleetpulse deploy`, served end to end through the HTTP proxy and the NATS gateway.

One stack for the module: nats-server, `fleetpulse controller`, `fleetpulse agent`, the proxy and
the router gateway as processes. Each test deploys its own app (own name and route prefix).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from shared.bus import Bus, Msg
from shared.errors import BusError
from shared.kv.status import AppStatusView
from shared.natsbus import NatsBus
from shared.subjects import KV_STATUS
from tests.e2e import test_proxy as proxy_e2e
from tests.e2e.test_closed_loop import cli
from tests.e2e.test_proxy import Stack
from tests.waiting import eventually as until

pytestmark = pytest.mark.e2e

FAST = """
        health_check_period_s: 0.5
        health_check_timeout_s: 2
        graceful_shutdown_timeout_s: 2"""


class ServeStack(Stack):
    """The proxy stack plus the router gateway."""

    def start(self) -> None:
        super().start()
        self.procs.start(
            ["-m", "services.router", "--nats", self.server.url], log=self.tmp / "gateway.log"
        )

    def deploy_yaml(self, name: str, text: str) -> subprocess.CompletedProcess[str]:
        path = self.tmp / f"{name}.yaml"
        path.write_text(text)
        res = cli("deploy", str(path), "--nats", self.server.url)
        assert res.returncode == 0, res.stdout + res.stderr
        return res


http = proxy_e2e.http  # the HTTP client fixture, here on this module's stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeStack]:
    s = ServeStack(tmp_path_factory.mktemp("serve-e2e"))
    try:
        s.start()
        yield s
    finally:
        s.stop()


@pytest.fixture
async def bus(stack: ServeStack) -> AsyncIterator[Bus]:
    b = await NatsBus.connect(stack.server.url, name="serve-e2e")
    yield b
    await b.close()


async def running(bus: Bus, app: str) -> bool:
    entry = await (await bus.kv(KV_STATUS)).get(app)
    return entry is not None and AppStatusView.decode(entry.value).status == "RUNNING"


async def get_json(http: aiohttp.ClientSession, path: str, body: str = "") -> Any:
    """The answer once the app serves it (200), retried while it is still coming up."""
    answer: list[Any] = []

    async def ok() -> bool:
        async with http.post(path, data=body.encode()) as r:
            if r.status != 200:
                return False
            answer.append(await r.json())
            return True

    await until(ok, 30, f"200 from {path}")
    return answer[-1]


async def gateway(bus: Bus, subject: str, body: bytes, headers: dict[str, str]) -> Msg:
    replies: list[Msg] = []

    async def answered() -> bool:
        try:
            msg = await bus.request(subject, body, timeout=5, headers=headers)
        except BusError:  # no gateway subscribed yet
            return False
        replies.append(msg)
        return True

    await until(answered, 30, f"a gateway reply on {subject}")
    return replies[-1]


async def test_composition_through_handles(
    stack: ServeStack, http: aiohttp.ClientSession, bus: Bus
) -> None:
    stack.deploy_yaml(
        "compose",
        f"""
applications:
  - name: compose
    route_prefix: /compose
    import_path: examples.serve.composition:app
    deployments:
      - name: Ingress{FAST}
      - name: Model
        num_replicas: 2{FAST}
      - name: Preprocessor{FAST}
""",
    )
    await until(lambda: running(bus, "compose"), 60, "compose RUNNING")
    out = await get_json(http, "/compose", "  Hello   Handles ")
    # the ingress called the preprocessor, and the model got its (unawaited) response
    assert out["text"] == "hello handles" and out["score"] == 6.5 and out["via"] == "Ingress"
    # two Model replicas behind the ingress's handle: both serve in time
    pids = {(await get_json(http, "/compose", "x"))["pid"] for _ in range(20)}
    assert len(pids) == 2
    msg = await gateway(bus, "fp.v1.call.compose.Ingress", b"Via  NATS", {"Fp-Path": "/"})
    assert json.loads(msg.data)["text"] == "via nats"


async def test_builder_with_args_and_env_vars(
    stack: ServeStack, http: aiohttp.ClientSession, bus: Bus
) -> None:
    res = stack.deploy_yaml(
        "greet",
        f"""
proxy_location: EveryNode
http_options: {{port: 8000}}
applications:
  - name: greet
    route_prefix: /greet
    import_path: examples.serve.builder:app_builder
    args: {{greeting: Bonjour, punctuation: "?"}}
    runtime_env:
      env_vars: {{MODEL_ID: tiny-greeter-v1}}
    deployments:
      - name: Greeter{FAST}
""",
    )
    # keys about Ray's own services are not silently dropped
    assert "warning" in res.stderr and "proxy_location" in res.stderr
    assert "fleetpulse proxy --port" in res.stderr
    await until(lambda: running(bus, "greet"), 60, "greet RUNNING")
    out = await get_json(http, "/greet", "Ada")
    assert out == {
        "message": "Bonjour, Ada?",
        "model_id": "tiny-greeter-v1",  # runtime_env.env_vars in the replica
        "built_with_model": "tiny-greeter-v1",  # ... and while the builder ran
        "app": "greet",
    }
    msg = await gateway(bus, "fp.v1.call.greet.Greeter", b"Grace", {})
    assert json.loads(msg.data)["message"] == "Bonjour, Grace?"


CLASSIFY = """
applications:
  - name: classify
    route_prefix: /classify
    import_path: examples.serve.configurable:app
    deployments:
      - name: Classifier
        user_config: {{threshold: {threshold}}}
        max_concurrent_queries: {max_ongoing}{fast}
"""


async def test_user_config_reconfigures_without_a_restart(
    stack: ServeStack, http: aiohttp.ClientSession, bus: Bus
) -> None:
    res = stack.deploy_yaml("classify", CLASSIFY.format(threshold=0.8, max_ongoing=5, fast=FAST))
    assert "older name of 'max_ongoing_requests'" in res.stderr  # accepted, with a warning
    await until(lambda: running(bus, "classify"), 60, "classify RUNNING")
    first = await get_json(http, "/classify?x=0.6")
    assert first["threshold"] == 0.8 and first["positive"] is False
    assert first["reconfigures"] == 1  # at start, before it served
    # only user_config changes: the same replica process takes it, through reconfigure()
    stack.deploy_yaml("classify", CLASSIFY.format(threshold=0.5, max_ongoing=5, fast=FAST))

    async def reconfigured() -> bool:
        out = await get_json(http, "/classify?x=0.6")
        return out["threshold"] == 0.5

    await until(reconfigured, 30, "the new threshold in the running replica")
    second = await get_json(http, "/classify?x=0.6")
    assert second["positive"] is True and second["reconfigures"] == 2
    assert (second["pid"], second["replica_id"]) == (first["pid"], first["replica_id"])
    # anything else changes the version: a new replica, started with the current user_config
    stack.deploy_yaml("classify", CLASSIFY.format(threshold=0.5, max_ongoing=7, fast=FAST))

    async def replaced() -> bool:
        out = await get_json(http, "/classify?x=0.6")
        return out["replica_id"] != first["replica_id"]

    await until(replaced, 60, "a new replica for the new version")
    third = await get_json(http, "/classify?x=0.6")
    assert third["threshold"] == 0.5 and third["reconfigures"] == 1
    msg = await gateway(bus, "fp.v1.call.classify.Classifier", b"", {"Fp-Query": "x=0.9"})
    assert json.loads(msg.data)["positive"] is True


async def test_a_rayservice_manifest_deploys(
    stack: ServeStack, http: aiohttp.ClientSession, bus: Bus
) -> None:
    manifest = Path(__file__).parents[1] / "fixtures" / "rayservice_image_baked.yaml"
    res = cli("deploy", str(manifest), "--nats", stack.server.url)
    assert res.returncode == 0, res.stderr
    assert "deployed hello" in res.stdout
    await until(lambda: running(bus, "hello"), 60, "hello RUNNING")
    out = await get_json(http, "/hello", "Kube")
    assert out["message"] == "Hi, Kube!" and out["model_id"] == "from-rayservice"


@pytest.mark.parametrize(
    ("fixture", "code", "expected"),
    [
        ("ray_docs_multi_app.yaml", 0, "valid as far as checked without importing: app1"),
        ("ray_legacy_single_app.yaml", 0, "valid as far as checked without importing: default"),
        ("ray_builder_args.yaml", 0, "(VLLMDeployment) exist in it"),
        ("rayservice_image_baked.yaml", 0, "from the RayService 'hello-service'"),
        ("rayservice_sample.yaml", 0, "valid as far as checked without importing: fruit_app"),
    ],
)
def test_dry_run_of_ray_serve_configs_through_the_cli(
    fixture: str, code: int, expected: str
) -> None:
    path = Path(__file__).parents[1] / "fixtures" / fixture
    res = cli("deploy", "--dry-run", str(path), "--nats", "nats://127.0.0.1:1")
    assert res.returncode == code, res.stdout + res.stderr
    assert expected in (res.stdout if code == 0 else res.stderr)


def test_deploy_names_the_module_that_does_not_import(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text("applications:\n  - name: x\n    import_path: no_such_module.app:app\n")
    res = cli("deploy", str(path), "--nats", "nats://127.0.0.1:1")
    assert res.returncode == 2
    assert (
        f"{path}:3: applications[0].import_path: cannot import 'no_such_module.app': " in res.stderr
    )
    assert "ModuleNotFoundError" in res.stderr


async def test_a_gpu_deployment_gets_a_device_of_its_own_per_replica(
    stack: ServeStack, http: aiohttp.ClientSession, bus: Bus
) -> None:
    """Ray Serve's `num_gpus` from code, overridden in the file: the module's agent offers no
    GPU, so nothing is placed until an agent offering two devices joins; then each replica runs
    with a device of its own, and requests reach them through the proxy and the gateway."""
    stack.deploy_yaml(
        "embed",
        f"""
applications:
  - name: embed
    route_prefix: /embed
    import_path: examples.serve.gpu:app
    deployments:
      - name: Embedder
        ray_actor_options: {{num_gpus: 1, num_cpus: 0.5}}{FAST}
""",
    )

    async def waiting_for_gpus() -> bool:
        entry = await (await bus.kv(KV_STATUS)).get("embed")
        if entry is None:
            return False
        dep = AppStatusView.decode(entry.value).deployments["Embedder"]
        return "gpus" in dep.message

    await until(waiting_for_gpus, 30, "Embedder waiting, its message naming gpus")
    stack.procs.start(
        ["-m", "services.cli", "agent", "--nats", stack.server.url, "--agent-id", "gpu1",
         "--max-replicas", "4", "--resource", "gpus=2",
         "--log-dir", str(stack.tmp / "gpu-replicas")],
        log=stack.tmp / "gpu-agent.log",
    )  # fmt: skip
    await until(lambda: running(bus, "embed"), 60, "embed RUNNING")
    seen: dict[str, str] = {}

    async def both_replicas() -> bool:
        out = await get_json(http, "/embed")
        seen[out["replica_id"]] = out["cuda_visible_devices"]
        return len(seen) == 2

    await until(both_replicas, 30, "answers from both Embedder replicas")
    assert sorted(seen.values()) == ["0", "1"], seen  # one device each, on the one GPU agent
    msg = await gateway(bus, "fp.v1.call.embed.Embedder", b"", {})
    assert json.loads(msg.data)["cuda_visible_devices"] in ("0", "1")

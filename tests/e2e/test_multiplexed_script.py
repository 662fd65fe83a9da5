"""Model multiplexing as Ray Serve's docs write it (doc_code/multiplexed.py's shapes), run as a
`serve.run` script: the `serve_multiplexed_model_id` header over HTTP, `handle.options(
multiplexed_model_id=...)` from the driver and between deployments, each model loaded once per
replica that serves it and evicted beyond `max_num_models_per_replica`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_serve_run import Script, pids_printed, scripts, wait_gone

pytestmark = pytest.mark.e2e
__all__ = ["scripts"]  # the fixture, taken from test_serve_run

MULTIPLEXED = """
    import os

    import requests
    from starlette.requests import Request

    from fleetpulse import serve
    from fleetpulse.serve.handle import DeploymentHandle


    @serve.deployment
    class ModelInferencer:
        def __init__(self) -> None:
            self.loads = []

        @serve.multiplexed(max_num_models_per_replica=2)
        async def get_model(self, model_id: str):
            self.loads.append(model_id)
            return {"id": model_id}

        async def __call__(self, request: Request):
            model = await self.get_model(serve.get_multiplexed_model_id())
            return {"model": model["id"], "input": await request.json(), "loads": self.loads}

        async def predict(self, x):
            model = await self.get_model(serve.get_multiplexed_model_id())
            return [model["id"], x, self.loads]


    handle = serve.run(ModelInferencer.bind(), name="models", route_prefix="/")
    base = f"http://127.0.0.1:{os.environ['FLEETPULSE_PROXY_PORT']}/"
    for model_id in ("1", "2", "1", "1"):
        resp = requests.post(base, json=7, headers={"serve_multiplexed_model_id": model_id})
        body = resp.json()
        print("HTTP", resp.status_code, body["model"], body["input"])
    print("HTTP-LOADS", *body["loads"])
    print("HANDLE", *handle.predict.options(multiplexed_model_id="3").remote(5).result()[:2])
    # a third model evicts the least recently used ("2"): loading "2" again is a fresh load
    print("RELOAD", *handle.predict.options(multiplexed_model_id="2").remote(0).result()[2])


    @serve.deployment
    class Downstream:
        def __call__(self):
            return serve.get_multiplexed_model_id()


    @serve.deployment
    class Upstream:
        def __init__(self, downstream: DeploymentHandle):
            self._h = downstream

        async def __call__(self, request: Request):
            return await self._h.options(multiplexed_model_id="bar").remote()


    serve.run(Upstream.bind(Downstream.bind()), name="compose", route_prefix="/compose")
    resp = requests.get(base + "compose")
    print("COMPOSE", resp.status_code, resp.text)
    print("KIDS", *_fp_descendants())
"""


def test_ray_docs_multiplexing_script(tmp_path: Path, scripts: list[Script]) -> None:
    s = Script(tmp_path, "multiplexed", MULTIPLEXED)
    scripts.append(s)
    code, out = s.run()
    assert code == 0, out
    http = [line.split()[1:] for line in out.splitlines() if line.startswith("HTTP ")]
    assert http == [["200", m, "7"] for m in ("1", "2", "1", "1")], out
    assert "HTTP-LOADS 1 2" in out, out  # one replica, each model loaded once
    assert "HANDLE 3 5" in out, out
    assert "RELOAD 1 2 3 2" in out, out  # "2" was evicted by "3" (LRU of 2), then loaded again
    assert "COMPOSE 200 bar" in out, out
    wait_gone(pids_printed(out, "KIDS"), 5)

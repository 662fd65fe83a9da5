"""fleetpulse.serve in Ray Serve's shape: the decorator, options, bind, the graph build, and the
deploy step that imports an app (shared/appbuild.py)."""

from __future__ import annotations

import asyncio
import os

import pytest

from fleetpulse import serve
from shared.appbuild import BuildError, build_app
from shared.appgraph import handle_ref
from shared.appmodel import GraphError, build
from tests.unit.serve_apps import graphs

MOD = "tests.unit.serve_apps.graphs"


def test_decorator_forms_and_options() -> None:
    assert graphs.Leaf.name == "Leaf" and graphs.Leaf.options_given == {}
    assert graphs.Root.options_given == {"max_ongoing_requests": 3}
    other = graphs.Root.options(name="Front", num_replicas="auto")
    assert other.name == "Front" and other.func_or_class is graphs.Root.func_or_class
    assert other.options_given == {"max_ongoing_requests": 3, "num_replicas": "auto"}
    assert graphs.plain.name == "plain"
    with pytest.raises(TypeError, match="unknown deployment option"):
        serve.deployment(num_replica=2)
    with pytest.raises(TypeError, match=r"use Leaf.bind\(...\)"):
        graphs.Leaf()


def test_the_graph_build() -> None:
    built = build(graphs.app)
    assert built.ingress == "Root"
    by_name = {d.name: d for d in built.deployments}
    assert list(by_name) == ["Leaf", "Leaf_1", "Other", "Root"]  # a second Leaf node: renamed
    root = by_name["Root"]
    assert root.import_path == f"{MOD}:Root"
    # the node bound twice is one deployment: both places hold the same handle
    assert root.init_args == (handle_ref("Leaf"), [handle_ref("Leaf"), handle_ref("Leaf_1")])
    assert root.init_kwargs == {"named": {"x": handle_ref("Other")}}
    assert root.options == {"max_ongoing_requests": 3}
    assert by_name["Leaf"].init_args == (1,) and by_name["Other"].init_args == ()


@pytest.mark.parametrize(
    ("app", "message"),
    [
        (graphs.unbound, r"'Leaf' is passed unbound; pass Leaf.bind\(...\)"),
        (graphs.with_object, "argument 0 is a object: constructor arguments are stored as JSON"),
        (graphs.make_local(), "is defined inside a function; define it at module level"),
        (graphs.Root.bind(float("nan")), "JSON .* has no such number"),
    ],
)
def test_graphs_that_cannot_be_deployed(app: serve.Application, message: str) -> None:
    with pytest.raises(GraphError, match=message):
        build(app)


def test_build_a_bound_app_and_a_builder_with_args() -> None:
    assert build_app(f"{MOD}:app", None, {}).ingress == "Root"
    built = build_app(f"{MOD}:builder", {"n": "7"}, {"FP_TEST_BUILD": "seen"})
    leaf, root = built.deployments
    assert leaf.init_args == (7,)
    assert root.init_kwargs == {"named": "seen"}  # the app's env_vars while the builder ran
    assert "FP_TEST_BUILD" not in os.environ  # and restored after


def test_a_typed_builder_gets_its_args_built() -> None:
    built = build_app("examples.serve.builder:app_builder", {"greeting": "Hej"}, {"MODEL_ID": "m"})
    assert built.deployments[0].init_args == ("Hej", "!", "m")
    with pytest.raises(BuildError, match="args do not fit GreeterArgs"):
        build_app("examples.serve.builder:app_builder", {"colour": "red"}, {})


@pytest.mark.parametrize(
    ("path", "args", "message"),
    [
        ("no_such_pkg.mod:app", None, "cannot import 'no_such_pkg.mod': ModuleNotFoundError"),
        (f"{MOD}:nothing", None, f"module '{MOD}' has no attribute 'nothing'"),
        (f"{MOD}:app", {"a": 1}, "is a bound application, so it takes no args"),
        (f"{MOD}:Leaf", None, r"is a deployment, not an application: name `Leaf.bind\(...\)`"),
        (f"{MOD}:not_an_app", None, "is a int; expected a bound application"),
        (f"{MOD}:broken_builder", {"model": "x"}, "raised ValueError: no model named x"),
        (f"{MOD}:returns_nothing", {}, "returned a NoneType; it must return a bound application"),
        ("tests.unit.broken_policy_module:anything", None, "cannot import"),
    ],
)
def test_build_errors_name_the_module_and_the_exception(
    path: str, args: dict[str, int] | None, message: str
) -> None:
    with pytest.raises(BuildError, match=message):
        build_app(path, args, {})


def test_the_replica_context_exists_only_in_a_replica(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEETPULSE_NATS_URL", raising=False)
    with pytest.raises(RuntimeError, match="only be called inside a deployment's replica"):
        serve.get_replica_context()
    with pytest.raises(serve.RayServeException, match="specify an application name"):
        serve.get_deployment_handle("Model")
    with pytest.raises(serve.RayServeException, match="no system is running"):
        serve.get_app_handle("shop")
    assert serve.status() == serve.ServeStatus()  # nothing started by asking


class Embedder:
    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    @serve.batch(max_batch_size=3, batch_wait_timeout_s=0.05)
    async def embed(self, texts: list[str]) -> list[int]:
        self.batches.append(texts)
        if "boom" in texts:
            raise ValueError("boom")
        return [len(t) for t in texts]

    @serve.batch
    async def wrong(self, texts: list[str]) -> list[int]:
        return []


async def test_batch_groups_calls_and_answers_each_caller() -> None:
    e = Embedder()
    results = await asyncio.gather(*(e.embed("x" * n) for n in range(1, 6)))
    assert results == [1, 2, 3, 4, 5]
    assert e.batches == [["x", "xx", "xxx"], ["xxxx", "xxxxx"]]  # at most 3, in arrival order
    with pytest.raises(ValueError, match="boom"):
        await asyncio.gather(e.embed("ok"), e.embed("boom"))
    with pytest.raises(TypeError, match="returned 0 results for 1 inputs"):
        await e.wrong("a")
    with pytest.raises(TypeError, match="needs an async function"):
        serve.batch(lambda items: items)


def test_serve_run_takes_an_application_and_starts_nothing_otherwise() -> None:
    with pytest.raises(TypeError, match=r"pass Leaf.bind\(...\), not the deployment"):
        serve.run(graphs.Leaf)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not str"):
        serve.run("graphs:app")  # type: ignore[arg-type]

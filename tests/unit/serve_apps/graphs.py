"""Graphs for the tests: shared nodes, duplicate names, typed builders, bad arguments."""

from __future__ import annotations

import os
from typing import Any

from fleetpulse import serve


@serve.deployment
class Leaf:
    def __init__(self, n: int = 0) -> None:
        self.n = n


@serve.deployment(max_ongoing_requests=3)
class Root:
    def __init__(self, *leaves: Any, named: Any = None) -> None:
        self.leaves = leaves


@serve.deployment
def plain(request: serve.Request) -> str:
    return "plain"


shared = Leaf.bind(1)
app = Root.bind(shared, [shared, Leaf.bind(2)], named={"x": Leaf.options(name="Other").bind()})
unbound = Root.bind(Leaf)
with_object = Root.bind(object())
not_an_app = 42


def builder(args: dict[str, Any]) -> serve.Application:
    return Root.bind(Leaf.bind(int(args["n"])), named=os.environ.get("FP_TEST_BUILD", ""))


def broken_builder(args: dict[str, Any]) -> serve.Application:
    raise ValueError("no model named " + str(args.get("model")))


def returns_nothing(args: dict[str, Any]) -> None:
    return None


def make_local() -> serve.Application:
    @serve.deployment
    class Local:
        pass

    return Local.bind()

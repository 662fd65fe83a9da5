"""Return values json.dumps cannot write reach the client as Ray Serve writes them."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import uuid
from typing import Any

import httpx
import numpy as np
import pytest
from starlette.datastructures import QueryParams

from services.replica.asgi import jsonable, to_response


class Color(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Point:
    x: int
    y: int


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (QueryParams("a=b&c=d"), {"a": "b", "c": "d"}),  # Ray's docs return request.query_params
        ({"s": {3}}, {"s": [3]}),
        ((1, 2), [1, 2]),
        (Point(1, 2), {"x": 1, "y": 2}),
        (np.array([1, 2]) * 2, [2, 4]),
        (np.float32(0.5), 0.5),
        (Color.RED, "red"),
        (datetime.date(2026, 12, 4), "2026-12-04"),
        (uuid.UUID(int=1), "00000000-0000-0000-0000-000000000001"),
    ],
    ids=lambda v: type(v).__name__,
)
def test_values_json_cannot_write_are_written_as_ray_writes_them(value: Any, expected: Any) -> None:
    assert json.loads(json.dumps(value, default=jsonable)) == expected


async def test_a_returned_query_params_is_a_json_object() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await to_response(QueryParams(scope["query_string"].decode()))(scope, receive, send)

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        resp = await client.get("/?a=b&c=d")
    assert resp.status_code == 200 and resp.json() == {"a": "b", "c": "d"}


def test_anything_else_still_refuses_by_name() -> None:
    with pytest.raises(TypeError, match="object is not JSON serializable"):
        json.dumps(object(), default=jsonable)

"""A `__call__` that takes a Starlette request and awaits its JSON body, as in Ray Serve's docs.

curl -X POST localhost:8000/counter -d '{"add": 3}'     # {"count": 3, "path": "/counter"}
curl localhost:8000/counter/hello                        # the no-parameter handler below
"""

from __future__ import annotations

from starlette.requests import Request

from fleetpulse import serve


@serve.deployment
class Counter:
    def __init__(self) -> None:
        self.count = 0

    async def __call__(self, request: Request) -> dict[str, object]:
        body = await request.json() if await request.body() else {}
        self.count += int(body.get("add", 1))
        return {"count": self.count, "path": request.url.path,
                "who": request.query_params.get("who", "anonymous")}  # fmt: skip


@serve.deployment
class Hello:
    def __call__(self) -> str:  # no request parameter: called without one, as Ray does
        return "hello"


counter_app = Counter.bind()
hello_app = Hello.bind()

if __name__ == "__main__":
    import requests

    serve.run(counter_app, route_prefix="/counter")
    print(requests.post("http://localhost:8000/counter", json={"add": 3}).json())

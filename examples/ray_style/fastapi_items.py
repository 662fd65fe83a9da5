"""A FastAPI ingress, written as Ray Serve's docs write one: routes as methods of the deployment
class, a path parameter, a pydantic body, an HTTPException, a middleware and a lifespan.

    fleetpulse up --config examples/ray_style/serve_config.yaml
    curl localhost:8000/items/apple            # {"name": "apple", "price": 1.5, "store": "corner"}
    curl -X POST localhost:8000/items -H 'content-type: application/json' \\
         -d '{"name": "pear", "price": 2.0}'
    open http://localhost:8000/items/docs      # OpenAPI under the route prefix
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel

from fleetpulse import serve


class Item(BaseModel):
    name: str
    price: float


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, str]]:
    yield {"opened_by": "lifespan"}  # request.state.opened_by in every request


app = FastAPI(lifespan=lifespan)


@app.middleware("http")
async def add_served_by(request: Request, call_next):  # type: ignore[no-untyped-def]
    response = await call_next(request)
    response.headers["x-served-by"] = "fleetpulse"
    return response


@serve.deployment
@serve.ingress(app)
class Store:
    def __init__(self, store: str = "corner") -> None:
        self.store = store
        self.items: dict[str, float] = {"apple": 1.5}

    @app.get("/{name}")
    def get_item(self, name: str, request: Request) -> dict[str, object]:
        if name not in self.items:
            raise HTTPException(status_code=404, detail=f"no item {name!r}")
        return {"name": name, "price": self.items[name], "store": self.store,
                "state": request.state.opened_by}  # fmt: skip

    @app.post("/")
    async def add_item(self, item: Item) -> dict[str, object]:
        self.items[item.name] = item.price
        return {"added": item.name, "count": len(self.items)}


store_app = Store.bind()

if __name__ == "__main__":
    import requests

    serve.run(store_app, route_prefix="/items")
    print(requests.post("http://localhost:8000/items", json={"name": "pear", "price": 2.0}).json())
    print(requests.get("http://localhost:8000/items/pear").json())

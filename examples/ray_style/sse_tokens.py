"""Server-sent events token streaming with a StreamingResponse, as in Ray Serve's streaming docs:
each token reaches the client as it is produced.

    curl -N 'localhost:8000/tokens?prompt=the+quick+brown+fox'
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import StreamingResponse

from fleetpulse import serve


@serve.deployment
class TokenStreamer:
    async def tokens(self, prompt: str, delay_s: float) -> AsyncIterator[str]:
        for word in prompt.split():
            await asyncio.sleep(delay_s)  # a model producing one token at a time
            yield f"data: {word}\n\n"
        yield "data: [DONE]\n\n"

    def __call__(self, request: Request) -> StreamingResponse:
        prompt = request.query_params.get("prompt", "hello world")
        delay_s = float(request.query_params.get("delay", "0.05"))
        return StreamingResponse(self.tokens(prompt, delay_s), media_type="text/event-stream")


sse_app = TokenStreamer.bind()

if __name__ == "__main__":
    import requests

    serve.run(sse_app, route_prefix="/tokens")
    with requests.get("http://localhost:8000/tokens?prompt=a+b+c", stream=True) as r:
        for line in r.iter_lines():
            if line:
                print(line.decode())

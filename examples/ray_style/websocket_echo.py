"""A WebSocket echo through a FastAPI ingress, as in Ray Serve's WebSocket docs.

    python -c "from websockets.sync.client import connect; \\
        ws = connect('ws://localhost:8000/ws/'); ws.send('hi'); print(ws.recv())"
"""

from __future__ import annotations

from fastapi import FastAPI, WebSocket, WebSocketDisconnect

from fleetpulse import serve

app = FastAPI()


@serve.deployment
@serve.ingress(app)
class EchoServer:
    def __init__(self) -> None:
        self.disconnects = 0

    @app.websocket("/")
    async def echo(self, ws: WebSocket) -> None:
        await ws.accept()
        try:
            while True:
                text = await ws.receive_text()
                if text == "close-me":
                    await ws.close(code=4000, reason="asked to")
                    return
                await ws.send_text(f"echo: {text}")
        except WebSocketDisconnect:
            self.disconnects += 1


ws_app = EchoServer.bind()

if __name__ == "__main__":
    from websockets.sync.client import connect

    serve.run(ws_app, route_prefix="/ws")
    with connect("ws://localhost:8000/ws/") as ws:
        ws.send("hello")
        print(ws.recv())

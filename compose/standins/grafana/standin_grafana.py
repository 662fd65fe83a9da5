"""A stand-in for the parts of Grafana that compose/docker-compose.yml relies on (see Dockerfile).

Loads /etc/grafana/provisioning at start and fails loudly on anything Grafana would not load;
then serves GET /api/health and GET /api/datasources/proxy/uid/{uid}/{path} (forwarded to that
datasource's url, as Grafana's server-side "proxy" access does).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

PROVISIONING = Path("/etc/grafana/provisioning")
PROXY_PREFIX = "/api/datasources/proxy/uid/"


def load() -> dict[str, str]:
    """uid -> url of every provisioned datasource; checks the dashboards too."""
    datasources: dict[str, str] = {}
    for path in sorted((PROVISIONING / "datasources").glob("*.y*ml")):
        for ds in yaml.safe_load(path.read_text()).get("datasources") or []:
            if not ds.get("uid") or not ds.get("url"):
                sys.exit(f"grafana stand-in: {path}: datasource without uid or url: {ds}")
            datasources[ds["uid"]] = ds["url"]
    if not datasources:
        sys.exit(f"grafana stand-in: no datasource under {PROVISIONING}/datasources")
    dashboards = 0
    for path in sorted((PROVISIONING / "dashboards").glob("*.y*ml")):
        for provider in yaml.safe_load(path.read_text()).get("providers") or []:
            folder = Path(provider["options"]["path"])
            for board in sorted(folder.glob("*.json")):
                doc = json.loads(board.read_text())
                for panel in doc.get("panels", []):
                    uid = (panel.get("datasource") or {}).get("uid")
                    if uid and uid not in datasources and not uid.startswith("$"):
                        sys.exit(
                            f"grafana stand-in: {board}: panel {panel.get('title')!r} "
                            f"uses datasource {uid!r}, not provisioned"
                        )
                dashboards += 1
    home = os.environ.get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    if home and not Path(home).is_file():
        sys.exit(
            f"grafana stand-in: GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH={home}: no such file"
        )
    if not dashboards:
        sys.exit(f"grafana stand-in: no dashboard found by {PROVISIONING}/dashboards")
    print(
        f"grafana stand-in: {len(datasources)} datasource(s), {dashboards} dashboard(s)", flush=True
    )
    return datasources


class Handler(BaseHTTPRequestHandler):
    datasources: dict[str, str] = {}

    def do_GET(self) -> None:
        if self.path == "/api/health":
            return self.reply(200, b'{"database": "ok", "standin": true}')
        if self.path.startswith(PROXY_PREFIX):
            uid, _, rest = self.path[len(PROXY_PREFIX) :].partition("/")
            base = self.datasources.get(uid)
            if base is None:
                return self.reply(404, b'{"message": "datasource not found"}')
            try:
                with urllib.request.urlopen(f"{base.rstrip('/')}/{rest}", timeout=30) as r:
                    return self.reply(r.status, r.read())
            except urllib.error.HTTPError as exc:
                return self.reply(exc.code, exc.read())
            except OSError as exc:
                return self.reply(502, json.dumps({"message": str(exc)}).encode())
        return self.reply(404, b'{"message": "not found"}')

    def reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


if __name__ == "__main__":
    Handler.datasources = load()
    server = ThreadingHTTPServer(("0.0.0.0", 3000), Handler)
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server.serve_forever()

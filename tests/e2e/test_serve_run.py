"""`serve.run` scripts written as Ray Serve's docs write them, run as processes.

Each test writes a script (the Ray shape: deployments in `__main__`, `serve.run(app)`, then
`requests.post(...)` or `handle.remote(...).result()`), runs it with `python script.py` and
checks what it printed, that the script's top level ran once (replicas got its deployments by
value, not by importing it again), and that every process the script started is gone after it
ended: normally, on Ctrl-C (SIGINT to its process group, as a terminal sends it) and on SIGKILL.
Ports: the HTTP port is a free one, given by $FLEETPULSE_PROXY_PORT or serve.start(http_options=).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SCRIPT_TIMEOUT_S = 150

PROBE = """
# -- put first by the test: the processes serve.run started (descendants of this one)
def _fp_descendants():
    import os
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [os.getpid()]
    while todo:
        for kid in children.get(todo.pop(), []):
            out.append(kid)
            todo.append(kid)
    return out
"""


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for kid in children.get(todo.pop(), []):
            out.append(kid)
            todo.append(kid)
    return out


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent counts as gone: it runs nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "?"


def wait_gone(pids: list[int], within_s: float = 60.0) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return
        time.sleep(0.1)
    raise AssertionError(
        f"processes left behind after {within_s:g} s: "
        + "; ".join(f"{p}: {command(p)}" for p in pids if alive(p))
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Script:
    def __init__(self, tmp: Path, name: str, body: str) -> None:
        self.dir = tmp
        self.path = tmp / f"{name}.py"
        self.path.write_text(PROBE + textwrap.dedent(body))
        self.port = free_port()
        self.out = tmp / f"{name}.out"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETPULSE_")}
        # the script's $TMPDIR (state dirs, nats store, logs): short, as unix socket paths
        # under it (HAProxy's master socket) must stay within 107 bytes
        self.tmp = Path(tempfile.mkdtemp(prefix="fpsr-"))
        self.env.update(
            PYTHONPATH=str(ROOT),
            FLEETPULSE_PROXY_PORT=str(self.port),
            PYTHONUNBUFFERED="1",
            TMPDIR=str(self.tmp),
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> subprocess.Popen[bytes]:
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(self.path)],
                cwd=self.dir,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, as a terminal's foreground job
            )
        return self.proc

    def run(self) -> tuple[int, str]:
        proc = self.start()
        try:
            code = proc.wait(SCRIPT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"the script did not finish:\n{self.output()}") from None
        return code, self.output()

    def leftovers(self) -> list[str]:
        """What the script's local system left in its $TMPDIR (nothing, once stopped)."""
        return sorted(p.name for p in self.tmp.iterdir())

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with_group = [self.proc.pid, *descendants(self.proc.pid)]
            for pid in with_group:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def scripts(tmp_path: Path) -> Iterator[list[Script]]:
    made: list[Script] = []
    yield made
    for s in made:
        s.kill()
        shutil.rmtree(s.tmp, ignore_errors=True)


def pids_printed(output: str, tag: str) -> list[int]:
    for line in output.splitlines():
        if line.startswith(tag + " "):
            return [int(p) for p in line.split()[1:]]
    raise AssertionError(f"no {tag} line in:\n{output}")


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except Exception:
        return False


QUICKSTART = """
    import os

    import requests
    from starlette.requests import Request

    from fleetpulse import serve

    with open("ran.txt", "a") as f:  # the script's top level: it must run once
        f.write("ran\\n")


    @serve.deployment(num_replicas=2)
    class Translator:
        def __init__(self, suffix: str) -> None:
            self.suffix = suffix

        def translate(self, text: str) -> str:
            return text.upper() + self.suffix

        async def __call__(self, http_request: Request) -> str:
            english_text: str = await http_request.json()
            return self.translate(english_text)


    translator_app = Translator.bind("!")
    handle = serve.run(translator_app)

    port = os.environ["FLEETPULSE_PROXY_PORT"]
    response = requests.post(f"http://127.0.0.1:{port}/", json="Hello world")
    print("HTTP", response.status_code, response.text)
    print("HANDLE", handle.translate.remote("by handle").result())
    print("STATUS", serve.status().applications["default"].status)
    print("KIDS", *_fp_descendants())
"""


def test_a_quickstart_script_serves_http_and_handles_and_leaves_nothing(
    tmp_path: Path, scripts: list[Script]
) -> None:
    s = Script(tmp_path, "quickstart", QUICKSTART)
    scripts.append(s)
    code, out = s.run()
    assert code == 0, out
    assert "HTTP 200 HELLO WORLD!" in out, out
    assert "HANDLE BY HANDLE!" in out, out
    assert "STATUS RUNNING" in out, out
    assert (tmp_path / "ran.txt").read_text() == "ran\n"  # never imported again by a replica
    kids = pids_printed(out, "KIDS")
    # supervisor, nats-server, controller, agent, proxy, two replicas
    assert len(kids) >= 7, out
    wait_gone(kids, 5)  # the script waited for the stop: nothing outlives it
    assert s.leftovers() == []


APPS = """
    import os
    import time

    from fleetpulse import serve


    @serve.deployment
    def double(val: int) -> int:
        return val * 2


    @serve.deployment
    class Adder:
        def __init__(self, increment: int) -> None:
            self.increment = increment

        def __call__(self, val: int) -> int:
            return val + self.increment


    @serve.deployment
    class Lister:
        def __init__(self, n: int) -> None:
            self.n = n

        def items(self) -> list:
            return list(range(self.n))


    @serve.deployment
    class Broken:
        def __init__(self) -> None:
            raise ValueError("this constructor fails on purpose")

        def __call__(self) -> str:
            return "never"


    serve.start(http_options={"host": "127.0.0.1", "port": int(os.environ["PORT"])})
    serve.run(double.bind(), name="my_app", route_prefix="/double")
    handle = serve.get_app_handle("my_app")
    print("DOUBLE", handle.remote(3).result())

    serve.run(Adder.bind(1), name="adder", route_prefix="/add")
    adder = serve.get_deployment_handle("Adder", app_name="adder")
    print("ADD", adder.remote(1).result())
    serve.run(Adder.bind(10), name="adder", route_prefix="/add")  # a redeploy: a rollout
    print("ADD", serve.get_app_handle("adder").remote(1).result())

    # a deployment without __call__, reached by handle only (Ray's local_dev.py Doubler)
    lister = serve.run(Lister.bind(3), name="lister", route_prefix=None)
    print("ITEMS", lister.items.remote().result())

    status = serve.status()
    print("APPS", *sorted(f"{n}={a.status}" for n, a in status.applications.items()))

    try:
        serve.run(Broken.bind(), name="broken", route_prefix="/broken")
    except RuntimeError as exc:
        print("BROKEN", type(exc).__name__, "fails on purpose" in str(exc))

    try:
        serve.run(Adder.bind(2), name="other", route_prefix="/add")
    except ValueError as exc:
        print("CLASH", "already used by the application 'adder'" in str(exc))

    serve.delete("my_app")
    print("AFTER-DELETE", *sorted(serve.status().applications))
    kids = _fp_descendants()
    serve.shutdown()
    time.sleep(0.5)
    left = [p for p in kids if os.path.exists(f"/proc/{p}")]
    print("SHUTDOWN-LEFT", len(left))
    print("STATUS-AFTER", serve.status().applications)
"""


def test_handles_status_redeploy_failure_delete_and_shutdown(
    tmp_path: Path, scripts: list[Script]
) -> None:
    s = Script(tmp_path, "apps", APPS)
    port = free_port()
    s.env["PORT"] = str(port)
    del s.env["FLEETPULSE_PROXY_PORT"]
    scripts.append(s)
    code, out = s.run()
    assert code == 0, out
    assert f"HTTP on http://127.0.0.1:{port}" in out, out  # serve.start's http_options
    assert "DOUBLE 6" in out, out
    assert "ADD 2" in out and "ADD 11" in out, out
    assert "ITEMS [0, 1, 2]" in out, out
    assert "APPS adder=RUNNING lister=RUNNING my_app=RUNNING" in out, out
    assert "BROKEN DeployFailed True" in out, out
    assert "CLASH True" in out, out
    assert "AFTER-DELETE adder broken lister" in out, out
    assert "SHUTDOWN-LEFT 0" in out, out
    assert "STATUS-AFTER {}" in out, out
    assert s.leftovers() == []


BLOCKING = """
    from fleetpulse import serve


    @serve.deployment
    class Hello:
        def __call__(self) -> str:
            return "hello"


    serve.run(Hello.bind(), blocking=True)
"""


IN_A_THREAD = """
    import threading
    import time

    from fleetpulse import serve


    @serve.deployment
    class Hello:
        def __call__(self) -> str:
            return "hello"


    # started from a thread that ends: PR_SET_PDEATHSIG cannot be armed, the pipe still tells
    threading.Thread(target=lambda: serve.run(Hello.bind())).start()
    time.sleep(3600)
"""


def start_blocking(
    tmp_path: Path, scripts: list[Script], body: str = BLOCKING
) -> tuple[Script, list[int]]:
    s = Script(tmp_path, "blocking", body)
    scripts.append(s)
    proc = s.start()
    deadline = time.monotonic() + SCRIPT_TIMEOUT_S
    while not http_ok(f"http://127.0.0.1:{s.port}/"):
        assert proc.poll() is None, s.output()
        assert time.monotonic() < deadline, s.output()
        time.sleep(0.2)
    kids = descendants(proc.pid)
    names = " ".join(command(p) for p in kids)
    for part in ("localsystem", "nats-server", "services.controller", "services.agent",
                 "services.proxy", "services.replica"):  # fmt: skip
        assert part in names, names
    return s, kids


def test_ctrl_c_stops_the_whole_local_system(tmp_path: Path, scripts: list[Script]) -> None:
    s, kids = start_blocking(tmp_path, scripts)
    assert s.proc is not None
    os.killpg(s.proc.pid, signal.SIGINT)  # what a terminal sends its foreground job
    s.proc.wait(60)
    assert "KeyboardInterrupt" in s.output(), s.output()
    wait_gone(kids, 5)
    assert s.leftovers() == []


@pytest.mark.parametrize("body", [BLOCKING, IN_A_THREAD], ids=["main-thread", "other-thread"])
def test_sigkill_of_the_script_stops_the_whole_local_system(
    tmp_path: Path, scripts: list[Script], body: str
) -> None:
    s, kids = start_blocking(tmp_path, scripts, body)
    assert s.proc is not None
    s.proc.kill()
    s.proc.wait()
    wait_gone(kids, 60)
    assert s.leftovers() == []  # the supervisor cleaned up before it exited


def test_a_killed_supervisor_takes_the_services_and_replicas_with_it(
    tmp_path: Path, scripts: list[Script]
) -> None:
    _, kids = start_blocking(tmp_path, scripts)
    (supervisor,) = [p for p in kids if "fleetpulse.serve.localsystem" in command(p)]
    os.kill(supervisor, signal.SIGKILL)
    wait_gone(kids, 60)  # PR_SET_PDEATHSIG: nats-server, services, and the agent's replicas


DEAD_PROXY = """
    import os
    import signal
    import time

    from fleetpulse import serve
    import sys


    @serve.deployment
    def hello() -> str:
        return "hello"


    serve.start()
    (proxy,) = [p for p in _fp_descendants() if b"services.proxy" in open(f"/proc/{p}/cmdline", "rb").read()]
    os.kill(proxy, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while sys.modules["fleetpulse.serve.run"]._driver.system.problem() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        serve.run(hello.bind())
    except serve.RayServeException as exc:
        print("REFUSED", str(exc).splitlines()[0])
"""


def test_a_service_that_dies_fails_the_next_call_with_its_log(
    tmp_path: Path, scripts: list[Script]
) -> None:
    s = Script(tmp_path, "dead_proxy", DEAD_PROXY)
    scripts.append(s)
    code, out = s.run()
    assert code == 0, out
    assert "REFUSED the local system cannot serve: the proxy exited with code -9:" in out, out
    # the SIGKILLed proxy could not clean up after itself; the supervisor did for the rest
    assert [n for n in s.leftovers() if n.startswith("fleetpulse-")] == []


def test_a_taken_http_port_is_a_clear_error(tmp_path: Path, scripts: list[Script]) -> None:
    s = Script(tmp_path, "taken", BLOCKING)
    scripts.append(s)
    with socket.socket() as held:
        held.bind(("127.0.0.1", s.port))
        held.listen()
        code, out = s.run()
    assert code != 0
    assert f"cannot serve HTTP on 127.0.0.1:{s.port}" in out, out
    assert s.leftovers() == []


EXISTING = """
    import os

    import requests

    from fleetpulse import serve


    @serve.deployment
    class Greeter:
        def __call__(self, request) -> str:
            return "hello from an existing system"


    handle = serve.run(Greeter.bind(), name="greeter", route_prefix="/greet")
    print("HTTP", requests.get(os.environ["PROXY_URL"] + "/greet").text)
    print("HANDLE", handle.remote(None).result())
    print("KIDS", len(_fp_descendants()))
    serve.shutdown()  # on a system it did not start: deletes the apps it deployed
    print("APPS-AFTER", sorted(serve.status().applications))
"""


def test_a_system_named_by_fleetpulse_nats_url_is_used_not_started(
    tmp_path: Path, scripts: list[Script]
) -> None:
    from tests.e2e.test_proxy import Stack

    stack = Stack(tmp_path)
    try:
        stack.start()
        s = Script(tmp_path, "existing", EXISTING)
        url = stack.server.url
        s.env.update(FLEETPULSE_NATS_URL=url, PROXY_URL=stack.proxy_url)
        scripts.append(s)
        code, out = s.run()
    finally:
        stack.stop()
    assert code == 0, out
    assert f"using the system at {url}" in out, out
    assert "HTTP hello from an existing system" in out, out
    assert "HANDLE hello from an existing system" in out, out
    assert "KIDS 0" in out, out  # it started nothing
    assert "APPS-AFTER []" in out, out


FASTAPI = """
    import os

    import requests
    from fastapi import FastAPI
    from pydantic import BaseModel

    from fleetpulse import serve
    from fleetpulse.serve.handle import DeploymentHandle

    api = FastAPI()
    api.state.currency = "EUR"  # app state travels with the app


    class Item(BaseModel):
        name: str
        price: float


    @serve.deployment
    class Tax:
        def __call__(self, price: float) -> float:
            return round(price * 1.2, 2)


    @serve.deployment
    @serve.ingress(api)
    class Shop:
        def __init__(self, tax: DeploymentHandle) -> None:
            self.tax = tax

        @api.post("/items/{item_id}")
        async def create(self, item_id: int, item: Item) -> dict:
            gross = await self.tax.remote(item.price)
            return {"id": item_id, "name": item.name, "gross": gross, "in": api.state.currency}

        def count(self, n: int):
            for i in range(n):
                yield i


    handle = serve.run(Shop.bind(Tax.bind()), route_prefix="/shop")
    base = f"http://127.0.0.1:{os.environ['FLEETPULSE_PROXY_PORT']}/shop"
    r = requests.post(f"{base}/items/7", json={"name": "pen", "price": 10})
    print("HTTP", r.status_code, r.json())
    print("INVALID", requests.post(f"{base}/items/x", json={"name": "pen"}).status_code)
    print("STREAM", list(handle.options(stream=True).count.remote(3)))
"""


def test_a_fastapi_ingress_script_with_composition_and_streaming(
    tmp_path: Path, scripts: list[Script]
) -> None:
    s = Script(tmp_path, "fastapi_app", FASTAPI)
    scripts.append(s)
    code, out = s.run()
    assert code == 0, out
    assert "HTTP 200 {'id': 7, 'name': 'pen', 'gross': 12.0, 'in': 'EUR'}" in out, out
    assert "INVALID 422" in out, out
    assert "STREAM [0, 1, 2]" in out, out

"""Runtime environments, the pure parts: Ray Serve's merge rule, the checks of the file's
runtime_env (app level, per deployment, in code, Anyscale service files), packages built
deterministically and unpacked safely (zip-slip, size, atomic), the agent's cache bound."""

from __future__ import annotations

import asyncio
import os
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.agent.packages import PackageCache
from services.agent.pyenv import EnvBuildError, PyEnvs, stale
from services.agent.runtimeenvs import Failed, Prepared, RuntimeEnvs
from shared import packages, runtimeenv
from shared.appgraph import BuiltApp, BuiltDeployment
from shared.packagestore import MemoryPackageStore
from shared.serveconfig import check_config
from tests.waiting import eventually

# -- merge: Ray Serve's override_runtime_envs_except_env_vars -----------------------------------

keys = st.sampled_from(["working_dir", "pip", "py_modules", "excludes", "env_vars"])
values = st.one_of(st.text(max_size=5), st.dictionaries(st.text(max_size=3), st.text(max_size=3)))


@given(st.dictionaries(keys, values), st.dictionaries(keys, values))
def test_merge_child_keys_win_and_env_vars_merge_name_by_name(
    parent: dict[str, Any], child: dict[str, Any]
) -> None:
    before = (dict(parent), dict(child))
    out = runtimeenv.merge(parent, child)
    assert (parent, child) == before  # neither is changed
    for key in set(parent) | set(child):
        if key == "env_vars" and isinstance(child.get(key), dict):
            base = parent.get(key) if isinstance(parent.get(key), dict) else {}
            assert out[key] == {**base, **child[key]}
        elif key in child:
            assert out[key] == child[key]
        else:
            assert out[key] == parent[key]


def test_normalise_refuses_by_name_with_the_reason() -> None:
    for key, why in (("conda", "conda"), ("container", "containers"), ("image_uri", "containers")):
        with pytest.raises(runtimeenv.RuntimeEnvError, match=why) as exc:
            runtimeenv.normalise({key: "x"})
        assert exc.value.key == key
    with pytest.raises(runtimeenv.RuntimeEnvError, match="pip or uv, not both"):
        runtimeenv.normalise({"pip": ["a"], "uv": ["b"]})


def test_normalise_reads_pip_forms_and_a_requirements_file() -> None:
    assert runtimeenv.normalise({"pip": ["a==1", "b"]})[0]["pip"] == {
        "packages": ["a==1", "b"], "installer": "pip", "pip_version": ""
    }  # fmt: skip
    rt, _ = runtimeenv.normalise({"pip": {"packages": ["a"], "pip_version": "==24.0"}})
    assert rt["pip"]["pip_version"] == "==24.0"
    rt, env = runtimeenv.normalise(
        {"uv": "reqs.txt", "env_vars": {"A": "1"}},
        read_file=lambda p: "# pinned\nx==2  # why\n\ny\n",
    )
    assert rt["pip"] == {"packages": ["x==2", "y"], "installer": "uv", "pip_version": ""}
    assert env == {"A": "1"}


# -- the file's checks ----------------------------------------------------------------------------


def _file(tmp: Path, body: str) -> str:
    return body.replace("{wd}", str(tmp))


def test_deployment_runtime_env_merges_over_the_apps(tmp_path: Path) -> None:
    (tmp_path / "other").mkdir()
    text = _file(tmp_path, """
applications:
  - name: a
    runtime_env:
      working_dir: {wd}
      excludes: ["*.bin"]
      pip: [x==1]
      env_vars: {A: app, B: app}
    deployments:
      - name: D
        import_path: m:D
        ray_actor_options:
          runtime_env: {pip: [x==2], env_vars: {B: dep}}
      - name: E
        import_path: m:E
        ray_actor_options:
          runtime_env: {working_dir: {wd}/other}
""")  # fmt: skip
    c = check_config(text)
    assert c.problems == []
    d, e = c.apps[0].deployments
    assert d.runtime_env["working_dir"] == {"path": str(tmp_path), "excludes": ["*.bin"]}
    assert d.runtime_env["pip"]["packages"] == ["x==2"]
    assert d.env == {"A": "app", "B": "dep"}
    assert e.runtime_env["working_dir"]["path"] == str(tmp_path / "other")
    assert e.runtime_env["pip"]["packages"] == ["x==1"] and e.env == {"A": "app", "B": "app"}


def test_runtime_env_set_in_code_merges_too(tmp_path: Path) -> None:
    text = _file(tmp_path, """
applications:
  - name: a
    import_path: m:app
    runtime_env: {working_dir: {wd}, env_vars: {A: file}}
""")  # fmt: skip
    code = {"ray_actor_options": {"runtime_env": {"pip": ["y"], "env_vars": {"C": "code"}}}}
    graph = BuiltApp("D", (BuiltDeployment("D", "m:D", (), {}, options=code),))
    c = check_config(text, build=lambda app: graph)
    assert c.problems == []
    (d,) = c.apps[0].deployments
    assert d.runtime_env["pip"]["packages"] == ["y"] and d.runtime_env["working_dir"]
    assert d.env == {"A": "file", "C": "code"}


def test_a_deployment_refusal_names_its_key(tmp_path: Path) -> None:
    c = check_config("""
applications:
  - name: a
    deployments:
      - name: D
        import_path: m:D
        ray_actor_options:
          runtime_env: {image_uri: "rayproject/ray:2.9"}
""")  # fmt: skip
    (p,) = c.problems
    assert p.path == "applications[0].deployments[0].ray_actor_options.runtime_env.image_uri"
    assert "not containers" in p.message and p.line == 8


def test_anyscale_service_file(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("z==3\n")
    text = _file(tmp_path, """
name: my-service
image_uri: anyscale/ray:2.9
compute_config: {head_node: {}}
cloud: my-cloud
query_auth_token_enabled: false
working_dir: {wd}
requirements: {wd}/requirements.txt
excludes: [data/]
env_vars: {MODE: prod}
applications:
  - name: a
    deployments:
      - {name: D, import_path: "m:D"}
""")  # fmt: skip
    c = check_config(text)
    assert c.problems == []
    warned = {w.path for w in c.warnings}
    assert {"name", "image_uri", "compute_config", "cloud", "query_auth_token_enabled"} <= warned
    (d,) = c.apps[0].deployments
    assert d.runtime_env["working_dir"] == {"path": str(tmp_path), "excludes": ["data/"]}
    assert d.runtime_env["pip"]["packages"] == ["z==3"] and d.env == {"MODE": "prod"}


# -- packages -----------------------------------------------------------------------------------


def _tree(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("A = 1\n")
    (root / "data").mkdir()
    (root / "data" / "big.bin").write_bytes(b"x" * 10_000)
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "a.pyc").write_bytes(b"junk")
    (root / "top.py").write_text("T = 1\n")
    return root


def test_a_package_is_deterministic_and_honours_excludes(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    one = packages.build_zip(src, tmp_path / "1.zip", excludes=["data/"], limit=1 << 20)
    os.utime(src / "top.py", (1, 1))  # timestamps are not part of a package
    two = packages.build_zip(src, tmp_path / "2.zip", excludes=["data/"], limit=1 << 20)
    assert one == two
    names = zipfile.ZipFile(tmp_path / "1.zip").namelist()
    assert names == ["pkg/a.py", "top.py"]
    (src / "top.py").write_text("T = 2\n")
    assert packages.build_zip(src, tmp_path / "3.zip", excludes=["data/"], limit=1 << 20) != one


def test_over_the_limit_names_the_biggest_files(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    with pytest.raises(packages.PackageError, match=r"over the package limit.*data/big\.bin"):
        packages.build_zip(src, tmp_path / "x.zip", limit=5_000)


@pytest.mark.parametrize("name", ["../evil.py", "/etc/evil", "a/../../evil", "C:/evil"])
def test_zip_slip_is_refused_and_nothing_is_left(tmp_path: Path, name: str) -> None:
    bad = tmp_path / "bad.zip"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("ok.py", "fine")
        z.writestr(name, "evil")
    dest = tmp_path / "cache" / "abc"
    with pytest.raises(packages.PackageError, match="outside its folder"):
        packages.unpack(bad, dest, max_bytes=1 << 20)
    assert not dest.exists() and list((tmp_path / "cache").iterdir()) == []
    assert not (tmp_path / "evil.py").exists()


def test_a_zip_bomb_is_refused(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("zeros", b"\0" * 200_000)
    with pytest.raises(packages.PackageError, match="unpacks to more than"):
        packages.unpack(bomb, tmp_path / "out", max_bytes=100_000)
    assert not (tmp_path / "out").exists()


def test_partial_leftovers_are_cleaned_when_the_cache_opens(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    (root / f"{packages.PARTIAL_PREFIX}abc-1").mkdir(parents=True)  # an agent killed mid-unpack
    (root / f"{packages.PARTIAL_PREFIX}abc.zip").write_bytes(b"half")  # ... mid-download
    cache = PackageCache(root, None)
    assert list(root.iterdir()) == [] and cache.sizes == {}


# -- the agent's cache and preparations (in-memory store) -----------------------------------------


async def _put(store: MemoryPackageStore, tmp: Path, text: str, name: str) -> dict[str, Any]:
    src = tmp / name
    src.mkdir()
    (src / "m.py").write_text(text)
    sha, size = packages.build_zip(src, tmp / f"{name}.zip", limit=1 << 20)
    await store.put_file(sha, tmp / f"{name}.zip")
    return {"sha256": sha, "size": size}


async def test_the_cache_is_bounded_and_keeps_what_runs(tmp_path: Path) -> None:
    store = MemoryPackageStore()
    refs = [await _put(store, tmp_path, "X" * 3000 + str(i), f"p{i}") for i in range(3)]
    cache = PackageCache(tmp_path / "cache", lambda: store, max_bytes=7000)
    await cache.ensure(refs[0])
    await cache.ensure(refs[1], in_use={refs[0]["sha256"]})
    await cache.ensure(refs[2], in_use={refs[0]["sha256"]})
    kept = set(cache.sizes)
    assert refs[0]["sha256"] in kept and refs[2]["sha256"] in kept
    assert refs[1]["sha256"] not in kept and not cache.path(refs[1]["sha256"]).exists()


async def test_preparation_is_shared_and_a_failure_is_remembered(tmp_path: Path) -> None:
    store = MemoryPackageStore()
    ref = await _put(store, tmp_path, "X = 1\n", "wd")
    woken: list[int] = []
    envs = RuntimeEnvs(
        PackageCache(tmp_path / "cache", lambda: store),
        PyEnvs(tmp_path / "envs", "/nonexistent/python"),
        wake=lambda: woken.append(1),
    )
    rt = {"working_dir": ref}
    assert envs.state(rt) is None and envs.state(rt) is None  # one preparation, not two
    assert len(envs.preparing()) == 1
    await eventually(lambda: not envs.preparing(), 10, "the preparation to end")
    ready = envs.state(rt)
    assert isinstance(ready, Prepared) and ready.cwd == str(tmp_path / "cache" / ref["sha256"])
    assert ready.pythonpath == (ready.cwd,) and store.gets == 1 and woken == [1]

    missing = {"working_dir": {"sha256": "e" * 64, "size": 1}}
    assert envs.state(missing) is None
    await eventually(lambda: not envs.preparing(), 10, "the preparation to end")
    failed = envs.state(missing)
    assert isinstance(failed, Failed) and "not in the object store" in failed.reason
    gets = store.gets
    assert envs.state(missing) == failed and store.gets == gets  # no retry loop


async def test_a_failed_install_gives_the_installer_error_line(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels))
    envs = PyEnvs(tmp_path / "envs", sys.executable, env=env)
    spec = {"packages": ["no-such-package-fp==9.9"], "installer": "pip", "pip_version": ""}
    why = "ERROR: Could not find a version that satisfies the requirement no-such-package-fp"
    with pytest.raises(EnvBuildError, match=why):
        await envs.ensure(spec)
    assert [p.name for p in (tmp_path / "envs").iterdir()] == []  # nothing half-installed
    with pytest.raises(EnvBuildError, match=why):
        await envs.ensure(spec)  # remembered: no second install
    assert envs.builds == 0


async def test_an_agent_without_registry_access_says_so(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(  # an index nobody listens on, and no pip.conf adding others
        PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_RETRIES="1",
        PIP_TIMEOUT="2",
    )  # fmt: skip
    envs = PyEnvs(tmp_path / "envs", sys.executable, env=env)
    spec = {"packages": ["anything==1.0"], "installer": "pip", "pip_version": ""}
    with pytest.raises(EnvBuildError, match="could not reach the package index"):
        await envs.ensure(spec)


async def test_a_spec_is_built_once_and_layered_on_the_agents_environment(tmp_path: Path) -> None:
    from tests.runtimeenv_fixtures import make_wheel

    wheels = tmp_path / "wheels"
    make_wheel(wheels, "fpwheel", "1.0")
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels))
    envs = PyEnvs(tmp_path / "envs", sys.executable, env=env, max_builds=1)
    spec = {"packages": ["fpwheel==1.0"], "installer": "pip", "pip_version": ""}
    pythons = await asyncio.gather(*(envs.ensure(spec) for _ in range(4)))
    assert len(set(pythons)) == 1 and envs.builds == 1
    code = "import fpwheel, shared, yaml; print(fpwheel.VERSION)"  # its own, and the agent's
    proc = await asyncio.create_subprocess_exec(
        pythons[0], "-c", code, stdout=asyncio.subprocess.PIPE, env={"PATH": os.environ["PATH"]}
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0 and out.decode().strip() == "1.0"


def test_status_lines_say_what_an_agent_prepares_and_for_how_long() -> None:
    from services.ops.envnotes import env_json, env_lines
    from shared.kv.agents import AgentInfo, EnvNote

    notes = (
        EnvNote("a.D", "preparing", 1000.0, "building its Python environment (x==1)"),
        EnvNote("b.E", "failed", 900.0, "runtime_env: pip install failed: ERROR: no x==9"),
    )
    agent = AgentInfo("a1", 4, 0, "h", 1, 0.0, environments=notes)
    assert AgentInfo.decode(agent.encode()) == agent
    assert env_lines([agent], now=1075.0) == [
        "runtime_env of a.D on a1: building its Python environment (x==1) (1m15s)",
        "runtime_env of b.E on a1 FAILED 2m55s ago: runtime_env: pip install failed: ERROR: no x==9",
    ]
    assert [n["deployment"] for n in env_json([agent], app="b")] == ["b.E"]


async def test_an_installer_killed_mid_build_leaves_nothing_half_built(tmp_path: Path) -> None:
    """The agent stops (`close()`) while the installer runs: the installer is killed,
    the partial environment removed; an agent killed outright leaves a partial directory that
    the next start removes."""
    pidfile = tmp_path / "pid"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 60\n")
    fake.chmod(0o755)
    root = tmp_path / "envs"
    envs = PyEnvs(root, str(fake))
    spec = {"packages": ["x"], "installer": "pip", "pip_version": ""}
    task = asyncio.create_task(envs.ensure(spec))
    await eventually(lambda: pidfile.exists() and pidfile.read_text().strip() != "", 10, "pid")
    assert len(envs.building()) == 1
    pid = int(pidfile.read_text())
    await envs.close()
    with pytest.raises(asyncio.CancelledError):
        await task
    await eventually(lambda: not list(root.iterdir()), 10, "the partial environment removed")

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    await eventually(gone, 10, "the installer killed")
    (root / f"{packages.PARTIAL_PREFIX}abc-xyz").mkdir()  # what a SIGKILLed agent leaves
    PyEnvs(root, sys.executable)
    assert list(root.iterdir()) == []


async def test_the_agent_holds_a_replica_until_its_runtime_env_and_reports_a_failure(
    tmp_path: Path,
) -> None:
    """The shell: a replica whose package cannot be had (this bus has no object store) waits
    while it is being prepared (no slot, a `preparing` note), then fails its start with exit
    code 126 and a `failed` note with the reason; a replica with no runtime_env is untouched."""
    from dataclasses import replace

    from services.agent.config import AgentConfig
    from services.agent.service import AgentService
    from shared.bus import Msg
    from shared.fakebus import FakeServer
    from shared.subjects import DEFAULT_SUBJECTS as S
    from shared.wire import decode_as
    from shared.wire.messages import Lifecycle
    from tests.unit.test_agent_core import target

    server = FakeServer()
    bus, watcher = server.connect(), server.connect()
    exits: list[Lifecycle] = []

    async def on_life(msg: Msg) -> None:
        exits.append(decode_as(msg.data, Lifecycle))

    await watcher.subscribe(S.report("lifecycle", "app", "dep"), on_life)
    cfg = AgentConfig(
        nats_url="nats://unused",
        agent_id="me",
        log_dir=str(tmp_path),
        cache_dir=str(tmp_path / "c"),
    )
    svc = AgentService(cfg, bus=bus)
    plain = target("r0")
    shipped = target("r1")
    rt = {"working_dir": {"sha256": "a" * 64, "size": 10}}
    shipped = replace(shipped, spec=replace(shipped.spec, runtime_env=rt))
    assert svc._prepared({"r0": plain, "r1": shipped}) == {"r0": plain}
    (note,) = svc.info().environments
    assert (note.deployment, note.state) == ("app.dep", "preparing")
    assert "fetching package aaaaaaaaaaaa" in note.detail or note.detail == "preparing"
    await eventually(lambda: not svc.envs.preparing(), 10, "the preparation to fail")
    assert svc._prepared({"r1": shipped}) == {"r1": shipped}  # failed: started, to fail
    (note,) = svc.info().environments
    assert note.state == "failed" and "no object store" in note.detail
    await svc._start(shipped)
    await bus.flush()
    await watcher.flush()
    assert [(e.replica_id, e.state, e.exit_code) for e in exits] == [("r1", "exited", 126)]
    assert not (tmp_path / "c" / "packages" / ("a" * 64)).exists()
    await bus.close()
    await watcher.close()


async def test_a_url_working_dir_is_fetched_checked_and_its_single_top_folder_is_the_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GitHub-style archive (one top folder) from an https URL: fetched with the declared
    size as its bound, checked against its sha256, its top folder the working directory."""
    archive = tmp_path / "archive.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("repo-abc123/app.py", "A = 1\n")
    sha, size = packages.sha256_file(archive), archive.stat().st_size
    asked: list[tuple[str, int]] = []

    def fake_download(url: str, path: Path, *, timeout: float, limit: int) -> None:
        asked.append((url, limit))
        path.write_bytes(archive.read_bytes())

    monkeypatch.setattr(packages, "download", fake_download)
    envs = RuntimeEnvs(
        PackageCache(tmp_path / "cache", None),
        PyEnvs(tmp_path / "envs", sys.executable),
        wake=lambda: None,
    )
    url = "https://github.com/o/r/archive/abc123.zip"
    rt = {"working_dir": {"url": url, "sha256": sha, "size": size}}
    assert envs.state(rt) is None
    await eventually(lambda: not envs.preparing(), 10, "the fetch")
    ready = envs.state(rt)
    assert isinstance(ready, Prepared), ready
    assert ready.cwd == str(tmp_path / "cache" / sha / "repo-abc123")
    assert asked == [(url, size + 1)]

    bad = {"working_dir": {"url": url, "sha256": "b" * 64, "size": size}}
    assert envs.state(bad) is None
    await eventually(lambda: not envs.preparing(), 10, "the fetch")
    failed = envs.state(bad)
    assert isinstance(failed, Failed) and "does not match" in failed.reason


async def test_a_uv_spec_builds_from_a_local_wheel_directory(tmp_path: Path) -> None:
    """`uv` runtime envs install with uv (from the test extra; found next to the agent's own
    interpreter when its venv is not on PATH), from local wheels: no internet."""
    from tests.runtimeenv_fixtures import make_wheel

    wheels = tmp_path / "wheels"
    make_wheel(wheels, "fpwheel", "3.0")
    bin_dir = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != bin_dir)
    env = dict(os.environ, PATH=path, UV_NO_INDEX="1", UV_FIND_LINKS=str(wheels),
               UV_CACHE_DIR=str(tmp_path / "uv-cache"), UV_NO_CONFIG="1")  # fmt: skip
    envs = PyEnvs(tmp_path / "envs", sys.executable, env=env)
    spec = {"packages": ["fpwheel==3.0"], "installer": "uv", "pip_version": ""}
    python = await envs.ensure(spec)
    assert envs.builds == 1
    proc = await asyncio.create_subprocess_exec(
        python, "-c", "import fpwheel, shared; print(fpwheel.VERSION)",
        stdout=asyncio.subprocess.PIPE, env={"PATH": path},
    )  # fmt: skip
    out, _ = await proc.communicate()
    assert proc.returncode == 0 and out.decode().strip() == "3.0"
    bad = {"packages": ["fpwheel==9.9"], "installer": "uv", "pip_version": ""}
    with pytest.raises(
        EnvBuildError, match=r"uv install failed: .*: Because there is no version of fpwheel==9\.9"
    ):
        await envs.ensure(bad)


@given(
    st.dictionaries(st.sampled_from("abcdef"), st.floats(0, 1000)),
    st.sets(st.sampled_from("abcdef")),
    st.floats(0, 2000),
    st.floats(1, 500),
)
def test_stale_environments_are_those_unused_for_the_grace_and_not_building(
    last: dict[str, float], busy: set[str], now: float, grace: float
) -> None:
    gone = stale(last, busy, now, grace)
    assert gone == sorted(gone)
    for key, t in last.items():
        assert (key in gone) == (now - t >= grace and key not in busy)


async def test_an_environment_no_replica_used_for_the_grace_is_removed(tmp_path: Path) -> None:
    from tests.runtimeenv_fixtures import make_wheel

    wheels = tmp_path / "wheels"
    make_wheel(wheels, "fpwheel", "1.0")
    make_wheel(wheels, "fpwheel", "2.0")
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels))
    t = [0.0]
    envs = PyEnvs(tmp_path / "envs", sys.executable, env=env, grace_s=600.0, clock=lambda: t[0])
    one = {"packages": ["fpwheel==1.0"], "installer": "pip", "pip_version": ""}
    two = {"packages": ["fpwheel==2.0"], "installer": "pip", "pip_version": ""}
    py1, py2 = await envs.ensure(one), await envs.ensure(two)
    t[0] = 500.0
    assert await envs.sweep([]) == []  # within the grace
    t[0] = 700.0
    assert await envs.sweep([envs.key(two)]) == [envs.key(one)]  # two: a live replica's
    assert not _exists(py1) and _exists(py2)
    assert sorted(p.name for p in (tmp_path / "envs").iterdir()) == [envs.key(two)]
    t[0] = 1250.0
    assert await envs.sweep([]) == []  # used at 700: kept until 1300
    t[0] = 1300.0
    assert await envs.sweep([]) == [envs.key(two)] and envs.removed == 2
    assert list((tmp_path / "envs").iterdir()) == []
    # asked for again: built again; one found on disk at a restart counts as used then
    assert await envs.ensure(one) == py1 and envs.builds == 3
    again = PyEnvs(tmp_path / "envs", sys.executable, env=env, grace_s=600.0, clock=lambda: t[0])
    t[0] = 1899.0
    assert await again.sweep([]) == []
    t[0] = 1900.0
    assert await again.sweep([]) == [envs.key(one)]


async def test_a_prepared_runtime_env_whose_environment_was_removed_is_prepared_again(
    tmp_path: Path,
) -> None:
    from tests.runtimeenv_fixtures import make_wheel

    wheels = tmp_path / "wheels"
    make_wheel(wheels, "fpwheel", "1.0")
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels))
    t = [0.0]
    pyenvs = PyEnvs(tmp_path / "envs", sys.executable, env=env, grace_s=10.0, clock=lambda: t[0])
    cache = PackageCache(tmp_path / "pkgs", lambda: MemoryPackageStore())
    envs = RuntimeEnvs(cache, pyenvs, wake=lambda: None)
    rt = {"pip": {"packages": ["fpwheel==1.0"], "installer": "pip", "pip_version": ""}}
    assert envs.state(rt) is None
    await eventually(lambda: isinstance(envs.state(rt), Prepared), 60, "built")
    t[0] = 20.0
    assert await pyenvs.sweep([]) == [pyenvs.key(rt["pip"])]
    assert envs.state(rt) is None  # not a Prepared naming an interpreter that is gone
    await eventually(lambda: isinstance(envs.state(rt), Prepared), 60, "built again")
    prepared = envs.state(rt)
    assert isinstance(prepared, Prepared) and prepared.python and _exists(prepared.python)
    await envs.close()


def _exists(path: str) -> bool:
    return os.path.exists(path)


async def test_a_prepared_runtime_env_whose_package_left_the_cache_is_fetched_again(
    tmp_path: Path,
) -> None:
    """Scaled to zero, its package is no live replica's: the bounded cache may drop it. The
    next start (a wake from zero) must fetch it again, not start in a directory that is gone."""
    store = MemoryPackageStore()
    refs = [await _put(store, tmp_path, "X" * 3000 + str(i), f"p{i}") for i in range(2)]
    cache = PackageCache(tmp_path / "cache", lambda: store, max_bytes=4000)
    envs = RuntimeEnvs(cache, PyEnvs(tmp_path / "envs", sys.executable), wake=lambda: None)
    first = {"working_dir": refs[0]}
    assert envs.state(first) is None
    await eventually(lambda: isinstance(envs.state(first), Prepared), 10, "prepared")
    await cache.ensure(refs[1])  # over the bound: the first package goes (nothing runs it)
    assert refs[0]["sha256"] not in cache.sizes
    assert envs.state(first) is None  # prepared again, not a Prepared naming a gone directory
    await eventually(lambda: isinstance(envs.state(first), Prepared), 10, "fetched again")
    ready = envs.state(first)
    assert isinstance(ready, Prepared) and ready.cwd and _exists(ready.cwd) and store.gets == 3
    await envs.close()

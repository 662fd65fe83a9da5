"""Runtime environments: the code and packages a deployment's replicas run with.

How it works: a user writes Ray's `runtime_env` (app level in the file, per deployment in
`ray_actor_options`, in the file or in code; Anyscale service files at the top level). The two
levels merge by Ray Serve's rule (`merge`: the deployment's keys replace the app's, except
`env_vars`, which are merged name by name). `normalise` turns the merged mapping into
fleetpulse's form, with problems named by key; `env_vars` go to the deployment's `env`, the rest
to `DeploymentConfig.runtime_env`:

    working_dir: REF            one package: the replica's working directory, first on sys.path
    py_modules:  [REF, ...]     packages whose root goes on sys.path (after working_dir)
    pip:         {packages: [...], installer: "pip" | "uv", pip_version: "..."}

A REF is local while `fleetpulse deploy` checks the file (`{path, excludes}` a directory, or
`{url}` a zip over https) and a content address once deploy has packaged or fetched it
(`{sha256, size}` in the object store, `{url, sha256, size}` fetched by the agents): only
resolved forms are written to fp_apps (`resolved`). The whole mapping is part of the replicas'
version, so a changed package is a rollout and an unchanged one is not. Pure: no I/O here
(services/ops/packaging.py packages, services/agent/packages.py fetches and unpacks).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

SUPPORTED = ("working_dir", "py_modules", "excludes", "env_vars", "pip", "uv", "config")
REFUSED: Mapping[str, str] = {
    "conda": "fleetpulse builds no conda environments: use pip or uv, or run the agents in "
    "an environment that has them",
    "container": "replicas are processes of their agent, not containers: run the agent in an "
    "image with what they need",
    "image_uri": "replicas are processes of their agent, not containers: run the agent in an "
    "image with what they need",
    "java_jars": "fleetpulse runs Python replicas only",
    "nsight": "no profiler integration: run the agent under the profiler",
}
SHA256_RE = re.compile(r"[0-9a-f]{64}")
INSTALLERS = ("pip", "uv")
MAX_PACKAGES = 256
"""Requirement lines in one pip/uv spec (a sanity bound: the spec rides in fp_apps)."""


class RuntimeEnvError(ValueError):
    """A runtime_env value fleetpulse cannot use: `key` names the field, the message says why."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}" if key else message)
        self.key = key
        self.message = message


# -- merging (Ray Serve's rule) -----------------------------------------------------------------


def merge(parent: Mapping[str, Any], child: Mapping[str, Any]) -> dict[str, Any]:
    """The child's runtime_env over the parent's: each key the child sets replaces the parent's,
    except `env_vars`, merged name by name (the child's value wins). Neither is changed."""
    out = dict(parent)
    for key, value in child.items():
        if key == "env_vars" and isinstance(value, Mapping):
            base = out.get("env_vars")
            out[key] = {**(base if isinstance(base, Mapping) else {}), **value}
        else:
            out[key] = value
    return out


# -- from the user's mapping to fleetpulse's form ----------------------------------------------


def normalise(
    raw: Mapping[str, Any], *, resolve_path: Any = None, read_file: Any = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """(runtime_env, env_vars) of a user's merged runtime_env; RuntimeEnvError naming the first
    bad key. `resolve_path(str) -> str` makes a local path absolute (and checks it exists),
    `read_file(str) -> str` reads a requirements file: the caller's I/O (both default to taking
    the value as it is, for tests)."""
    resolve = resolve_path or (lambda p: p)
    out: dict[str, Any] = {}
    env: dict[str, str] = {}
    for key in raw:
        if key in REFUSED:
            raise RuntimeEnvError(key, f"not supported: {REFUSED[key]}")
        if key not in SUPPORTED:
            raise RuntimeEnvError(
                key, "not supported: a Ray runtime_env field fleetpulse does not know "
                f"(it reads {', '.join(SUPPORTED)}); remove it",
            )  # fmt: skip
    excludes = _excludes(raw.get("excludes"))
    if raw.get("env_vars") is not None:
        env = _env_vars(raw["env_vars"])
    wd = raw.get("working_dir")
    if wd is not None:
        out["working_dir"] = _local_ref("working_dir", wd, excludes, resolve)
    mods = raw.get("py_modules")
    if mods is not None:
        if not isinstance(mods, list):
            raise RuntimeEnvError("py_modules", "expected a list of directories or zip URLs")
        out["py_modules"] = [
            _local_ref(f"py_modules[{i}]", m, excludes, resolve) for i, m in enumerate(mods)
        ]
    if raw.get("pip") is not None and raw.get("uv") is not None:
        raise RuntimeEnvError("uv", "give pip or uv, not both")
    for installer in INSTALLERS:
        if raw.get(installer) is not None:
            out["pip"] = _pip(installer, raw[installer], read_file)
    config = raw.get("config")
    if config is not None and not isinstance(config, Mapping):
        raise RuntimeEnvError("config", "expected a mapping")
    return out, env


def _excludes(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise RuntimeEnvError("excludes", "expected a list of path patterns (gitignore style)")
    return list(value)


def _env_vars(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise RuntimeEnvError("env_vars", "expected a mapping of names to strings")
    for k, v in value.items():
        if not isinstance(k, str) or not k or "=" in k:
            raise RuntimeEnvError("env_vars", f"{k!r} is not an environment variable name")
        if not isinstance(v, str):
            raise RuntimeEnvError(f"env_vars.{k}", f'expected a string (quote it: "{v}")')
    return dict(value)


def _local_ref(key: str, value: Any, excludes: list[str], resolve: Any) -> dict[str, Any]:
    if not isinstance(value, str) or not value:
        raise RuntimeEnvError(key, "expected a local directory or an https URL of a zip file")
    if "://" in value:
        if not value.startswith("https://"):
            scheme = value.split("://", 1)[0]
            raise RuntimeEnvError(
                key, f"{scheme}:// is not fetched: give a local directory (deploy uploads it) "
                "or an https URL of a zip file",
            )  # fmt: skip
        if not value.split("?", 1)[0].endswith(".zip"):
            raise RuntimeEnvError(key, "a URL must name a .zip file")
        return {"url": value}
    if value.endswith(".whl"):
        raise RuntimeEnvError(key, "a wheel is a package: list it under pip instead")
    try:
        path = resolve(value)
    except (OSError, ValueError) as exc:
        raise RuntimeEnvError(key, str(exc)) from None
    ref: dict[str, Any] = {"path": path}
    if excludes:
        ref["excludes"] = list(excludes)
    return ref


def _pip(installer: str, value: Any, read_file: Any) -> dict[str, Any]:
    version = ""
    if isinstance(value, str):  # a requirements file
        if read_file is None:
            raise RuntimeEnvError(installer, "a requirements file cannot be read here")
        try:
            text = read_file(value)
        except OSError as exc:
            raise RuntimeEnvError(installer, f"cannot read {value}: {exc.strerror}") from None
        packages = requirement_lines(text)
    elif isinstance(value, list):
        packages = value
    elif isinstance(value, Mapping):
        unknown = set(value) - {"packages", "pip_version", "pip_check", "uv_version",
                                "uv_check", "uv_pip_install_options", "pip_install_options"}  # fmt: skip
        if unknown:
            raise RuntimeEnvError(f"{installer}.{sorted(unknown)[0]}", "unknown key")
        packages = value.get("packages", [])
        if isinstance(packages, str):
            packages = requirement_lines(read_file(packages)) if read_file else []
        version = value.get("pip_version") or value.get("uv_version") or ""
        if not isinstance(version, str):
            raise RuntimeEnvError(f"{installer}.pip_version", "expected a string like '==24.0'")
    else:
        raise RuntimeEnvError(installer, "expected a list of requirements, a requirements file "
                              "or {packages: [...]}")  # fmt: skip
    if not isinstance(packages, list) or not all(isinstance(p, str) and p for p in packages):
        raise RuntimeEnvError(installer, "requirements must be non-empty strings")
    if len(packages) > MAX_PACKAGES:
        raise RuntimeEnvError(installer, f"more than {MAX_PACKAGES} requirements")
    return {"packages": [_requirement(installer, p) for p in packages], "installer": installer,
            "pip_version": version}  # fmt: skip


_INDEX_OPTIONS = {"-f": "--find-links", "--find-links": "--find-links", "-i": "--index-url",
                  "--index-url": "--index-url", "--extra-index-url": "--extra-index-url"}  # fmt: skip
"""The installer options a requirement line may give (where packages come from), by the spellings
pip reads in a requirements file, which is where Ray Serve writes a `pip` list."""


def _requirement(installer: str, line: str) -> str:
    """A requirement, or an index option as one `--name=value` argument (the installer gets each
    as a single command-line argument: `-f URL` there would not parse)."""
    p = line.strip()
    if not p.startswith("-"):
        return p
    name, _, value = p.replace("=", " ", 1).partition(" ")
    if name in _INDEX_OPTIONS and value.strip():
        return f"{_INDEX_OPTIONS[name]}={value.strip()}"
    raise RuntimeEnvError(installer, f"{line!r}: installer options are not passed through")


def requirement_lines(text: str) -> list[str]:
    """The requirements of a requirements file (comments and blank lines dropped)."""
    out = []
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


# -- checks of the stored form -----------------------------------------------------------------


def refs(runtime_env: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every package reference of a runtime_env (working_dir first, then py_modules)."""
    out: list[Mapping[str, Any]] = []
    wd = runtime_env.get("working_dir")
    if isinstance(wd, Mapping):
        out.append(wd)
    mods = runtime_env.get("py_modules")
    if isinstance(mods, list):
        out += [m for m in mods if isinstance(m, Mapping)]
    return out


def resolved(runtime_env: Mapping[str, Any]) -> bool:
    """Every reference is a content address (what fp_apps may hold)."""
    return all("sha256" in r for r in refs(runtime_env))


def ref_problem(ref: Any) -> str | None:
    if not isinstance(ref, Mapping):
        return "a package reference must be a map"
    if "path" in ref:
        return None if isinstance(ref["path"], str) else "path must be a string"
    if "url" in ref and not (isinstance(ref["url"], str) and ref["url"].startswith("https://")):
        return "url must be an https URL"
    if "sha256" not in ref:
        return None if "url" in ref else "needs sha256 and size"
    if not (isinstance(ref["sha256"], str) and SHA256_RE.fullmatch(ref["sha256"])):
        return "sha256 must be 64 lowercase hex digits"
    size = ref.get("size")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        return "size must be a byte count"
    return None


def problem(value: Any) -> str | None:
    """What is wrong with a stored runtime_env (ReplicaSpec/DeploymentConfig field), or None."""
    if not isinstance(value, Mapping):
        return "must be a map"
    unknown = set(value) - {"working_dir", "py_modules", "pip"}
    if unknown:
        return f"unknown field {sorted(unknown)[0]!r}"
    if "py_modules" in value and not isinstance(value["py_modules"], list):
        return "py_modules must be a list"
    for ref in refs(value):
        why = ref_problem(ref)
        if why is not None:
            return why
    if "working_dir" in value and not isinstance(value["working_dir"], Mapping):
        return "working_dir must be a map"
    pip = value.get("pip")
    if pip is not None:
        if not isinstance(pip, Mapping) or pip.get("installer") not in INSTALLERS:
            return "pip must be a map with installer pip or uv"
        packages = pip.get("packages")
        if not isinstance(packages, list) or not all(isinstance(p, str) for p in packages):
            return "pip.packages must be a list of strings"
    return None


def pip_key(pip: Mapping[str, Any], interpreter: str) -> str:
    """The cache key of an environment built for `pip` on top of `interpreter` (its version
    string and path): the same spec on the same Python is built once per agent."""
    doc = {"pip": dict(pip), "python": interpreter}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]
